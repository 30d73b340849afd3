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

__all__ = ["dry_run", "morning_lines"]

def _print_arms(spec: SweepSpec, *, console: Console, python: str, all_nodes: bool = False) -> None:
    """The all-reduce table on the spec's node (every GPU kind's with ``all_nodes``;
    ``orchestrator.space.arms.all_reduce_section``), then each arm's engine command."""
    from orchestrator.space.arms import all_reduce_section
    from serving.engine.command import build_command

    title, *table = all_reduce_section(spec, all_nodes=all_nodes)
    console.print(f"all-reduce arms: {title}", highlight=False, markup=False, soft_wrap=True)
    for line in table:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if spec.engine.tp_size == 1:
        return
    console.print("their engine commands:", highlight=False, markup=False)
    for arm in spec.search.all_reduce:
        config = spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None, all_reduce=arm)
        console.print(f"  [bold]{arm}[/]: " + escape(build_command(config, host="127.0.0.1", port=30000,
                                                                python=python).shell(redacted=True)),
                      highlight=False, soft_wrap=True)
    console.print("")


def dry_run(spec: SweepSpec, *, first: int = 3, console: Console | None = None,
            python: str = "python", previous: Path | None = None,
            results_dir: str | None = None, all_nodes: bool = False) -> list[dict[str, Any]]:
    """The baselines and the first ``first`` proposals (``driver.sweep_search``, as the sweep asks
    them), with exact engine commands and env; no Ray, no GPUs. First the before-bed findings
    (``orchestrator.sweep.execution.before_bed``: the traffic file's fingerprint, idle GPUs, attention heads).
    The night's plan is made from ``previous`` (a results directory of this spec: ``--dry-run --resume
    DIR``) where given: its measured starts, trial time and between-visit spread replace the estimates.
    It ends with where the results will land (``previous``, else ``results_dir`` as ``--results-dir``
    gives it, else the spec's), the files the morning brings and the command that serves the answer.

    Raises:
        orchestrator.sweep.execution.before_bed.NotReadyError: a finding is an error (printed first); nothing else is shown.
    """
    import optuna

    from orchestrator.sweep.execution.before_bed import NotReadyError, before_bed, finding_lines
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
    _print_arms(spec, console=console, python=python, all_nodes=all_nodes)  # the spec's node; every kind on request
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
    for line in morning_lines(spec, results_dir=previous if previous is not None else results_dir):
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


def morning_lines(spec: SweepSpec, *, results_dir: str | Path | None = None) -> list[str]:
    """The dry run's end: where the results will land, the files the morning brings there and the
    command that serves the answer. ``results_dir`` is ``--results-dir`` or the resumed sweep's
    directory; without it the spec's ``results_dir`` (``records.results_dir.resolve_results_dir``)."""
    from orchestrator.sweep.execution.driver import resolve_tracking_uri
    from orchestrator.sweep.records.results import CONFIRMATION_FILE, TRIALS_FILE
    from orchestrator.sweep.records.results_dir import resolve_results_dir
    from serving.environ import ENV

    out = resolve_results_dir(spec.results_dir, str(results_dir) if results_dir is not None else None)
    uri, _ = resolve_tracking_uri(spec, out, given=None, resume=False)
    where = f"results will land in {out}"
    if results_dir is None and not Path(spec.results_dir).expanduser().is_absolute():
        root = Path(ENV.SPECTUNE_RESULTS_ROOT.get() or Path.home() / "spectune-results")
        where += (f" (under `ray job submit --working-dir` without --results-dir: {root / spec.results_dir}; pass "
                  "--results-dir \"$PWD/results\")")
    return [
        where,
        "the morning brings there (every file: docs/sweep.md, \"Where results land\"):",
        "  best.yaml: the configuration to serve (SGLang's default unless the confirmation found another faster)",
        "  summary.txt, summary.json: the answer in words and in figures, with 95% intervals",
        f"  {TRIALS_FILE}: one line per trial (its settings, engine command and measurements); {CONFIRMATION_FILE}: "
        "the confirmation's re-measurements",
        "  plots/: the search's history and throughput by load",
        f"  MLflow: {uri} (one run for the sweep, one nested run per trial)",
        f"serve the answer: spectune serve {out / 'best.yaml'}",
    ]
