"""A benchmark's result: the versioned JSON document and the readable table.

The JSON schema is named by ``schema_version``; readers refuse a version they do not know rather
than misreading it. Every number has its unit in its name, and absent speculative figures are
``null``, never ``0``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from rich.markup import escape
from rich.table import Table

from orchestrator.bench.metrics import Distribution, RepetitionMetrics
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError

__all__ = [
    "BENCH_SCHEMA_VERSION",
    "BenchResult",
    "DatasetInfo",
    "LevelResult",
    "WarmupInfo",
    "read_json",
    "summary_table",
    "summarise_level",
    "write_json",
]

BENCH_SCHEMA_VERSION = "spectune.bench/1"


class LevelResult(BaseModel):
    """All repetitions at one concurrency level, their summary and the flags the sweep reads."""

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

    def value(self, metric: str) -> float | None:
        """The median across repetitions of ``metric`` (a key of ``RepetitionMetrics.flat()``)."""
        dist = self.summary.get(metric)
        return None if dist is None else dist.median


def summarise_level(
    *,
    concurrency: int,
    request_rate: float | None,
    repetitions: list[RepetitionMetrics],
    noise_metrics: list[str],
    noisy_cv_threshold: float,
) -> LevelResult:
    """Summarise the repetitions of one level: a Distribution per metric and the two flags.

    ``noisy``: CV (stdev / mean across repetitions) of any ``noise_metrics`` entry above
    ``noisy_cv_threshold``; one repetition cannot be judged, so it is never noisy.
    ``accept_length_mismatch``: any repetition flagged (see ``metrics.accept_length_agrees``);
    ``accept_length_not_checkable``: any repetition whose cross-check could not be made.
    """
    names: list[str] = list(repetitions[0].flat()) if repetitions else []
    summary = {
        name: Distribution.of(v for rep in repetitions if (v := rep.flat()[name]) is not None and math.isfinite(v))
        for name in names
    }
    noisy = []
    for name in noise_metrics:
        cv = summary[name].cv if name in summary else None
        if cv is not None and cv > noisy_cv_threshold:
            noisy.append(f"{name} (cv={cv:.3f})")
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
    )


class DatasetInfo(BaseModel):
    """Which prompts were sent."""

    name: str = Field(description="builtin, sharegpt or random.")
    path: str | None = Field(default=None, description="The ShareGPT file, if any.")
    num_prompts: int = Field(description="Prompts per repetition.")
    distinct_prompts: int = Field(description="Distinct prompts among them.")
    mean_prompt_chars: float = Field(description="Mean prompt length in characters.")


class WarmupInfo(BaseModel):
    """The discarded warm-up requests (counted, so warm-up failures are visible too)."""

    num_requests: int
    num_errors: int
    errors_by_kind: dict[str, int]


class BenchResult(BaseModel):
    """One benchmark run against one server: what ``run_benchmark`` returns and ``bench --json-out`` writes."""

    schema_version: Literal["spectune.bench/1"] = Field(default=BENCH_SCHEMA_VERSION, description="JSON schema name.")
    created_at: str = Field(description="UTC time the run finished (ISO 8601).")
    base_url: str = Field(description="The server measured.")
    api: Literal["generate", "completions", "chat"] = Field(description="The API spoken.")
    model: str | None = Field(description="OpenAI model field sent, if any.")
    server: dict[str, Any] = Field(description="Selected /server_info fields (model, speculative settings).")
    flush_cache_supported: bool = Field(description="Whether /flush_cache worked (it resets the prefix cache).")
    server_accept_length_scope: Literal["repetition", "lifetime"] | None = Field(
        default=None,
        description="What /server_info's avg_spec_accept_length covered: each repetition (counters reset by "
        "/flush_cache, the reference engine), the server's lifetime (SGLang, or any server whose flush was never "
        "seen to clear them; also when only some repetitions were), or None (not reported).",
    )
    settings: BenchSettings = Field(description="The settings used.")
    dataset: DatasetInfo = Field(description="The prompts sent.")
    warmup: WarmupInfo = Field(description="The warm-up requests.")
    levels: list[LevelResult] = Field(description="One entry per concurrency level, ascending.")
    num_requests: int = Field(description="Measured requests over all levels and repetitions.")
    num_errors: int = Field(description="Failed measured requests.")
    accept_length_mismatch: bool = Field(description="Any level flagged accept_length_mismatch.")
    accept_length_not_checkable: bool = Field(
        default=False, description="Any level flagged accept_length_not_checkable."
    )
    noisy: bool = Field(description="Any level flagged noisy.")

    def level(self, concurrency: int | None = None) -> LevelResult:
        """The level at ``concurrency`` (default: the highest measured)."""
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
        """``c{concurrency}.{metric}`` -> median across repetitions, present values only (MLflow-ready)."""
        out: dict[str, float] = {}
        for level in self.levels:
            for name, dist in level.summary.items():
                if dist.median is not None:
                    out[f"c{level.concurrency}.{name}"] = dist.median
        return out


def write_json(result: BenchResult, path: str | Path) -> Path:
    """Write ``result`` as indented JSON; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return target


def read_json(path: str | Path) -> BenchResult:
    """Read a result written by :func:`write_json`, refusing other schema versions."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != BENCH_SCHEMA_VERSION:
        raise BenchmarkError(f"{path}: schema_version {version!r} is not {BENCH_SCHEMA_VERSION!r}")
    try:
        return BenchResult.model_validate(data)
    except ValidationError as exc:
        raise BenchmarkError(f"{path}: not a valid {BENCH_SCHEMA_VERSION} result: {exc}") from None


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cv(dist: Distribution | None) -> str:
    return "-" if dist is None or dist.cv is None else f"{dist.cv * 100:.1f}%"


def summary_table(result: BenchResult) -> Table:
    """Metrics down, concurrency levels across: medians across repetitions (and the CV of
    throughput), "absent" where the server does not report a figure, then errors and flags."""
    table = Table(
        title=escape(
            f"spectune bench {result.base_url} ({result.api}, {result.dataset.name}, {result.settings.repetitions} rep)"
        ),
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
    table.add_row("errors", *(str(level.num_errors) for level in result.levels))
    flags = []
    for level in result.levels:
        names = []
        if level.accept_length_mismatch:
            names.append("accept_length_mismatch")
        elif level.accept_length_not_checkable:
            names.append("accept_length_not_checkable")
        if level.noisy:
            names.append("noisy")
        flags.append(", ".join(names) or "-")
    table.add_row("flags", *flags)
    return table
