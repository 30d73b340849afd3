"""A benchmark's result: the versioned JSON document and the readable table.

Readers refuse a ``schema_version`` they do not know. Every number has its unit in its name;
absent speculative figures are ``null``, never ``0``. A run whose server failed part-way is still
a result (``status`` ``failed``, ``failure`` says where and why), carried by
:class:`BenchmarkAborted`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, computed_field, model_validator
from rich.markup import escape
from rich.table import Table

from orchestrator.bench.files import write_atomic
from orchestrator.bench.metrics import METRICS, Distribution, RepetitionMetrics
from orchestrator.bench.noise import DriftCheck, ci_rel, detect_drift
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError

__all__ = [
    "BENCH_SCHEMA_VERSION",
    "READABLE_SCHEMA_VERSIONS",
    "BenchFailure",
    "BenchResult",
    "BenchmarkAborted",
    "DatasetInfo",
    "LevelResult",
    "LevelWarmup",
    "WarmupInfo",
    "read_json",
    "summary_table",
    "summarise_level",
    "write_json",
]

BENCH_SCHEMA_VERSION = "spectune.bench/3"
"""The schema :func:`write_json` writes."""

READABLE_SCHEMA_VERSIONS = ("spectune.bench/1", "spectune.bench/2", BENCH_SCHEMA_VERSION)
"""The schemas :func:`read_json` reads: /1 lacks ``status`` and ``failure`` (it was always a completed
run); /1 and /2 lack the per-level warm-up, target and drift fields."""


class WarmupInfo(BaseModel):
    """The discarded warm-up requests (counted, so warm-up failures are visible too)."""

    num_requests: int = Field(description="Warm-up requests sent.")
    num_errors: int = Field(description="Warm-up requests that failed.")
    errors_by_kind: dict[str, int] = Field(description="Failed warm-up requests by kind.")
    duration_s: float | None = Field(
        default=None, description="Wall time of the warm-up (None in results written before spectune.bench/3)."
    )


class LevelWarmup(WarmupInfo):
    """One level's warm-up: ``warmup_requests`` at its concurrency, then stability windows."""

    window_requests: int | None = Field(
        default=None, description="Requests per stability window (None: no windows, a fixed warm-up)."
    )
    window_tok_per_s: list[float | None] = Field(
        default_factory=list, description="Output tok/s of each stability window, in order (None: all failed)."
    )
    converged: bool | None = Field(
        default=None,
        description="True: two consecutive windows agreed within the tolerance; False: max_windows ran without; "
        "None: no stability check (no warm-up, or tolerance null).",
    )


