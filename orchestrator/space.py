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
from serving.engine import nccl
from serving.engine.config import EngineConfig

__all__ = [
    "Candidate",
    "SpeculativeTriple",
    "candidate_from_settings",
    "count_candidates",
    "iter_candidates",
    "speculative_triples",
]


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

    def engine_config(self, spec: SweepSpec) -> EngineConfig:
        """This point as a full EngineConfig (the spec's engine template plus this candidate).

        Raises:
            pydantic.ValidationError: the point breaks SGLang's rules (only possible for points
                made by hand, see ``candidate_from_settings``).
        """
        return spec.engine_config(
            num_steps=self.speculative.num_steps,
            topk=self.speculative.eagle_topk,
            num_draft_tokens=self.speculative.num_draft_tokens,
            all_reduce=self.all_reduce,
            nccl_env=self.nccl_env,
        )


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


_SETTING_ALIASES = {
    "num_steps": "num_steps",
    "speculative_num_steps": "num_steps",
    "steps": "num_steps",
    "eagle_topk": "eagle_topk",
    "speculative_eagle_topk": "eagle_topk",
    "topk": "eagle_topk",
    "num_draft_tokens": "num_draft_tokens",
    "speculative_num_draft_tokens": "num_draft_tokens",
    "draft": "num_draft_tokens",
    "all_reduce": "all_reduce",
}


def candidate_from_settings(spec: SweepSpec, settings: dict[str, str]) -> Candidate:
    """One point of the space, from ``key=value`` settings over the space's first point.

    Keys: ``num_steps``, ``eagle_topk``, ``num_draft_tokens`` (or their SGLang names),
    ``all_reduce`` (custom / nccl), and NCCL variable names (``default`` unsets one). With
    ``eagle_topk=1`` and no draft count given, the draft count follows the steps (chain).
    The result may lie outside the spec's space (to reproduce a hand-tuned run); SGLang's rules
    are checked when it becomes an EngineConfig.

    Raises:
        ValueError: an unknown key or a value that is not a number where one is needed.
    """
    first = next(iter_candidates(spec))
    triple = first.speculative
    steps, topk, draft = triple.num_steps, triple.eagle_topk, triple.num_draft_tokens
    all_reduce = first.all_reduce
    env = dict(first.nccl_env)
    given: set[str] = set()
    for raw_key, value in settings.items():
        key = raw_key.strip()
        if key.startswith("NCCL_") or key in spec.search.nccl_env:
            if value.strip().lower() in ("default", "unset", ""):
                env.pop(key, None)
            else:
                env[key] = nccl.normalise_value(key, value)  # EngineConfig checks the value itself
            continue
        name = _SETTING_ALIASES.get(key.replace("-", "_"))
        if name is None:
            allowed = sorted({*_SETTING_ALIASES.values(), "NCCL_*"})
            raise ValueError(f"unknown setting {raw_key!r}; allowed: {', '.join(allowed)}")
        if name == "all_reduce":
            if value not in ("custom", "nccl"):
                raise ValueError(f"all_reduce={value!r}: use custom or nccl")
            all_reduce = value  # type: ignore[assignment]
            continue
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{raw_key}={value!r} is not an integer") from None
        given.add(name)
        if name == "num_steps":
            steps = number
        elif name == "eagle_topk":
            topk = number
        else:
            draft = number
    if topk == 1 and steps is not None and "num_draft_tokens" not in given:
        draft = steps + 1
    return Candidate(SpeculativeTriple(steps, topk, draft), all_reduce, env)
