"""How a benchmark is configured: the sweep spec's ``benchmark`` section and the settings of a run.

:class:`BenchmarkSpec` is the spec's section; it lives here, beside the code that reads it, and
``orchestrator.spec`` imports it (data flows one way: the spec is assembled from the harness's
models, never the reverse). :class:`BenchSettings` *is* a ``BenchmarkSpec`` (a subclass)
plus the knobs only a benchmark run needs, so the sweep passes its spec's section straight through
(``BenchSettings.from_spec(spec.benchmark)``) and both stay in step: a field added to the spec is a
field of the settings, with the same validation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.bench.metrics import OBJECTIVE_METRICS
from orchestrator.validation import StrictModel

__all__ = ["ApiChoice", "BenchSettings", "BenchmarkSpec", "DEFAULT_NOISE_METRICS"]

ApiChoice = Literal["auto", "generate", "completions", "chat"]

DEFAULT_NOISE_METRICS = ("output_tok_per_s", "tpot_ms_p50", "ttft_ms_p50")
"""Metrics whose spread across repetitions decides the ``noisy`` flag."""


MAX_LEVEL_CONCURRENCY = 10_000
"""Largest closed-loop concurrency level (as ``objective.concurrency``)."""
MAX_LEVELS = 64
"""Most concurrency levels one benchmark measures."""
MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""Longest per-request timeout (30 days: anything longer is a typo)."""
MAX_SEED = 2**63 - 1
"""Largest seed: what a 64-bit signed integer (SGLang's and torch's seeds) holds."""


class BenchmarkSpec(StrictModel):
    """How each trial is measured: a sweep spec's ``benchmark`` section (metric definitions in
    ``orchestrator.bench.metrics``). Strict like every section a user writes: ``num_prompts: true``
    is refused, not read as 1."""

    dataset: Literal["builtin", "sharegpt", "random"] = Field(
        default="builtin", description="Prompt source: the shipped prompt set, a ShareGPT JSON file, or random."
    )
    dataset_path: str | None = Field(default=None, description="Path of the ShareGPT-format JSON file.")
    allow_random_prompts: bool = Field(
        default=False,
        description="Allow tuning on random prompts (speculation looks better on them than on real text).",
    )
    random_input_len: int = Field(default=128, ge=1, le=100_000, description="Prompt length (words) for random prompts.")
    num_prompts: int = Field(default=32, ge=1, le=100_000, description="Prompts per repetition and concurrency level.")
    output_len: int = Field(default=128, ge=1, le=65_536, description="max_new_tokens per request.")
    concurrency: list[int] = Field(default_factory=lambda: [1, 8], description="Closed-loop concurrency levels.")
    request_rate: float | None = Field(default=None, gt=0, le=1_000_000, description="Open-loop requests/s (instead of closed loop).")
    warmup_requests: int = Field(default=4, ge=0, le=100_000, description="Requests sent and discarded before measuring.")
    repetitions: int = Field(default=3, ge=1, le=100, description="Measured repetitions per concurrency level.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature (0 = greedy).")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Sampling and prompt-selection seed.")
    request_timeout_s: float = Field(default=300.0, gt=0, le=MAX_TIMEOUT_S, description="Per-request timeout.")

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("give at least one concurrency level")
        if len(value) > MAX_LEVELS:
            raise ValueError(f"at most {MAX_LEVELS} concurrency levels, got {len(value)}")
        if any(c < 1 or c > MAX_LEVEL_CONCURRENCY for c in value):
            raise ValueError(f"concurrency levels must lie in [1, {MAX_LEVEL_CONCURRENCY}], got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"repeated concurrency levels in {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _dataset(self) -> "BenchmarkSpec":
        if self.dataset == "sharegpt" and not self.dataset_path:
            raise ValueError("dataset: sharegpt needs dataset_path (a ShareGPT-format JSON file)")
        if self.dataset != "sharegpt" and self.dataset_path:
            raise ValueError(f"dataset_path is only used with dataset: sharegpt (dataset is {self.dataset})")
        if self.dataset == "random" and not self.allow_random_prompts:
            raise ValueError(
                "dataset: random is refused for tuning (speculation looks better on random prompts than on "
                "real text); use builtin or sharegpt, or set allow_random_prompts: true"
            )
        return self


class BenchSettings(BenchmarkSpec):
    """How to measure one server: the spec's benchmark section plus API, streaming and flag thresholds."""

    api: ApiChoice = Field(
        default="auto",
        description="auto: SGLang's native /generate if /server_info answers, else OpenAI /v1/completions.",
    )
    model: str | None = Field(
        default=None, description="OpenAI 'model' field (default: the first id of /v1/models)."
    )
    stream: bool = Field(default=True, description="Stream responses (needed for TTFT, TPOT, tokens per chunk).")
    ignore_eos: bool = Field(
        default=True, description="Generate exactly output_len tokens (SGLang/vLLM 'ignore_eos')."
    )
    flush_cache: bool = Field(
        default=True,
        description="POST /flush_cache before each repetition: resets the prefix cache and the server's "
        "speculative counters, so /server_info's accept length covers exactly that repetition.",
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

    @classmethod
    def from_spec(cls, spec: BenchmarkSpec, **overrides: Any) -> "BenchSettings":
        """The spec's benchmark section with ``overrides`` (e.g. ``noise_metrics=[objective]``)."""
        return cls.model_validate({**spec.model_dump(), **overrides})
