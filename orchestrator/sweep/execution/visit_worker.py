"""One confirmation visit, in the Ray worker that runs it: a fresh engine, its env audit, the
objective's level measured, teardown. Unlike a trial: no record, no MLflow run, no probe.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.bench.runner import run_benchmark
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError
from orchestrator.sweep.execution.session import EngineSession, TrialFailure, step_failure
from orchestrator.sweep.execution.start_flags import sweep_start_flags, with_start_flags
from orchestrator.sweep.execution.trial import TrialContext
from serving.engine.start_phases import start_phases
from serving.engine.config import EngineConfig

__all__ = ["run_visit"]

logger = logging.getLogger(__name__)


def run_visit(*, engine_config: dict[str, Any], ctx: TrialContext, visit_id: str, repetitions: int,
              start_timeout_s: float | None = None) -> dict[str, Any]:
    """One visit: a fresh engine of ``engine_config``, its env audit, the objective's level measured
    ``repetitions`` times, teardown; runs as a Ray task in a placement group shaped like a trial's.
    ``start_timeout_s``: its engine's start limit (default ``budget.engine_start_timeout_s``).

    Returns:
        ``{"values": [...], "status": "ok"|"failed", "reason", "message", "timings": {"engine_start",
        "start_weights", "start_cuda_graphs", "start_other" (``serving.engine.start_phases``, where the log
        has them), "bench", "warmup", "teardown"}, "host_cpu_steal", "engine_nodes"}``: timings in seconds,
        ``bench`` including ``warmup``; ``host_cpu_steal`` the most of the repetitions', None off
        Linux; ``engine_nodes`` each node the engine ran on, as a trial records it.
    """
    spec = ctx.spec
    config = EngineConfig.model_validate(engine_config)
    values: list[float] = []
    steals: list[float] = []
    status, reason, message = "ok", None, ""
    timings: dict[str, float] = {}
    session = EngineSession(  # started as a trial is, with the sweep-only flags
        with_start_flags(config, sweep_start_flags(spec, config)), session_id=visit_id, label="trial 0",
        sweep_name=ctx.sweep_name, placement=spec.trial_placement,
        start_timeout_s=spec.budget.engine_start_timeout_s if start_timeout_s is None else start_timeout_s,
        timings=timings,
    )
    try:
        with session:
            phases = start_phases(session.log_text(), total_s=timings.get("engine_start"))
            timings.update({f"start_{name}": seconds for name, seconds in phases.items()})
            session.check_audit()
            level = spec.objective_concurrency
            settings = BenchSettings.for_sweep(spec.benchmark, objective_metric=spec.objective.metric, levels=[level])
            overrides: dict[str, Any] = {"repetitions": repetitions}
            if "min_repetitions" in type(settings).model_fields:
                overrides["min_repetitions"] = repetitions
            settings = settings.model_copy(update=overrides)
            tic = time.monotonic()
            try:
                result = run_benchmark(base_url=session.url, settings=settings)
            except BenchmarkError as exc:
                raise step_failure(session, "bench_failed", exc) from None
            finally:
                timings["bench"] = time.monotonic() - tic
            measured = result.level(level)
            if measured.warmup is not None and measured.warmup.duration_s is not None:
                timings["warmup"] = measured.warmup.duration_s
            for repetition in measured.repetitions:
                value = repetition.flat().get(spec.objective.metric)
                if isinstance(value, (int, float)):
                    values.append(float(value))
                if repetition.host_cpu_steal is not None:
                    steals.append(repetition.host_cpu_steal)
    except TrialFailure as failure:
        status, reason, message = "failed", failure.reason, failure.message
    finally:
        if session.stop_error is not None:  # the visit's figures stand; a leftover is logged
            logger.warning("confirmation visit %s: engine teardown failed", visit_id, exc_info=session.stop_error)
    return {"values": values, "status": status, "reason": reason, "message": message,
            "timings": {k: round(v, 3) for k, v in timings.items()},
            "host_cpu_steal": round(max(steals), 4) if steals else None, "engine_nodes": session.nodes}

