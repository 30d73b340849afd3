"""SGLang's rules for the three speculative numbers, written once (stdlib only).

Rules (SGLang ``ServerArgs``): all three set or none; ``topk == 1`` is a chain, so
``num_draft_tokens == num_steps + 1``; otherwise ``num_draft_tokens - 1`` must not exceed the draft
tree's capacity. Each number has an upper bound of spectune's own. The check takes the names to use.
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = [
    "FIELD_NAMES",
    "FLAG_NAMES",
    "MAX_EAGLE_TOPK",
    "MAX_NUM_DRAFT_TOKENS",
    "MAX_NUM_STEPS",
    "SPECULATIVE_MAX_RUNNING_REQUESTS",
    "chain_num_draft_tokens",
    "speculative_problem",
    "tree_capacity",
]

MAX_NUM_STEPS = 16
"""Largest ``num_steps`` accepted."""
MAX_EAGLE_TOPK = 16
"""Largest ``eagle_topk`` accepted."""
MAX_NUM_DRAFT_TOKENS = 64
"""Largest ``num_draft_tokens`` accepted (tokens verified per request in one forward pass)."""
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
"""SGLang's ``max_running_requests`` under speculation unless ``--max-running-requests`` is set
(0.5.23: ``srt/arg_groups/speculative_hook.py``): no decode batch of a speculative engine is larger."""

FIELD_NAMES: Mapping[str, str] = {
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
}
"""The numbers as EngineConfig (and SGLang's ServerArgs) name them."""
FLAG_NAMES: Mapping[str, str] = {
    "num_steps": "--speculative-num-steps",
    "eagle_topk": "--speculative-eagle-topk",
    "num_draft_tokens": "--speculative-num-draft-tokens",
}
"""The numbers as the command line names them."""

_BOUNDS = {"num_steps": (1, MAX_NUM_STEPS), "eagle_topk": (1, MAX_EAGLE_TOPK), "num_draft_tokens": (2, MAX_NUM_DRAFT_TOKENS)}


def tree_capacity(*, num_steps: int, eagle_topk: int) -> int:
    """How many candidate tokens an EAGLE draft tree of this shape holds:
    ``eagle_topk + (num_steps - 1) * eagle_topk**2``."""
    return eagle_topk + (num_steps - 1) * eagle_topk * eagle_topk


def chain_num_draft_tokens(num_steps: int) -> int:
    """The draft-token count of a chain (top-k 1): one per step plus the root."""
    return num_steps + 1


def speculative_problem(
    *,
    num_steps: Optional[int],
    eagle_topk: Optional[int],
    num_draft_tokens: Optional[int],
    names: Mapping[str, str] = FIELD_NAMES,
) -> Optional[str]:
    """Say which rule the triple breaks (naming the numbers by ``names``), or ``None``."""
    given = {"num_steps": num_steps, "eagle_topk": eagle_topk, "num_draft_tokens": num_draft_tokens}
    unset = [names[key] for key, value in given.items() if value is None]
    if 0 < len(unset) < 3:
        return f"set all three speculative numbers or none (SGLang's auto choice); unset: {', '.join(unset)}"
    if unset:
        return None
    for key, value in given.items():
        low, high = _BOUNDS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"{names[key]} must be an integer in [{low}, {high}], got {value!r}"
    assert num_steps is not None and eagle_topk is not None and num_draft_tokens is not None
    if eagle_topk == 1 and num_draft_tokens != chain_num_draft_tokens(num_steps):
        return (
            f"{names['eagle_topk']}=1 is a chain: {names['num_draft_tokens']} must be "
            f"{names['num_steps']} + 1 = {chain_num_draft_tokens(num_steps)}, got {num_draft_tokens}"
        )
    capacity = tree_capacity(num_steps=num_steps, eagle_topk=eagle_topk)
    if num_draft_tokens - 1 > capacity:
        return (
            f"{names['num_draft_tokens']}={num_draft_tokens} needs {num_draft_tokens - 1} candidates but a "
            f"tree of {names['num_steps']}={num_steps}, {names['eagle_topk']}={eagle_topk} holds {capacity} "
            f"(topk + (num_steps-1)*topk^2); use at most {capacity + 1}"
        )
    return None
