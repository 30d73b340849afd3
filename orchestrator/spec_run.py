"""The sections of a sweep spec that say what the sweep aims at, spends and records: the objective
(and its SLO), the budget, one trial's resources, the confirmation and the tracking; with the bounds
and defaults they share. ``orchestrator.spec`` composes them into ``SweepSpec`` (and re-exports them)."""

from __future__ import annotations

import difflib
from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from orchestrator.spec_benchmark import OBJECTIVE_METRICS
from orchestrator.validation import StrictModel, short_repr

__all__ = [
    "BudgetSpec",
    "ConfirmationSpec",
    "DEFAULT_ENGINE_START_S",
    "DEFAULT_TPOT_MS",
    "MAX_CONCURRENCY",
    "MAX_DURATION_S",
    "MAX_PARALLEL_TRIALS",
    "MAX_RESOURCES",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SloSpec",
    "SpecSection",
    "TrackingSpec",
]

MAX_DURATION_S = 30 * 24 * 3600.0
"""The longest time limit or timeout a spec may set (30 days)."""

MAX_CONCURRENCY = 10_000
"""The highest concurrency level an objective may name (far above SGLang's 48-request speculative cap)."""

MAX_PARALLEL_TRIALS = 1024
"""The most trials a sweep may run at once (each owns an engine and its GPUs)."""

MAX_RESOURCES = 1024
"""The most GPUs or CPUs one trial may reserve (a trial runs one engine on one node)."""

DEFAULT_ENGINE_START_S: dict[str, float] = {"reference": 10.0, "sglang": 600.0}
"""Seconds one engine start is taken to last before a trial has measured one
(``budget.engine_start_estimate_s``); measurements in docs/design/bench-and-spec.md."""

DEFAULT_TPOT_MS: dict[str, float] = {"reference": 3.0, "sglang": 25.0}
"""Milliseconds per output token of one request, for the plan's benchmark time before a trial has
measured one (``budget.tpot_estimate_ms``): the reference engine's ref-tiny on 2 CPU cores (about
600 tok/s at concurrency 1, slower at 4); for SGLang a Kimi-class MoE on one 8-GPU node, where one
decode/verify cycle is 18-30 ms (docs/design/bench-and-spec.md)."""


class SpecSection(StrictModel):
    """Every section of a spec: strict types, unknown keys refused, immutable."""


_Model = SpecSection


class SloSpec(_Model):
    """Service-level limits; a trial that breaks one is infeasible whatever its throughput."""

    ttft_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 time to first token (ms).")
    tpot_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 time per output token (ms).")
    e2e_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 end-to-end latency (ms).")

    def limits(self) -> dict[str, float]:
        """The limits set, metric name -> limit (the metric names are the benchmark's)."""
        return {name: limit for name, limit in self.model_dump().items() if limit is not None}


