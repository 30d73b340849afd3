"""How a benchmark run is configured: :class:`BenchSettings`, the spec's ``benchmark`` section
(``orchestrator.spec_benchmark.BenchmarkSpec``) plus the knobs only a run needs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from orchestrator.spec_benchmark import MAX_TIMEOUT_S, OBJECTIVE_METRICS, BenchmarkSpec

__all__ = ["ApiChoice", "BenchSettings", "DEFAULT_NOISE_METRICS", "SWEEP_NOISE_METRICS"]

ApiChoice = Literal["auto", "generate", "completions", "chat"]

DEFAULT_NOISE_METRICS = ("output_tok_per_s", "tpot_ms_p50", "ttft_ms_p50")
"""Metrics whose spread across repetitions decides the ``noisy`` flag."""

SWEEP_NOISE_METRICS = DEFAULT_NOISE_METRICS
"""What a sweep tests for drift besides its objective."""


class BenchSettings(BenchmarkSpec):
    """How to measure one server: the spec's benchmark section plus API, streaming and flag thresholds."""

    min_repetition_s: float = Field(
        default=0.0, ge=0, le=MAX_TIMEOUT_S,
        description="As the spec's benchmark.min_repetition_s; 0 here (spectune bench sends exactly the prompts it "
        "is asked for) unless a spec's section is passed through, which carries its own (default 20 s).",
    )
    model: str | None = Field(
        default=None, description="OpenAI 'model' field (default: the first id of /v1/models)."
    )
    stream: bool = Field(default=True, description="Stream responses (needed for TTFT, TPOT, tokens per chunk).")
    flush_cache: bool = Field(
        default=True,
        description="POST /flush_cache before each repetition: resets the prefix cache and the server's "
        "speculative counters (SGLang 0.5.23 and the reference engine reset both; the harness checks), so "
        "/server_info's accept length covers exactly that repetition.",
    )
    accept_length_tolerance: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="Relative disagreement between the server's and the per-request accept length above "
        "which a repetition is flagged accept_length_mismatch. The server samples its counter at "
        "decode-log intervals and counts tokens cut off by max_new_tokens, so a few percent is normal.",
    )
    hung_after_timeouts: int | None = Field(
        default=None,
        ge=1,
        description="End the run as hung once this many requests in a row time out (request_timeout_s) with "
        "none completing in between; default: the concurrency level (at least 2), i.e. every slot timed out.",
    )
    noisy_cv_threshold: float = Field(
        default=0.05, gt=0, description="A level is flagged noisy when a noise metric's CV across repetitions exceeds this."
    )
    target_metric: str = Field(
        default="output_tok_per_s",
        description="The metric whose interval decides when a level has been repeated enough (target_ci_rel) and "
        f"whose drift is tested; the sweep passes its objective. Any of {', '.join(OBJECTIVE_METRICS)}.",
    )
    noise_metrics: list[str] = Field(
        default_factory=lambda: list(DEFAULT_NOISE_METRICS),
        description=f"Metrics checked for noise; any of {', '.join(OBJECTIVE_METRICS)}.",
    )

    @field_validator("noise_metrics")
    @classmethod
    def _noise_metrics(cls, value: list[str]) -> list[str]:
        unknown = [m for m in value if m not in OBJECTIVE_METRICS]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; allowed: {', '.join(OBJECTIVE_METRICS)}")
        return value

    @field_validator("target_metric")
    @classmethod
    def _target_metric(cls, value: str) -> str:
        if value not in OBJECTIVE_METRICS:
            raise ValueError(f"unknown metric {value!r}; allowed: {', '.join(OBJECTIVE_METRICS)}")
        return value

    @classmethod
    def for_sweep(cls, benchmark: BenchmarkSpec, *, objective_metric: str, levels: list[int]) -> "BenchSettings":
        """The settings for measuring ``levels`` as a sweep does (a trial, a confirmation visit): the
        spec's ``benchmark`` section, with the objective deciding when a level has been repeated
        enough and being the metric tested for drift."""
        noise = list(dict.fromkeys([objective_metric, *SWEEP_NOISE_METRICS]))
        return cls.from_spec(benchmark, concurrency=levels, noise_metrics=noise, target_metric=objective_metric)

    @classmethod
    def from_spec(cls, spec: BenchmarkSpec, **overrides: Any) -> "BenchSettings":
        """The spec's benchmark section with ``overrides`` (e.g. ``noise_metrics=[objective]``)."""
        return cls.model_validate({**spec.model_dump(), **overrides})
