"""``spectune sweep --dry-run``: the baselines and first proposals a sweep would run, with their
engine commands and environment (secrets redacted), without Ray or GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.display import job_console
from orchestrator.sweep.execution.driver import sweep_search
from orchestrator.space import TrialPlan

__all__ = ["dry_run"]

NODE_KINDS_SHOWN = ("sm120-pcie", "sm90-nvlink")
"""The node kinds the dry run always states the all-reduce rule for (a PCIe and an NVLink node),
besides the spec's own ``engine.gpu_kind``."""


def _print_arms(spec: SweepSpec, *, console: Console, python: str) -> None:
    """Per all-reduce arm: the engine command and which kernel carries decode's all-reduce on each
    node kind (``orchestrator.space.arms``)."""
    from serving.engine.command import build_command

    if spec.engine.tp_size == 1:
        console.print("all-reduce: tp_size 1, no tensor-parallel all-reduce", highlight=False)
        return
    kinds = list(dict.fromkeys([*([spec.engine.gpu_kind] if spec.engine.gpu_kind != "auto" else []), *NODE_KINDS_SHOWN]))
    plans = {kind: spec.arms_on_node(gpu_kind=kind) for kind in kinds}
    node = "the node (engine.gpu_kind: auto, read by the preflight)" if spec.engine.gpu_kind == "auto" else \
        spec.engine.gpu_kind
    console.print(f"all-reduce arms (SGLang 0.5.23's rule; this sweep runs on {escape(node)}; each trial records the "
                  "kernel its engine really ran):", highlight=False, soft_wrap=True)
    for arm in spec.search.all_reduce:
        config = spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None, all_reduce=arm)
        console.print(f"  [bold]{arm}[/]: " + escape(build_command(config, host="127.0.0.1", port=30000,
                                                                python=python).shell(redacted=True)),
                      highlight=False, soft_wrap=True)
        for kind, plan in plans.items():
            line = next(text for text in plan.lines() if text.startswith(f"{arm}: "))
            console.print(f"    on {kind}: {escape(line[len(arm) + 2:])}", highlight=False, soft_wrap=True)
    console.print("")


def dry_run(spec: SweepSpec, *, first: int = 3, console: Console | None = None,
            python: str = "python", previous: Path | None = None) -> list[dict[str, Any]]:
    """The baselines and the first ``first`` proposals (``driver.sweep_search``, as the sweep asks
    them), with exact engine commands and env; no Ray, no GPUs. First the before-bed findings
    (``orchestrator.before_bed``: the traffic file's fingerprint, idle GPUs, attention heads).
    The night's plan is made from ``previous`` (a results directory of this spec: ``--dry-run --resume
    DIR``) where given: its measured starts, trial time and between-visit spread replace the estimates.

    Raises:
        orchestrator.before_bed.NotReadyError: a finding is an error (printed first); nothing else is shown.
    """
    import optuna

    from orchestrator.before_bed import NotReadyError, before_bed, finding_lines
    from orchestrator.sweep.output.cost import cost_line
    from orchestrator.sweep.output.night_plan import changes_to_fit, decision_lines, night_plan, plan_lines
    from orchestrator.sweep.execution.start_flags import sweep_start_flags, with_start_flags
    from orchestrator.sweep.execution.trial import engine_config_for
    from serving.engine.command import build_command
    from serving.redaction import redacted_env

    console = console or job_console()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space, searcher = sweep_search(spec, slo=False)
    plans: list[TrialPlan] = []
    for index in range(len(space.baselines()) + first):
        config = searcher.suggest(f"dry-{index}")
        if not isinstance(config, dict):
            break
        plans.append(TrialPlan.from_config(config))
    dims = ", ".join(f"{name} {values}" for name, values in space.nccl.items()) or "none"
    if space.presets:  # search.nccl_presets: whole sets, not per-variable dimensions
        names = sorted({name for preset in space.presets.values() for name in preset})
        dims = (f"{len(space.presets)} presets (search.nccl_presets: {'; '.join(space.presets)}) over "
                f"{', '.join(names) or 'none'}")
    console.print(f"sweep {escape(spec.name)}: {spec.budget.num_trials} trials over {len(spec.space())} "
                  f"configurations; NCCL variables searched: {escape(dims)}; fixed env: "
                  f"{escape(', '.join(sorted(spec.engine.env)) or 'none')}", highlight=False, soft_wrap=True)
    findings = before_bed(spec)  # the traffic file, GPUs and heads; an error ends the dry run here
    for line in finding_lines(findings):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if any(f.level == "error" for f in findings):
        raise NotReadyError(findings, source=spec.name)
    _print_arms(spec, console=console, python=python)
    shown = []
    for number, plan in enumerate(plans, start=1):
        config = engine_config_for(spec, plan)
        config = with_start_flags(config, sweep_start_flags(spec, config))  # as the trial starts it
        commands = [build_command(config, host="127.0.0.1", port=30000, python=python, node_rank=rank)
                    for rank in range(config.nnodes)]  # an engine across nodes: one command per node rank
        kind = {"baseline_plain": "baseline: no speculation", "baseline_auto": "baseline: SGLang's own choice"}.get(
            plan.kind, "proposed")
        console.print(f"[bold]trial {number}[/] ({escape(kind)}): {escape(plan.label())}", highlight=False, soft_wrap=True)
        for rank, command in enumerate(commands):
            if len(commands) > 1:
                console.print(f"  node rank {rank}:", highlight=False, markup=False)
            console.print(command.shell(redacted=True), highlight=False, markup=False, soft_wrap=True)
        console.print("")
        shown.append({"number": number, "kind": plan.kind, "label": plan.label(), "argv": commands[0].argv,
                      "env": redacted_env(commands[0].env),
                      **({"node_ranks": [{"node_rank": rank, "argv": c.argv} for rank, c in enumerate(commands)]}
                         if len(commands) > 1 else {})})
    records, visit_spread = previous_measurements(previous)  # a results dir's trials and visits: what it measured
    if previous is not None:
        console.print(f"planned from {escape(str(previous))}: {len(records)} trial record(s)"
                      + (f", its between-visit spread {visit_spread.value:.1%}" if visit_spread else ""),
                      highlight=False, soft_wrap=True)
    plan = night_plan(spec, records)
    console.print(cost_line(spec, records, fits=plan.fits), highlight=False, markup=False, soft_wrap=True)
    for line in plan_lines(plan):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    changes = changes_to_fit(spec, records)
    if changes:
        console.print("to fit budget.time_limit_s (each change re-planned; only changes that fit):", highlight=False,
                      markup=False, soft_wrap=True)
        for line in changes:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    for line in decision_lines(spec, measured=visit_spread):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return shown


def previous_measurements(results_dir: Path | None) -> tuple[list, Any]:
    """A results directory's trial records and its confirmation's between-visit spread (a ``margin.Figure``,
    measured, or None): what a re-run or ``--resume`` plans from. Nothing without a directory."""
    if results_dir is None:
        return [], None
    from orchestrator.sweep.confirmation.extension import read_confirmation_lines
    from orchestrator.sweep.confirmation.margin import Figure
    from orchestrator.sweep.output.summary_report import node_measurements
    from orchestrator.sweep.records.results import TRIALS_FILE, read_records

    path = Path(results_dir) / TRIALS_FILE
    records = read_records(path) if path.exists() else []
    measured = node_measurements(records, read_confirmation_lines(Path(results_dir)))
    spread = measured.get("between_visit_cv")
    figure = Figure(spread["value"], "measured", f"this spec's sweep in {results_dir} ({measured['where']}, "
                    f"{spread['df']} df)") if spread else None
    return records, figure
