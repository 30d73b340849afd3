"""``spectune sweep --dry-run``: what a sweep would run first, without Ray or GPUs.

The baselines and the first few proposals, each with the exact engine command and environment
(secrets redacted). The searcher is the driver's own (``driver.sweep_search``, seeded), asked in the
same order, so these are the points the sweep would start with.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from orchestrator.spec import SweepSpec
from orchestrator.sweep.display import job_console
from orchestrator.sweep.driver import sweep_search
from orchestrator.space import TrialPlan

__all__ = ["dry_run"]


def dry_run(spec: SweepSpec, *, first: int = 3, console: Console | None = None,
            python: str = "python") -> list[dict[str, Any]]:
    """The baselines and the first ``first`` proposals, with exact engine commands and env; no Ray, no GPUs.

    The proposals come from the same space and sampler (seeded) a live sweep uses, asked in the
    same order, so they are the points the sweep would start with.
    """
    import optuna

    from orchestrator.sweep.cost import cost_line
    from orchestrator.sweep.start_flags import sweep_start_flags, with_start_flags
    from orchestrator.sweep.trial import engine_config_for
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
    console.print(f"sweep {escape(spec.name)}: {spec.budget.num_trials} trials over {len(spec.space())} "
                  f"configurations; NCCL variables searched: {escape(dims)}; fixed env: "
                  f"{escape(', '.join(sorted(spec.engine.env)) or 'none')}", highlight=False, soft_wrap=True)
    shown = []
    for number, plan in enumerate(plans, start=1):
        config = engine_config_for(spec, plan)
        config = with_start_flags(config, sweep_start_flags(spec, config))  # as the trial starts it
        command = build_command(config, host="127.0.0.1", port=30000, python=python)
        kind = {"baseline_plain": "baseline: no speculation", "baseline_auto": "baseline: SGLang's own choice"}.get(
            plan.kind, "proposed")
        console.print(f"[bold]trial {number}[/] ({escape(kind)}): {escape(plan.label())}", highlight=False, soft_wrap=True)
        console.print(command.shell(redacted=True), highlight=False, markup=False, soft_wrap=True)
        console.print("")
        shown.append({"number": number, "kind": plan.kind, "label": plan.label(), "argv": command.argv,
                      "env": redacted_env(command.env)})
    console.print(cost_line(spec), highlight=False, markup=False, soft_wrap=True)  # engine starts x start time
    return shown