class LevelResult(BaseModel):
    """All repetitions at one concurrency level, their summary and the flags the sweep reads.

    The warm-up, target and drift fields are None in results read from older schema versions.
    """

    concurrency: int = Field(description="Concurrency level (in-flight cap in open loop).")
    request_rate: float | None = Field(description="Open-loop arrival rate; None = closed loop.")
    repetitions: list[RepetitionMetrics] = Field(description="One entry per repetition, in order.")
    summary: dict[str, Distribution] = Field(
        description="Per metric of RepetitionMetrics.flat(): its distribution across repetitions."
    )
    num_errors: int = Field(description="Failed requests over all repetitions.")
    accept_length_mismatch: bool = Field(
        description="Some repetition's server and per-request accept lengths disagreed beyond tolerance."
    )
    accept_length_not_checkable: bool = Field(
        default=False,
        description="Some repetition's server accept length (a lifetime mean) could not be checked against the "
        "per-request one: reported as such, never as agreeing.",
    )
    noisy: bool = Field(description="Some noise metric's CV across repetitions exceeded the threshold.")
    noisy_metrics: list[str] = Field(description="Which metrics were too noisy, with their CV.")
    warmup: LevelWarmup | None = Field(default=None, description="This level's warm-up.")
    target_metric: str | None = Field(
        default=None, description="The metric whose interval decided the repetitions, and whose drift was tested."
    )
    target_ci_rel: float | None = Field(
        default=None,
        description="The target for ci_rel: the 95% interval within a factor 1 + target_ci_rel of the geometric mean "
        "(None: fixed repetitions).",
    )
    ci_rel: float | None = Field(
        default=None,
        description="Achieved: exp(t(0.975, n-1) * stdev(log x) / sqrt(n)) - 1 of target_metric over the repetitions, "
        "i.e. sqrt(ci95_high / ci95_low) - 1 of its summary's log-scale interval (noise.ci_rel; None from fewer "
        "than 3 values or when one is not positive).",
    )
    target_met: bool | None = Field(
        default=None, description="ci_rel <= target_ci_rel (None: no target, fixed repetitions)."
    )
    drift: DriftCheck | None = Field(
        default=None, description="Mann-Kendall trend test of target_metric over the repetitions, in order."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def repetitions_used(self) -> int:
        """Repetitions measured at this level (written to JSON for readers; read back, it is ignored)."""
        return len(self.repetitions)

    @property
    def drifts(self) -> bool:
        """Whether the level's repetitions show a significant monotone trend."""
        return self.drift is not None and self.drift.drifts

    def value(self, metric: str) -> float | None:
        """The level's figure for ``metric``: the median across repetitions of its per-repetition
        value (``metrics.METRICS[metric].read``); None where no repetition had one.

        Raises:
            KeyError: ``metric`` is not a name of ``metrics.METRICS`` (a typo is not an absent value).
        """
        if metric not in METRICS:
            raise KeyError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        dist = self.summary.get(metric)
        return None if dist is None else dist.median


def summarise_level(
    *,
    concurrency: int,
    request_rate: float | None,
    repetitions: list[RepetitionMetrics],
    noise_metrics: list[str],
    noisy_cv_threshold: float,
    target_metric: str = "output_tok_per_s",
    target_ci_rel: float | None = None,
    warmup: LevelWarmup | None = None,
) -> LevelResult:
    """Summarise the repetitions of one level: a Distribution per metric, the flags, the target, drift.

    ``noisy``: the CV across repetitions of any ``noise_metrics`` entry above
    ``noisy_cv_threshold`` (never for one repetition). ``ci_rel`` / ``target_met`` and ``drift``
    are :mod:`orchestrator.bench.noise`'s, of ``target_metric``.
    """
    flats = [rep.flat() for rep in repetitions]
    summary = {
        name: Distribution.of(v for flat in flats if (v := flat[name]) is not None and math.isfinite(v))
        for name in (METRICS if repetitions else ())
    }
    noisy = []
    for name in noise_metrics:
        cv = summary[name].cv if name in summary else None
        if cv is not None and cv > noisy_cv_threshold:
            noisy.append(f"{name} (cv={cv:.3f})")
    targets = [flat[target_metric] for flat in flats]
    width = ci_rel(targets)
    return LevelResult(
        concurrency=concurrency,
        request_rate=request_rate,
        repetitions=repetitions,
        summary=summary,
        num_errors=sum(rep.num_errors for rep in repetitions),
        accept_length_mismatch=any(rep.accept_length_mismatch for rep in repetitions),
        accept_length_not_checkable=any(rep.accept_length_check == "not_checkable" for rep in repetitions),
        noisy=bool(noisy),
        noisy_metrics=noisy,
        warmup=warmup,
        target_metric=target_metric,
        target_ci_rel=target_ci_rel,
        ci_rel=width,
        target_met=None if target_ci_rel is None else width is not None and width <= target_ci_rel,
        drift=detect_drift(targets, metric=target_metric),
    )


class DatasetInfo(BaseModel):
    """Which prompts were sent."""

    name: str = Field(description="builtin, sharegpt or random.")
    path: str | None = Field(default=None, description="The ShareGPT file, if any.")
    num_prompts: int = Field(description="Prompts per repetition.")
    distinct_prompts: int = Field(description="Distinct prompts among them.")
    mean_prompt_chars: float = Field(description="Mean prompt length in characters.")


class BenchFailure(BaseModel):
    """Why and where a run stopped before its end (``BenchResult.status`` ``failed``)."""

    phase: Literal["warmup", "measure"] = Field(
        description="warmup: while warming up a level (concurrency says which); measure: during a repetition."
    )
    concurrency: int | None = Field(
        description="The level that was running (None only in spectune.bench/1 and /2 results, whose warm-up "
        "ran once before every level)."
    )
    repetition: int | None = Field(description="The repetition that was running, from 0 (None in warm-up).")
    reason: str = Field(description="What went wrong, in words (the BenchmarkError's message).")
    repetition_metrics: RepetitionMetrics | None = Field(
        default=None,
        description="The failed repetition as far as it got (its errors by kind say how); never part of levels.",
    )


class BenchResult(BaseModel):
    """One benchmark run against one server: what ``run_benchmark`` returns and ``bench --json-out`` writes.

    A run that failed part-way (``status`` ``failed``) holds only the repetitions that finished;
    ``failure`` says where it stopped and why.
    """

    schema_version: Literal["spectune.bench/3"] = Field(default=BENCH_SCHEMA_VERSION, description="JSON schema name.")
    status: Literal["ok", "failed"] = Field(
        default="ok", description="ok: every level and repetition ran; failed: the run stopped early (see failure)."
    )
    failure: BenchFailure | None = Field(default=None, description="Where and why the run stopped (status failed).")
    created_at: str = Field(description="UTC time the run finished (ISO 8601).")
    base_url: str = Field(description="The server measured.")
    api: Literal["generate", "completions", "chat"] = Field(description="The API spoken.")
    model: str | None = Field(description="OpenAI model field sent, if any.")
    server: dict[str, Any] = Field(description="Selected /server_info fields (model, speculative settings).")
    flush_cache_supported: bool = Field(description="Whether /flush_cache worked (it resets the prefix cache).")
    server_accept_length_scope: Literal["repetition", "lifetime"] | None = Field(
        default=None,
        description="What /server_info's avg_spec_accept_length covered: each repetition (counters reset by "
        "/flush_cache: SGLang 0.5.23, the reference engine), the server's lifetime (a server whose counters survive "
        "a flush, as some older SGLang versions', or any server whose flush was never seen to clear them; also "
        "when only some repetitions were), or None (not reported).",
    )
    settings: BenchSettings = Field(description="The settings used.")
    dataset: DatasetInfo = Field(description="The prompts sent.")
    warmup: WarmupInfo = Field(description="The warm-up requests, over every level (each level's are in levels).")
    levels: list[LevelResult] = Field(description="One entry per concurrency level, ascending.")
    num_requests: int = Field(description="Measured requests over all levels and repetitions.")
    num_errors: int = Field(description="Failed measured requests.")
    accept_length_mismatch: bool = Field(description="Any level flagged accept_length_mismatch.")
    accept_length_not_checkable: bool = Field(
        default=False, description="Any level flagged accept_length_not_checkable."
    )
    noisy: bool = Field(description="Any level flagged noisy.")
    drift: bool = Field(default=False, description="Any level whose repetitions drift (LevelResult.drift).")
    target_met: bool | None = Field(
        default=None,
        description="Every level met its interval target (None: fixed repetitions, or a result older than /3).",
    )

    @model_validator(mode="after")
    def _status_matches_failure(self) -> "BenchResult":
        if (self.status == "failed") != (self.failure is not None):
            raise ValueError(
                f"status={self.status!r} with failure={'set' if self.failure else 'None'}: a failed run states its "
                "failure, a completed one has none"
            )
        return self

    @property
    def num_repetitions(self) -> int:
        """Repetitions measured to the end, over all levels."""
        return sum(len(level.repetitions) for level in self.levels)

    def level(self, concurrency: int | None = None) -> LevelResult:
        """The level at ``concurrency`` (default: the highest measured).

        Raises:
            KeyError: that level was not measured (a failed run may have measured none).
        """
        if not self.levels:
            raise KeyError(f"no concurrency level was measured ({self.failure.reason if self.failure else 'no levels'})")
        if concurrency is None:
            return self.levels[-1]
        for level in self.levels:
            if level.concurrency == concurrency:
                return level
        raise KeyError(f"concurrency {concurrency} was not measured; measured: {[l.concurrency for l in self.levels]}")

    def metric(self, name: str, *, concurrency: int | None = None) -> float | None:
        """Median across repetitions of ``name`` at ``concurrency`` (default: the highest): the
        number a sweep objective such as ``output_tok_per_s`` or ``ttft_ms_p99`` refers to."""
        return self.level(concurrency).value(name)

    def flat(self) -> dict[str, float]:
        """``c{concurrency}.{metric}`` -> the level's figure (``LevelResult.value``) for every name of
        ``metrics.METRICS``, present values only (MLflow-ready)."""
        out: dict[str, float] = {}
        for level in self.levels:
            for name in METRICS:
                value = level.value(name)
                if value is not None:
                    out[f"c{level.concurrency}.{name}"] = value
        return out


class BenchmarkAborted(BenchmarkError):
    """The server failed part-way through a run; ``partial`` is what was measured up to then
    (status ``failed``). The message is the failure's reason.

    Raises:
        ValueError: ``partial`` has no ``failure``.
    """

    def __init__(self, partial: BenchResult) -> None:
        if partial.failure is None:
            raise ValueError("BenchmarkAborted needs a failed result (partial.failure is None)")
        super().__init__(partial.failure.reason)
        self.partial = partial

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from the result, not from the message: Ray pickles what a trial raises.
        return (type(self), (self.partial,))


def write_json(result: BenchResult, path: str | Path) -> Path:
    """Write ``result`` as indented JSON, atomically; returns the path.

    Raises:
        OSError: the file cannot be written (``path`` is then unchanged).
    """
    return write_atomic(path, result.model_dump_json(indent=2) + "\n")


def read_json(path: str | Path) -> BenchResult:
    """Read a result written by :func:`write_json` (any of :data:`READABLE_SCHEMA_VERSIONS`),
    refusing other schema versions. Older documents are returned as ``/3`` results: a ``/1`` one
    with status ``ok``, a ``/1`` or ``/2`` one with the fields ``/3`` added left None.

    Raises:
        BenchmarkError: the file cannot be read, is not JSON, has another schema version, or does not validate.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchmarkError(f"{path}: cannot be read as a benchmark result: {exc}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in READABLE_SCHEMA_VERSIONS:
        raise BenchmarkError(f"{path}: schema_version {version!r} is not one of {', '.join(READABLE_SCHEMA_VERSIONS)}")
    try:
        return BenchResult.model_validate({**data, "schema_version": BENCH_SCHEMA_VERSION})
    except ValidationError as exc:
        raise BenchmarkError(f"{path}: not a valid {version} result: {exc}") from None


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cv(dist: Distribution | None) -> str:
    return "-" if dist is None or dist.cv is None else f"{dist.cv * 100:.1f}%"


def _warmup_cell(warmup: LevelWarmup | None) -> str:
    """``12 req 8.1s stable`` / ``not stable`` / ``fixed``; ``-`` where nothing was warmed (or recorded)."""
    if warmup is None or not warmup.num_requests:
        return "-"
    state = {True: "stable", False: "NOT stable", None: "fixed"}[warmup.converged]
    seconds = "" if warmup.duration_s is None else f" {warmup.duration_s:.1f}s"
    return f"{warmup.num_requests} req{seconds} {state}"


def _interval_cell(level: LevelResult) -> str:
    """``±1.8% met`` / ``±3.1% NOT met`` / ``±1.8%`` (fixed repetitions): ci_rel; ``- NOT met``
    where no interval exists but a target was set."""
    if level.ci_rel is None:
        return "- NOT met" if level.target_met is False else "-"
    verdict = {True: " met", False: " NOT met", None: ""}[level.target_met]
    return f"±{level.ci_rel * 100:.1f}%{verdict}"


def _drift_cell(drift: DriftCheck | None) -> str:
    """``up (p=0.017)`` / ``none (p=0.62)`` / ``untested`` (fewer than five repetitions)."""
    if drift is None:
        return "-"
    if drift.p_value is None:
        return "untested"
    return f"{drift.direction or 'none'} (p={drift.p_value:.2g})"


def _level_flags(level: LevelResult) -> str:
    names = []
    if level.accept_length_mismatch:
        names.append("accept_length_mismatch")
    elif level.accept_length_not_checkable:
        names.append("accept_length_not_checkable")
    if level.noisy:
        names.append("noisy")
    if level.drifts:
        names.append("drift")
    if level.target_met is False:
        names.append("target_not_met")
    if level.warmup is not None and level.warmup.converged is False:
        names.append("warmup_not_converged")
    return ", ".join(names) or "-"


def summary_table(result: BenchResult) -> Table:
    """Metrics down, concurrency levels across: medians across repetitions (and the CV of
    throughput), "absent" where the server does not report a figure, then how each level was
    measured (warm-up, repetitions against the interval target, drift), errors and flags."""
    fewest, most = result.settings.repetition_bounds()
    reps = f"{most} rep" if fewest == most else f"{fewest}-{most} rep"
    table = Table(
        title=escape(f"spectune bench {result.base_url} ({result.api}, {result.dataset.name}, {reps})"),
        header_style="bold",
    )
    table.add_column("metric")
    for level in result.levels:
        table.add_column(f"c={level.concurrency}", justify="right")

    def row(label: str, name: str, digits: int = 1) -> None:
        table.add_row(label, *(_num(level.value(name), digits) if level.value(name) is not None else "absent"
                               for level in result.levels))

    row("output tok/s", "output_tok_per_s")
    table.add_row("  cv across reps", *(_cv(level.summary.get("output_tok_per_s")) for level in result.levels))
    row("requests/s", "request_per_s", 2)
    for label, name in (("TTFT ms", "ttft_ms"), ("TPOT ms", "tpot_ms"), ("e2e ms", "e2e_ms")):
        row(f"{label} p50", f"{name}_p50", 2 if name == "tpot_ms" else 1)
        row(f"{label} p99", f"{name}_p99", 2 if name == "tpot_ms" else 1)
    if result.settings.request_rate is not None:
        row("  queue delay ms p50", "queue_delay_ms_p50")
        row("  queue delay ms p99", "queue_delay_ms_p99")
    row("tokens/chunk", "tokens_per_chunk", 2)
    row("accept_length (req)", "accept_length_requests", 3)
    row("accept_length (server)", "accept_length_server", 3)
    if any(level.value("accept_length_server_lifetime") is not None for level in result.levels):
        row("  server, lifetime mean", "accept_length_server_lifetime", 3)
    row("accepted drafts/cycle", "accepted_drafts_per_cycle", 3)
    row("cycle ms", "cycle_ms", 2)
    table.add_row("warm-up", *(_warmup_cell(level.warmup) for level in result.levels))
    table.add_row("repetitions", *(str(level.repetitions_used) for level in result.levels))
    target = result.levels[0].target_metric if result.levels else None
    table.add_row(escape(f"95% interval, {target or 'target'}"), *(_interval_cell(level) for level in result.levels))
    table.add_row("drift", *(_drift_cell(level.drift) for level in result.levels))
    table.add_row("errors", *(str(level.num_errors) for level in result.levels))
    table.add_row("flags", *(_level_flags(level) for level in result.levels))
    return table
