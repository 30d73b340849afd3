"""The spec's ``benchmark`` and ``probe`` sections: how each trial (and confirmation visit) is
measured, and how its output is judged against the no-speculation baseline.

:class:`BenchmarkSpec` is what the YAML says; ``orchestrator.bench.settings.BenchSettings``
subclasses it with the knobs only a run needs, so a field added here is a field of the settings,
with the same validation.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.statistics import MIN_VALUES
from orchestrator.validation import StrictModel

__all__ = ["BenchmarkSpec", "DEFAULT_MAX_FLIP_RATE", "DEFAULT_MAX_LOGPROB_GAP", "MAX_TIMEOUT_S", "OBJECTIVE_METRICS",
           "ProbeRule", "ProbeSpec", "WarmupSpec"]

ProbeRule = Literal["near_tie", "exact"]
"""``near_tie``: a divergence within the gap of the baseline's own token passes; ``exact``: token for token."""

DEFAULT_MAX_LOGPROB_GAP = 0.5
"""Nats between the baseline's token and the trial's under which a flip is numerics. Measured on the
GPU reference engine in bf16 (docs/measurements/probe-numerics-h100x1): every one of 208 flips of
three speculative configurations against plain was within 0.1875 nats (3 steps of bf16's
resolution of a logprob there); 0.5 is that with a margin of 2.7x, and still below the baseline's
gap at 75% of positions."""

DEFAULT_MAX_FLIP_RATE = 0.25
"""Share of near ties a trial may flip before the flips themselves are the finding. Measured (as
above): at most 70 of 1171 near ties within 0.5 nats flipped (6.0%, 95% interval up to 7.5%);
0.25 is 3x that bound."""

OBJECTIVE_METRICS: dict[str, Literal["max", "min"]] = {
    "output_tok_per_s": "max", "request_per_s": "max", "accept_length": "max",
    "ttft_ms_p50": "min", "ttft_ms_p99": "min", "tpot_ms_p50": "min", "tpot_ms_p99": "min",
    "e2e_ms_p50": "min", "e2e_ms_p99": "min", "cycle_ms": "min",
}
"""The metrics a sweep may optimise (``objective.metric``), with the direction that means "better";
the bench's metric table (``orchestrator.bench.metrics.METRICS``) computes each of them."""