class ObjectiveSpec(_Model):
    """What "best" means."""

    metric: str = Field(default="output_tok_per_s", description=f"One of {', '.join(OBJECTIVE_METRICS)}.")
    mode: Literal["max", "min"] | None = Field(
        default=None, description="max or min; defaults to the metric's natural direction."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Concurrency level whose result is the objective (default: the highest).",
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="Optional latency limits.")

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if value not in OBJECTIVE_METRICS:
            close = difflib.get_close_matches(value, OBJECTIVE_METRICS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown metric {short_repr(value)}{hint}; allowed: {', '.join(OBJECTIVE_METRICS)}")
        return value

    @model_validator(mode="after")
    def _direction(self) -> "ObjectiveSpec":
        natural = OBJECTIVE_METRICS[self.metric]
        if self.mode is not None and self.mode != natural:
            raise ValueError(
                f"mode={self.mode} would make {self.metric} worse as it 'improves'; use mode: {natural} (or omit it)"
            )
        return self

    @property
    def direction(self) -> Literal["max", "min"]:
        """The resolved optimisation direction."""
        return self.mode or OBJECTIVE_METRICS[self.metric]


class BudgetSpec(_Model):
    """How much the sweep may spend."""

    num_trials: int = Field(default=20, ge=1, le=10_000, description="Trials to run in total.")
    max_concurrent_trials: int = Field(
        default=1, ge=1, le=MAX_PARALLEL_TRIALS, description="Trials running at once (each owns its GPUs)."
    )
    time_limit_s: float | None = Field(
        default=None, gt=0, le=MAX_DURATION_S, description="The whole sweep's time: the search stops starting "
        "trials in time for the confirmation's least time (min_visits rounds), which then gets what is left; no "
        "running trial is killed for it (orchestrator.sweep.execution.time_budget)."
    )
    trial_timeout_s: float = Field(
        default=3600.0, gt=0, le=MAX_DURATION_S, description="A trial running longer is stopped and failed."
    )
    engine_start_timeout_s: float = Field(
        default=1800.0, gt=0, le=MAX_DURATION_S, description="Time an engine may take to become healthy."
    )
    engine_start_estimate_s: float | None = Field(
        default=None, gt=0, le=MAX_DURATION_S,
        description="Seconds one engine start (launch to healthy) is expected to take, for the plan's cost (engine "
        "starts x start time) until a trial has measured it; default by engine.kind: "
        f"{', '.join(f'{k} {v:g}' for k, v in DEFAULT_ENGINE_START_S.items())} (orchestrator.sweep.output.cost).",
    )
    tpot_estimate_ms: float | None = Field(
        default=None, gt=0, le=60_000,
        description="Milliseconds per output token of one request, for the plan's benchmark time (requests x "
        "output_len x this, per level and repetition) until a trial has measured it; default by engine.kind: "
        f"{', '.join(f'{k} {v:g}' for k, v in DEFAULT_TPOT_MS.items())} (orchestrator.sweep.output.night_plan).",
    )
    derive_time_limits: bool = Field(
        default=True,
        description="Once a trial has ended ok, run later trials under limits derived from the measured starts and "
        "runs (start: 2x the longest warm start or +2 min; trial: start limit + 2x the longest run or +5 min), "
        "capped by engine_start_timeout_s and trial_timeout_s, so a hang costs minutes "
        "(orchestrator.sweep.execution.time_limits). false: always the two timeouts above.",
    )
    sweep_only_start_flags: bool = Field(
        default=True,
        description="Start every trial's and confirmation visit's engine with --skip-server-warmup (the harness warms "
        "up itself) and decode CUDA graphs only for the batch sizes the benchmark reaches (--cuda-graph-bs-decode, "
        "--cuda-graph-max-bs-decode; orchestrator.sweep.execution.start_flags). Recorded on each trial, never in best.yaml; "
        "flags engine.extra_args sets are kept as given. false: start sweep engines as they would be served.",
    )
    max_same_failures: int = Field(
        default=3, ge=1, le=10_000, description="Trials failed the same way (reason and message, numbers aside) "
        "after which the search stops with a diagnosis instead of spending the night's starts on it "
        "(orchestrator.sweep.execution.night_stop).")


class ResourcesSpec(_Model):
    """What one trial reserves from Ray."""

    gpus_per_trial: int | None = Field(
        default=None, ge=0, le=MAX_RESOURCES, description="GPUs per trial (default: engine.tp_size)."
    )
    cpus_per_trial: float = Field(
        default=1.0, gt=0, le=MAX_RESOURCES, description="CPUs for the trial's driver bundle."
    )


class ConfirmationSpec(_Model):
    """After the search: the search's best few, SGLang's default and no speculation re-measured on
    fresh engines in interleaved rounds (A B C D, D C B A, ...), until the search's best is decided
    better than, equivalent to or worse than SGLang's default, or ``max_visits`` rounds ran
    (``orchestrator.sweep.confirmation.confirm``). Switch it off for engines that take many minutes to load."""

    enabled: bool = Field(default=True, description="Run the confirmation round.")
    top_k: int = Field(default=3, ge=1, le=10, description="How many of the search's best trials take part "
                       "(3: under noise the true best is often not the search's first; racing drops the slow ones).")
    min_visits: int = Field(default=3, ge=1, le=100, description="Rounds before a verdict is judged (an interval "
                            "needs 3 visits of each contender).")
    max_visits: int = Field(default=16, ge=1, le=100, description="Most rounds (visits per contender, each a fresh "
                            "engine); still undecided then, the verdict is 'undecided'. At 5% noise per launch a "
                            "6% gain needs about 12-16 (benchmarks/search_efficiency.py).")
    no_speculation: bool = Field(
        default=True, description="Visit no speculation too, so the gain over it comes from interleaved fresh "
        "engines. false: one contender fewer every round (a third of the starts with top_k 1); that gain stays "
        "the search's estimate, and says so.")
    repetitions_per_visit: Union[Annotated[int, Field(ge=1, le=20)], Literal["auto"]] = Field(
        default="auto", description="Benchmark repetitions of the objective level per visit (their geometric mean "
        "is the visit's value); auto: sqrt((start time / repetition time) x (within-visit / between-visit "
        "variance)), in [1, 8], from the measured components (orchestrator/sweep/confirmation/economy.py)."
    )
    margin: Union[Annotated[float, Field(gt=0, lt=0.5)], Literal["auto"]] = Field(
        default="auto", description="Practical margin: 'better' needs the whole interval above 1 (the verdict says "
        "separately whether it also clears 1 + margin), 'worse' below 1 / (1 + margin), 'equivalent' (TOST) the "
        "whole interval within +-margin; intervals are 95% over all looks (orchestrator/sequential.py). auto: the "
        "smallest margin the engine kind's measured between-visit noise can call equivalent within max_visits "
        "(orchestrator.sweep.confirmation.margin).")
    max_host_cpu_steal: float | None = Field(
        default=0.05, ge=0, le=1, description="A visit during which the hypervisor gave more than this share of "
        "the host's CPU to other guests (/proc/stat steal) is recorded as discarded and not counted: it measured "
        "the neighbours (orchestrator/bench/host_cpu.py). null: count every visit.")
    max_minutes: float | None = Field(
        default=None, gt=0, le=MAX_DURATION_S / 60, description="Time the confirmation may take; it stops, "
        "undecided with the reason, as soon as the measured spread says deciding would take longer.")

    @model_validator(mode="after")
    def _visit_bounds(self) -> "ConfirmationSpec":
        if self.min_visits > self.max_visits:
            raise ValueError(f"min_visits ({self.min_visits}) is above max_visits ({self.max_visits}); lower "
                             "min_visits or raise max_visits")
        return self


class TrackingSpec(_Model):
    """Where results go."""

    mlflow_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default: sqlite:///<results_dir>/mlflow.db)."
    )
    experiment_name: str | None = Field(default=None, description="MLflow experiment (default: the spec's name).")
