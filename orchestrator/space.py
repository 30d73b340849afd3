"""The search space of a sweep: which engine configurations are valid candidates.

SGLang's speculative rules make the space conditional: with top-k 1 the number of draft tokens is
fixed by the number of steps, and with a larger top-k only as many draft tokens as the tree holds
make sense. This module enumerates exactly the valid points, so ``spectune validate`` can count
them and the sweep never proposes a configuration SGLang would reject or silently rewrite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Literal

from orchestrator.spec import SpeculativeSearch, SweepSpec

__all__ = ["Candidate", "SpeculativeTriple", "count_candidates", "iter_candidates", "speculative_triples"]


@dataclass(frozen=True, order=True)
class SpeculativeTriple:
    """(num_steps, eagle_topk, num_draft_tokens); all ``None`` means SGLang's auto choice."""

    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None

    @property
    def is_auto(self) -> bool:
        """Whether SGLang picks the numbers itself."""
        return self.num_steps is None

    def label(self) -> str:
        """Short human label, e.g. ``steps=3 topk=1 draft=4`` or ``auto``."""
        if self.is_auto:
            return "auto"
        return f"steps={self.num_steps} topk={self.eagle_topk} draft={self.num_draft_tokens}"


AUTO = SpeculativeTriple(None, None, None)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space."""

    speculative: SpeculativeTriple
    all_reduce: Literal["custom", "nccl"] = "custom"
    nccl_env: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.speculative, self.all_reduce, tuple(sorted(self.nccl_env.items()))))


def speculative_triples(search: SpeculativeSearch) -> list[SpeculativeTriple]:
    """Every valid speculative combination of ``search`` (auto included if asked for)."""
    return [SpeculativeTriple(*triple) for triple in search.triples()]


def _triples_of(spec: SweepSpec) -> list[SpeculativeTriple]:
    if spec.engine.speculative_algorithm is None or spec.search.speculative is None:
        return [AUTO]  # non-speculative, or speculative with SGLang's auto choice only
    return speculative_triples(spec.search.speculative)


def count_candidates(spec: SweepSpec) -> int:
    """How many distinct configurations the spec's space holds."""
    nccl_points = math.prod(len(choices) for choices in spec.search.nccl_env.values())
    return len(_triples_of(spec)) * len(spec.search.all_reduce) * nccl_points


def iter_candidates(spec: SweepSpec) -> Iterator[Candidate]:
    """Every configuration of the space, in a stable order (speculative, all-reduce, NCCL)."""
    names = sorted(spec.search.nccl_env)

    def nccl_points(i: int, chosen: dict[str, str]) -> Iterator[dict[str, str]]:
        if i == len(names):
            yield dict(chosen)
            return
        for value in spec.search.nccl_env[names[i]]:
            nxt = dict(chosen)
            if value is not None:
                nxt[names[i]] = value
            yield from nccl_points(i + 1, nxt)

    for triple in _triples_of(spec):
        for all_reduce in spec.search.all_reduce:
            for env in nccl_points(0, {}):
                yield Candidate(triple, all_reduce, env)