MAX_LEVEL_CONCURRENCY = 10_000
"""Largest closed-loop concurrency level (as ``objective.concurrency``)."""
MAX_LEVELS = 64
"""Most concurrency levels one benchmark measures."""
MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""Longest per-request timeout (30 days: anything longer is a typo)."""
MAX_SEED = 2**63 - 1
"""Largest seed: what a 64-bit signed integer (SGLang's and torch's seeds) holds."""
MAX_REPETITIONS = 100
"""Most repetitions per level."""
DEFAULT_MIN_REPETITIONS = MIN_VALUES
"""Fewest repetitions per level by default, and in effect (a smaller ``min_repetitions`` acts as this):
no interval is stated from fewer than ``orchestrator.statistics.MIN_VALUES`` (3) values."""
MIN_WINDOW_REQUESTS = 4
"""Fewest requests in a default warm-up window."""


class WarmupSpec(StrictModel):
    """How each concurrency level is warmed up after its ``warmup_requests``: windows of requests at
    the level's concurrency, each after ``/flush_cache`` and with the same prompts, until two
    windows in a row agree on output tok/s (``noise.windows_stable``) or ``max_windows`` ran."""

    window_requests: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests per stability window; default: twice the level's concurrency, at least "
        f"{MIN_WINDOW_REQUESTS} (a window shorter than one round of the batch measures its ramp, not its pace).",
    )
    tolerance: float | None = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Stable when two consecutive windows' tok/s differ by at most this fraction of the larger; "
        "null = no windows (exactly warmup_requests per level).",
    )
    max_windows: int = Field(
        default=8,
        ge=2,
        le=1_000,
        description="Most stability windows per level; a level still unstable then is measured anyway and its "
        "warm-up recorded as not converged.",
    )

    def window_size(self, concurrency: int) -> int:
        """Requests per window at ``concurrency``: ``window_requests``, or max(4, 2 * concurrency)."""
        if self.window_requests is not None:
            return self.window_requests
        return max(MIN_WINDOW_REQUESTS, 2 * concurrency)


class BenchmarkSpec(StrictModel):
    """How each trial is measured: a sweep spec's ``benchmark`` section (metric definitions in
    ``orchestrator.bench.metrics``). Strict like every section a user writes: ``num_prompts: true``
    is refused, not read as 1."""

    dataset: Literal["builtin", "sharegpt", "random", "request_log"] = Field(
        default="builtin", description="Prompt source: the shipped prompt set, a ShareGPT JSON file, random words, or "
        "request_log: the user's own traffic, an OpenAI-format JSONL request log (one chat or completion request a "
        "line, as a gateway records it; each request's messages, max_tokens, temperature and top_p are replayed, "
        "requests that cannot be (tools, images) are counted and reported: orchestrator.bench.request_log)."
    )
    dataset_path: str | None = Field(default=None, description="Path of the ShareGPT-format JSON file or the request "
                                     "log (relative paths: from the working directory, a job's from its working_dir).")
    api: Literal["auto", "generate", "completions", "chat"] = Field(
        default="auto", description="Where requests go: generate (SGLang's native /generate, raw text: no chat "
        "template), completions (/v1/completions), chat (/v1/chat/completions: the server applies the model's chat "
        "template, as production does for a chat model); auto: /generate if /server_info answers, else "
        "/v1/completions. Every API returns the per-request speculative counters and accepted-draft histogram "
        "(the OpenAI ones through SGLang's return_spec_tokens_details).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="Sent with every chat request as SGLang's chat_template_kwargs (e.g. "
        "{thinking: false} for Kimi's thinking switch): the template production renders. api chat only.")
    ignore_eos: bool = Field(
        default=True, description="Generate exactly the output cap (output_len, or a logged request's max_tokens "
        "below it): equal work per repetition, so trials compare; false replays where the model would stop "
        "(production's lengths, at the price of noisier repetitions)."
    )
    allow_random_prompts: bool = Field(
        default=False,
        description="Allow tuning on random prompts (speculation looks better on them than on real text).",
    )
    random_input_len: int = Field(default=128, ge=1, le=100_000, description="Prompt length (words) for random prompts.")
    num_prompts: int = Field(default=32, ge=1, le=100_000, description="Prompts per repetition and concurrency level.")
    output_len: int = Field(default=128, ge=1, le=65_536, description="max_new_tokens per request.")
    concurrency: list[int] = Field(default_factory=lambda: [1, 8], description="Closed-loop concurrency levels.")
    request_rate: float | None = Field(default=None, gt=0, le=1_000_000, description="Open-loop requests/s (instead of closed loop).")
    warmup_requests: int = Field(
        default=4,
        ge=0,
        le=100_000,
        description="Requests sent and discarded at each concurrency level, at that level's concurrency, before its "
        "stability windows (warmup); 0 = no warm-up at all.",
    )
    warmup: WarmupSpec = Field(
        default_factory=WarmupSpec,
        description="After warmup_requests, keep warming each level until its throughput is stable.",
    )
    repetitions: int = Field(
        default=10,
        ge=1,
        le=MAX_REPETITIONS,
        description="Most measured repetitions per concurrency level (the cap); exactly this many when "
        "target_ci_rel is null.",
    )
    min_repetition_s: float = Field(
        default=20.0,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="Shortest repetition, in seconds of steady load: after warm-up the level's request count per "
        "repetition grows (cycling through the prompts) until a repetition lasts at least this long at the "
        "throughput measured so far; 0 = exactly num_prompts requests. Default 20 s: on an H200, 16 x 128-token "
        "repetitions lasted 8 s and two of them were 18% apart, while 64 x 256 (about 27 s) had a CV of 1.5%.",
    )
    min_repetitions: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPETITIONS,
        description=f"Fewest repetitions per level before its interval is judged; at most repetitions. "
        f"Default: {DEFAULT_MIN_REPETITIONS}, or repetitions if that is smaller; 1 or 2 act as {MIN_VALUES}, since no "
        f"interval is stated from fewer than {MIN_VALUES} values.",
    )
    target_ci_rel: float | None = Field(
        default=0.02,
        gt=0,
        lt=1,
        description="Repeat a level until the 95% interval of its target metric's geometric mean (the sweep's "
        "objective; log scale, from 3 repetitions on) lies within a factor 1 + target_ci_rel of it either way, "
        "i.e. exp(t(0.975, n-1) * stdev(log x) / sqrt(n)) - 1 <= target_ci_rel, or repetitions is reached; "
        "null = exactly repetitions per level.",
    )
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
    def _rules(self) -> "BenchmarkSpec":
        """The repetition bounds and the dataset's rules: every problem at once, one line each."""
        problems = [*self._repetition_problems(), *self._dataset_problems()]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _repetition_problems(self) -> Iterator[str]:
        if self.min_repetitions is not None and self.min_repetitions > self.repetitions:
            yield (f"min_repetitions ({self.min_repetitions}) is above repetitions ({self.repetitions}), the most "
                   "repetitions per level; lower min_repetitions or raise repetitions")

    def repetition_bounds(self) -> tuple[int, int]:
        """(fewest, most) repetitions per level: ``min_repetitions`` raised to ``MIN_VALUES`` and
        capped at ``repetitions``; and ``repetitions``. (repetitions, repetitions) without a target."""
        if self.target_ci_rel is None:
            return self.repetitions, self.repetitions
        fewest = self.min_repetitions if self.min_repetitions is not None else DEFAULT_MIN_REPETITIONS
        return min(max(fewest, MIN_VALUES), self.repetitions), self.repetitions

    def _dataset_problems(self) -> Iterator[str]:
        if self.dataset == "sharegpt" and not self.dataset_path:
            yield "dataset: sharegpt needs dataset_path (a ShareGPT-format JSON file)"
        if self.dataset == "request_log" and not self.dataset_path:
            yield "dataset: request_log needs dataset_path (an OpenAI-format JSONL request log)"
        if self.dataset not in ("sharegpt", "request_log") and self.dataset_path:
            yield f"dataset_path is only used with dataset: sharegpt or request_log (dataset is {self.dataset})"
        if self.dataset == "request_log" and self.api not in ("chat", "completions"):
            yield (f"dataset: request_log is replayed through the OpenAI API it was recorded for; set "
                   f"api: chat (or completions for a completions log), not {self.api}")
        if self.chat_template_kwargs is not None and self.api != "chat":
            yield f"chat_template_kwargs is only sent with api: chat (api is {self.api})"
        if self.dataset == "random" and not self.allow_random_prompts:
            yield ("dataset: random is refused for tuning (speculation looks better on random prompts than on "
                   "real text); use builtin or sharegpt, or set allow_random_prompts: true")


class ProbeSpec(StrictModel):
    """The correctness probe every trial passes before it is benchmarked (orchestrator.bench.probe)."""

    num_prompts: int = Field(default=8, ge=1, le=64, description="Built-in prompts sent greedily, one at a time.")
    max_new_tokens: int = Field(default=32, ge=1, le=4096, description="Greedy tokens compared per prompt.")
    rule: ProbeRule = Field(
        default="near_tie", description="near_tie: a divergence to a token within max_logprob_gap nats of the "
        "no-speculation baseline's own is GPU numerics, passes, is reported, and the rest of the output is still "
        "compared; exact: token for token (strict: real engines are not bit-exact under speculation in bf16).")
    max_logprob_gap: float = Field(
        default=DEFAULT_MAX_LOGPROB_GAP, gt=0, le=5, description="near_tie: nats under which a divergence is "
        "numerics (0.5: 2.7x the largest flip measured in bf16, docs/measurements/probe-numerics-h100x1).")
    max_flip_rate: float = Field(
        default=DEFAULT_MAX_FLIP_RATE, gt=0, le=1, description="near_tie: flips per near tie beyond which (the "
        "whole 95% interval above it) the flips fail the trial (0.25: 3x the most measured in bf16).")
