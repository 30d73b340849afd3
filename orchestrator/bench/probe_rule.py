"""The probe's rule: is a divergence from the no-speculation baseline GPU numerics or corruption?

Greedy speculative output equals greedy plain output in exact arithmetic, not on GPUs: the verify
pass runs the target over several tokens at once (other kernels, batch shapes, reduction orders) and
NCCL's algorithm changes the all-reduce's summation order, so in bf16 a near-tie between the two best
tokens can flip. Corruption changes tokens the baseline was confident about. The baseline's own
log-probabilities tell the two apart (docs/design/bench-and-spec.md, "Correctness probe"):

* a trial's first differing token that is the baseline's runner-up (or tied with it) within
  ``max_gap`` nats of the baseline's own token is a **near-tie flip**: numerics, it passes;
* anything else is a **mismatch**, as with the bit-exact rule.

Near ties are counted over every position compared (the *opportunities*); a trial that flips more
of them than numerics explain fails too: the exact 95% interval of its flip rate lies wholly above
``max_flip_rate``. Pure functions on the baseline's numbers: no I/O.
"""

from __future__ import annotations

from typing import Sequence

from pydantic import BaseModel, Field

from orchestrator.spec_benchmark import DEFAULT_MAX_FLIP_RATE, DEFAULT_MAX_LOGPROB_GAP, ProbeRule

__all__ = [
    "DEFAULT_MAX_FLIP_RATE",
    "DEFAULT_MAX_LOGPROB_GAP",
    "FlipRate",
    "NearTieFlip",
    "ProbeRule",
    "Alternatives",
    "flip_at",
    "flip_rate",
    "logprob_table",
    "near_ties",
]

Alternatives = Sequence[tuple[int, float]]
"""The baseline's most likely ``(token_id, logprob)`` pairs at one position, best first."""


class NearTieFlip(BaseModel):
    """A divergence judged numerics: the trial took the baseline's runner-up at a near tie."""

    prompt_index: int = Field(description="Index of the prompt in the baseline.")
    prompt_id: str
    position: int = Field(description="Index of the output token that flipped.")
    expected_token: int = Field(description="The baseline's token (its most likely).")
    got_token: int = Field(description="The trial's token.")
    gap: float = Field(ge=0, description="The baseline's logprob of its token minus that of the trial's, in nats.")
    rank: int = Field(ge=1, description="The trial's token's rank among the baseline's alternatives (2: runner-up; 1 "
                      "or more where several tie exactly).")

    def __str__(self) -> str:
        return (f"prompt {self.prompt_index} ({self.prompt_id!r}) token {self.position}: {self.expected_token} -> "
                f"{self.got_token} (its #{self.rank}), gap {self.gap:.3g} nats")


class FlipRate(BaseModel):
    """Flips per near-tie opportunity, with the exact (Clopper-Pearson) 95% interval of the rate."""

    flips: int = Field(ge=0)
    near_ties: int = Field(ge=0, description="Positions compared where the baseline's best two were within the gap.")
    rate: float | None = Field(description="flips / near_ties; None without a near tie.")
    low: float | None = Field(description="Lower end of the 95% interval; None without a near tie.")
    high: float | None = Field(description="Upper end of the 95% interval; None without a near tie.")

    def exceeds(self, limit: float) -> bool:
        """True when the whole interval lies above ``limit``: more flips than numerics explain."""
        return self.low is not None and self.low > limit

    def __str__(self) -> str:
        if self.rate is None:
            return f"{self.flips} flips, no near tie compared"
        return (f"{self.flips} of {self.near_ties} near ties flipped ({self.rate:.0%}, 95% interval "
                f"{self.low:.0%}-{self.high:.0%})")


def logprob_table(alternatives: Alternatives, expected: int) -> tuple[dict[int, float], float | None]:
    """Token -> logprob at a position, and the baseline's own token's logprob (the best listed if its
    token is not among them: a many-way tie at the edge of the list)."""
    table = {int(token): float(logprob) for token, logprob in alternatives}
    if not table:
        return table, None
    return table, table.get(expected, max(table.values()))


def flip_at(alternatives: Alternatives, *, expected: int, got: int, max_gap: float) -> float | None:
    """The gap if the trial's ``got`` where the baseline has ``expected`` is a near-tie flip, else
    None (a mismatch).

    A flip: ``got`` is among the baseline's alternatives there and its logprob is within
    ``max_gap`` nats of the baseline's own token's. That is the baseline's runner-up, or one tied
    with it: in bf16 several tokens often share a logprob to the last bit (the GPU measurement
    saw exact ties at 2% of positions, and flips among them)."""
    table, own = logprob_table(alternatives, expected)
    if own is None or got == expected or got not in table:
        return None
    gap = max(0.0, own - table[got])
    return gap if gap <= max_gap else None


def near_ties(positions: Sequence[Alternatives], expected: Sequence[int], *, max_gap: float) -> int:
    """How many of ``positions`` are near ties: some other token within ``max_gap`` nats of the
    baseline's own (``expected``, one per position)."""
    count = 0
    for alternatives, token in zip(positions, expected):
        table, own = logprob_table(alternatives, token)
        others = [logprob for other, logprob in table.items() if other != token]
        if own is not None and others and own - max(others) <= max_gap:
            count += 1
    return count


def flip_rate(*, flips: int, near_ties: int) -> FlipRate:
    """``flips`` of ``near_ties`` opportunities, with the exact binomial 95% interval (scipy).

    Raises:
        ValueError: more flips than near ties (every passing flip is at a near tie).
    """
    if flips > near_ties:
        raise ValueError(f"{flips} flips but only {near_ties} near ties: every passing flip is at a near tie")
    if near_ties == 0:
        return FlipRate(flips=0, near_ties=0, rate=None, low=None, high=None)
    from scipy.stats import binomtest  # at use: specs import this module, and scipy.stats takes a second

    interval = binomtest(flips, near_ties).proportion_ci(confidence_level=0.95, method="exact")
    return FlipRate(flips=flips, near_ties=near_ties, rate=flips / near_ties, low=float(interval.low),
                    high=float(interval.high))
