"""``spectune sweep --dry-run``: the baselines and first proposals a sweep would run, with their
engine commands and environment (secrets redacted), without Ray or GPUs.
"""

from __future__ import annotations

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
            python: str = "python") -> list[dict[str, Any]]:
    """The baselines and the first ``first`` proposals (``driver.sweep_search``, as the sweep asks
    them), with exact engine commands and env; no Ray, no GPUs."""
    import optuna

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
    console.print(cost_line(spec), highlight=False, markup=False, soft_wrap=True)
    for line in plan_lines(night_plan(spec)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    changes = changes_to_fit(spec)
    if changes:
        console.print("to fit budget.time_limit_s, change one of (each re-planned alone):", highlight=False,
                      markup=False, soft_wrap=True)
        for line in changes:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    for line in decision_lines(spec):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return shown
