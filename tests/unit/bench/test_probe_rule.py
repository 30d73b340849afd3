"""The probe's near-tie rule on hand-written logprob tables: numerics pass, corruption fails.

The tables are what a no-speculation baseline records (each output token's most likely
``(token, logprob)`` pairs); the trial's outputs and its re-anchored continuations are written out,
so each case says exactly what the engine answered.
"""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.bench.probe import ProbeOutput, judge_near_tie
from orchestrator.bench.probe_rule import flip_at, flip_rate, near_ties

# The baseline greedy output is 10, 11, 12, 13, 14, 15. Position 1 is a near tie (11 at -0.70, 21 at
# -0.72), position 3 an exact tie listed the other way round (bf16: the same logprob to the last bit),
# position 4 confident (14 leads 24 by 2.3 nats); the rest confident too.
TABLE = [
    [(10, -0.1), (20, -2.5)],
    [(11, -0.70), (21, -0.72), (31, -3.0)],
    [(12, -0.2), (22, -2.0)],
    [(23, -0.6875), (13, -0.6875), (33, -1.5)],
    [(14, -0.1), (24, -2.4), (34, -4.0)],
    [(15, -0.3), (25, -1.9)],
]
EXPECTED = [10, 11, 12, 13, 14, 15]
GAP = 0.5


def baseline_output() -> ProbeOutput:
    return ProbeOutput(prompt_id="p0", output_ids=EXPECTED, text=None, prompt_ids=[1, 2, 3], top_logprobs=TABLE)


def judge(got: list[int], continuations: dict[int, list[int]]):
    """The rule over one prompt; ``continuations`` maps the position re-anchored from (the number
    of baseline tokens sent after the prompt) to what the engine then answered."""
    sent: list[tuple[list[int], int]] = []

    async def continue_from(index: int, token_ids: list[int], length: int) -> list[int]:
        assert index == 0 and token_ids[:3] == [1, 2, 3]
        sent.append((token_ids, length))
        return continuations[len(token_ids) - 3]

    result = asyncio.run(judge_near_tie(baseline=[baseline_output()],
                                        current=[ProbeOutput(prompt_id="p0", output_ids=got, text=None)],
                                        max_gap=GAP, continue_from=continue_from))
    return (*result, sent)


def test_a_near_tie_flip_passes_and_the_rest_is_still_compared() -> None:
    # the trial took the runner-up at position 1; re-anchored after it, it follows the baseline
    mismatches, flips, ties, reanchors, sent = judge([10, 21, 40, 41, 42, 43], {2: [12, 13, 14, 15]})
    assert mismatches == []
    assert [(f.position, f.expected_token, f.got_token, f.rank) for f in flips] == [(1, 11, 21, 2)]
    assert flips[0].gap == pytest.approx(0.02)
    assert sent == [([1, 2, 3, 10, 11], 4)]  # the prompt plus the baseline through the flip, the rest of the length
    assert reanchors == 1 and ties == 2  # positions 1 and 3 were near ties


def test_an_exact_tie_listed_the_other_way_round_is_a_flip() -> None:
    mismatches, flips, *_ = judge([10, 11, 12, 23, 99, 99], {4: [14, 15]})
    assert mismatches == [] and [(f.position, f.got_token, f.gap, f.rank) for f in flips] == [(3, 23, 0.0, 1)]


def test_a_confident_divergence_fails_naming_prompt_position_and_gap() -> None:
    mismatches, flips, *_ = judge([10, 11, 12, 13, 24, 15], {})
    assert flips == [] and len(mismatches) == 1
    mismatch = mismatches[0]
    assert (mismatch.prompt_id, mismatch.position) == ("p0", 4)
    assert "led the trial's 24, its #2 choice" in mismatch.detail and "2.3 nats > 0.5" in mismatch.detail
    assert str(mismatch).startswith("prompt 0 ('p0') differs at token 4: expected [14, 15] got [24, 15]")


def test_a_token_outside_the_baselines_alternatives_fails() -> None:
    mismatches, flips, *_ = judge([10, 77, 12, 13, 14, 15], {})
    assert flips == [] and mismatches[0].position == 1
    assert "not among the baseline's 3 most likely" in mismatches[0].detail


def test_re_anchoring_goes_on_to_catch_a_later_confident_divergence() -> None:
    # a flip at 1 passes; the continuation flips the exact tie at 3, then changes the confident 14
    mismatches, flips, ties, reanchors, sent = judge([10, 21, 0, 0, 0, 0], {2: [12, 23, 0, 0], 4: [24, 15]})
    assert [f.position for f in flips] == [1, 3]
    assert [(m.position, m.got) for m in mismatches] == [(4, "[24, 15]")]
    assert [length for _, length in sent] == [4, 2] and reanchors == 2
    assert ties == 2  # compared through the mismatch: positions 0-4, of which 1 and 3 near ties


def test_an_output_of_another_length_fails() -> None:
    mismatches, flips, *_ = judge([10, 11, 12], {})
    assert mismatches[0].position == 3 and "the output has 3 tokens, the baseline 6" in mismatches[0].detail


def test_flip_at_and_near_ties_read_the_baselines_own_token() -> None:
    assert flip_at(TABLE[1], expected=11, got=21, max_gap=GAP) == pytest.approx(0.02)
    assert flip_at(TABLE[1], expected=11, got=21, max_gap=0.01) is None  # beyond a tighter gap
    assert flip_at(TABLE[1], expected=11, got=31, max_gap=GAP) is None  # the third choice, 2.3 nats down
    assert flip_at(TABLE[1], expected=11, got=11, max_gap=GAP) is None  # no divergence
    assert flip_at([], expected=11, got=21, max_gap=GAP) is None
    assert near_ties(TABLE, EXPECTED, max_gap=GAP) == 2
    assert near_ties(TABLE, EXPECTED, max_gap=0.001) == 1  # the exact tie only
    assert near_ties(TABLE, EXPECTED, max_gap=3.0) == 6


def test_the_flip_rate_bound() -> None:
    """Flips per near tie with the exact 95% interval; the flips fail a trial only when the whole
    interval lies above the limit, so a few flips among few near ties never do."""
    few = flip_rate(flips=2, near_ties=3)
    assert few.rate == pytest.approx(2 / 3) and few.low == pytest.approx(0.0943, abs=1e-3)
    assert few.high == pytest.approx(0.9916, abs=1e-3)
    assert not few.exceeds(0.25)  # 2 of 3 could be chance at a true rate of 25%
    many = flip_rate(flips=30, near_ties=40)
    assert many.low > 0.25 and many.exceeds(0.25)  # no numerics flips three near ties in four
    measured = flip_rate(flips=70, near_ties=1171)  # the bf16 measurement behind the default
    assert measured.high == pytest.approx(0.075, abs=2e-3) and not measured.exceeds(0.25)
    none = flip_rate(flips=0, near_ties=0)
    assert none.rate is None and none.low is None and not none.exceeds(0.0)
    assert "no near tie" in str(none) and "2 of 3 near ties flipped (67%" in str(few)
    for rate in (few, many, measured):
        assert 0 <= rate.low <= rate.rate <= rate.high <= 1
    with pytest.raises(ValueError, match="every passing flip is at a near tie"):
        flip_rate(flips=3, near_ties=2)
