"""The correctness probe's documents: the stored baseline, one prompt's output, a mismatch, the verdict.

``orchestrator.bench.probe`` runs the probe; ``probe_requests`` fills these from a server;
``probe_rule`` judges a divergence. Pydantic models, no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.bench.loadgen import ApiKind
from orchestrator.bench.probe_rule import FlipRate, NearTieFlip, ProbeRule
from orchestrator.errors import BenchmarkError

__all__ = [
    "PROBE_SCHEMA_VERSION",
    "ProbeBaseline",
    "ProbeBaselineError",
    "ProbeMismatch",
    "ProbeOutput",
    "ProbePrompt",
    "ProbeResult",
]

PROBE_SCHEMA_VERSION = "spectune.probe/2"
"""The baseline file's schema (/2: prompt ids and top logprobs; /1 files are read, compared exactly)."""


class ProbeBaselineError(BenchmarkError):
    """The baseline file cannot be used: unreadable, not JSON, another schema, inconsistent, or
    missing where it must exist. Bad input, not a verdict on the server: nothing was compared."""


class ProbePrompt(BaseModel):
    """A prompt as stored in the baseline (so later runs send exactly the same text)."""

    id: str
    text: str


class ProbeOutput(BaseModel):
    """One prompt's greedy output."""

    prompt_id: str
    output_ids: list[int] | None = Field(description="Generated token ids, where the server returns them.")
    text: str | None = Field(description="Generated text.")
    prompt_ids: list[int] | None = Field(
        default=None, description="The prompt as the server tokenized it (baseline, native API): what re-anchoring sends.")
    top_logprobs: list[list[tuple[int, float]]] | None = Field(
        default=None, description="Per output token, the baseline's most likely (token id, logprob) pairs, best "
        "first (baseline, native API).")

    @property
    def judgeable(self) -> bool:
        """Whether the near-tie rule can judge against this (baseline) output."""
        return (self.output_ids is not None and self.prompt_ids is not None and self.top_logprobs is not None
                and len(self.top_logprobs) == len(self.output_ids))


class ProbeBaseline(BaseModel):
    """The stored reference: exactly what was sent and what came back."""

    schema_version: Literal["spectune.probe/1", "spectune.probe/2"] = PROBE_SCHEMA_VERSION
    created_at: str
    base_url: str = Field(description="Server the baseline was taken from (for the record only).")
    server: dict[str, Any] = Field(description="Its /server_info summary (model, speculative settings).")
    api: ApiKind
    model: str | None
    max_new_tokens: int
    prompts: list[ProbePrompt]
    outputs: list[ProbeOutput]


class ProbeMismatch(BaseModel):
    """The first difference in one prompt's output."""

    prompt_index: int = Field(description="Index of the prompt in the baseline.")
    prompt_id: str
    position: int = Field(description="Index of the first differing token (or character).")
    unit: Literal["token", "char"]
    expected: str = Field(description="The baseline around the position.")
    got: str = Field(description="This server's output around the position.")
    detail: str = Field(default="", description="Near-tie rule: why this is no flip (the baseline's gap, the "
                        "token's rank among its alternatives).")

    def __str__(self) -> str:
        return (
            f"prompt {self.prompt_index} ({self.prompt_id!r}) differs at {self.unit} {self.position}: "
            f"expected {self.expected} got {self.got}" + (f" ({self.detail})" if self.detail else "")
        )


class ProbeResult(BaseModel):
    """What the probe found."""

    status: Literal["baseline_written", "match", "mismatch", "too_many_flips"]
    baseline_path: str
    num_prompts: int
    unit: Literal["token", "char"] | None = Field(description="What was compared (None when the baseline was written).")
    mismatches: list[ProbeMismatch] = Field(description="One per differing prompt, in prompt order.")
    rule: ProbeRule | None = Field(default=None, description="The rule applied: near_tie, or exact (asked for, or the "
                                   "baseline has no log-probabilities); None when the baseline was written.")
    rule_note: str = Field(default="", description="Why near_tie fell back to exact, where it did.")
    max_logprob_gap: float | None = Field(default=None, description="The near-tie rule's gap (nats).")
    max_flip_rate: float | None = Field(default=None, description="The near-tie rule's limit on flips per near tie.")
    flips: list[NearTieFlip] = Field(default_factory=list, description="Near-tie flips passed as numerics.")
    flip_rate: FlipRate | None = Field(default=None, description="Flips per near tie compared (near_tie rule).")
    reanchors: int = Field(default=0, description="Requests sent to continue from the baseline after a flip.")

    @property
    def passed(self) -> bool:
        """True unless the outputs differ from the baseline beyond numerics."""
        return self.status in ("baseline_written", "match")

    @property
    def first_mismatch(self) -> ProbeMismatch | None:
        return self.mismatches[0] if self.mismatches else None

    @property
    def message(self) -> str:
        if self.status == "baseline_written":
            return f"baseline written to {self.baseline_path} ({self.num_prompts} prompts)"
        note = f" ({self.rule_note})" if self.rule_note else ""
        if self.status == "too_many_flips":
            return (f"more near-tie flips than numerics explain: {self.flip_rate} whose 95% interval lies "
                    f"above {self.max_flip_rate:.0%}; first: {self.flips[0]}")
        if self.status == "match" and not self.flips:
            return (f"all {self.num_prompts} prompts match the baseline {self.baseline_path} {self.unit} for "
                    f"{self.unit}{note}")
        if self.status == "match":
            shown = "; ".join(str(flip) for flip in self.flips[:3]) + ("; ..." if len(self.flips) > 3 else "")
            return (f"all {self.num_prompts} prompts match the baseline {self.baseline_path} but for "
                    f"{len(self.flips)} near-tie flip{'s' if len(self.flips) != 1 else ''} (numerics, gap <= "
                    f"{self.max_logprob_gap:g} nats; {self.flip_rate}): {shown}")
        return (
            f"{len(self.mismatches)} of {self.num_prompts} prompts differ from the baseline "
            f"{self.baseline_path}; first: {self.mismatches[0]}{note}"
        )
