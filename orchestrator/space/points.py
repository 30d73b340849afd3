"""The search space of a sweep: which engine configurations are valid candidates, and how many.

The one place that says which points are valid under SGLang's speculative rules. Speculative
points are listed (a product of values, :class:`SpeculativeSpace`, or listed triples,
:class:`SpeculativeList`); the all-reduce and NCCL dimensions multiply without being listed, so
any space is counted at once. ``orchestrator.spec`` builds these objects and refuses an empty or
oversized space with :func:`space_problems`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Literal, Mapping, Optional, Protocol

from serving.engine.config import EngineConfig
from serving.speculative_rules import (
    MAX_EAGLE_TOPK,
    MAX_NUM_DRAFT_TOKENS,
    MAX_NUM_STEPS,
    chain_num_draft_tokens,
    speculative_problem,
    tree_capacity,
)

__all__ = [
    "ALL_REDUCE_ARMS",
    "ARM_ENV",
    "ARM_EXTRA_FLAGS",
    "ARM_FLAGS",
    "ARM_MULTICAST",
    "AUTO",
    "AUTO_ONLY",
    "Candidate",
    "MAX_CONFIGURATIONS",
    "NcclPreset",
    "SearchSpace",
    "SpeculativeList",
    "SpeculativeSpace",
    "SpeculativeTriple",
    "TREE_RULE",
    "arm_env",
    "arm_extra_args",
    "arm_flag_clashes",
    "arm_flags",
    "canonical_arm",
    "count_candidates",
    "iter_candidates",
    "preset_label",
    "space_problems",
    "speculative_triples",
    "triple_problem",
]

MAX_CONFIGURATIONS = 1_000_000
"""The largest space a spec may define (speculative x all-reduce x NCCL points); beyond it is a typo."""

AllReduce = Literal["default", "no_fusion", "nccl", "fusion_trtllm", "fusion_mnnvl", "fusion_cutedsl", "mscclpp",
                    "torch_symm_mem", "nccl_symm_mem", "pcie_ipc"]
"""The all-reduce arms a sweep can search, one per path SGLang 0.5.23 offers that can carry decode on
some node (``serving.all_reduce_rules`` says which kernel each runs on which node; ``ARM_FLAGS``
their flags). ``default`` is SGLang's own choice (its custom all-reduce, or FlashInfer's fused
all-reduce + RMSNorm where SGLang turns that on)."""

ALL_REDUCE_ARMS: tuple[AllReduce, ...] = ("default", "no_fusion", "nccl", "fusion_trtllm", "fusion_mnnvl",
                                          "fusion_cutedsl", "mscclpp", "torch_symm_mem", "nccl_symm_mem", "pcie_ipc")

_NO_FUSION = {"enforce_disable_flashinfer_allreduce_fusion": True}
_NO_CUSTOM = {"disable_custom_all_reduce": True, **_NO_FUSION}

ARM_FLAGS: dict[str, dict[str, object]] = {
    "default": {},
    "no_fusion": _NO_FUSION,
    "nccl": _NO_CUSTOM,
    "fusion_trtllm": {"flashinfer_allreduce_fusion_backend": "trtllm"},
    "fusion_mnnvl": {"flashinfer_allreduce_fusion_backend": "mnnvl"},
    "fusion_cutedsl": {"flashinfer_allreduce_fusion_backend": "cutedsl"},
    # MSCCL++ ranks ahead of custom all-reduce, after fusion: fusion off lets it carry decode.
    "mscclpp": {**_NO_FUSION, "enable_mscclpp": True},
    # Both symmetric-memory paths rank after custom all-reduce, which takes decode's small messages.
    "torch_symm_mem": {**_NO_CUSTOM, "enable_torch_symm_mem": True},
    "nccl_symm_mem": {**_NO_CUSTOM, "enable_symm_mem": True},
    # PCIe-IPC ranks right after custom all-reduce (parallel_state.py:956-975), which would take decode
    # on two PCIe GPUs (the legacy class) and on NVLink: off, so the arm runs PCIe-IPC wherever it is
    # eligible. Fusion stays as SGLang chooses: where it takes decode (sm90/sm100) the arm is default's.
    "pcie_ipc": {"disable_custom_all_reduce": True},
}
"""Each arm's SGLang flags (by SGLang name): the two switches ``EngineConfig`` owns
(``disable_custom_all_reduce``, ``enforce_disable_flashinfer_allreduce_fusion``) and the opt-in
path flags, which travel in ``extra_args`` (``ARM_EXTRA_FLAGS``). An arm's environment is ``ARM_ENV``."""

ARM_ENV: dict[str, dict[str, str]] = {
    "pcie_ipc": {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
}
"""Arms switched on by an environment variable rather than a flag: FlashInfer's PCIe-IPC all-reduce has
only ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` (``sglang/srt/environ.py:1539``). ``Candidate.applied_to`` puts
it in the engine's env, so the env audit expects it in every process as it does the NCCL variables."""

ARM_EXTRA_FLAGS = ("flashinfer_allreduce_fusion_backend", "enable_mscclpp", "enable_torch_symm_mem", "enable_symm_mem")
"""The arm flags an ``EngineConfig`` carries in ``extra_args`` (a spec's ``extra_args`` may not set
them for an arm that sets them too: ``arm_flag_clashes``)."""

ARM_MULTICAST: dict[str, str] = {
    "fusion_mnnvl": "FlashInfer's MNNVL all-reduce allocates NVLink multicast memory (McastGPUBuffer)",
    "mscclpp": "MSCCL++ tunes its NVLS algorithms (NVLink multicast) in where the node supports them",
    "torch_symm_mem": "PyTorch's symmetric-memory all-reduce runs multimem (NVLink multicast) kernels",
    "nccl_symm_mem": "--enable-symm-mem makes SGLang set NCCL_NVLS_ENABLE=1 (NVLink multicast)",
}
"""Arms that turn on NVLink multicast: on a node that could multicast (``arms.multicast_possible``: NVLink, or
not known) refused unless ``search.allow_dangerous`` names the arm, never on shared GPU machines (a program using multicast can take a shared host's GPUs out of service)."""

LEGACY_ARM_NAMES: dict[str, AllReduce] = {"custom": "default"}
"""Arm names of earlier versions (specs, trial records, searcher state) -> today's."""


def canonical_arm(name: str) -> str:
    """Today's name of an all-reduce arm (``custom`` was SGLang's default before it could be fusion)."""
    return LEGACY_ARM_NAMES.get(name, name)


def arm_flags(arm: str) -> dict[str, bool]:
    """The EngineConfig switches of one arm: ``disable_custom_all_reduce`` and
    ``enforce_disable_flashinfer_allreduce_fusion``."""
    flags = ARM_FLAGS[canonical_arm(arm)]
    return {"disable_custom_all_reduce": bool(flags.get("disable_custom_all_reduce")),
            "enforce_disable_flashinfer_allreduce_fusion": bool(flags.get("enforce_disable_flashinfer_allreduce_fusion"))}


def arm_extra_args(arm: str) -> dict[str, object]:
    """The arm's opt-in path flags, as ``extra_args`` entries (empty for the three switch-only arms)."""
    flags = ARM_FLAGS[canonical_arm(arm)]
    return {name: flags[name] for name in ARM_EXTRA_FLAGS if name in flags}


def arm_env(arm: str) -> dict[str, str]:
    """The environment variables the arm sets (empty for the flag-only arms)."""
    return dict(ARM_ENV.get(canonical_arm(arm), {}))


def arm_flag_clashes(arms: "tuple[str, ...] | list[str]", extra_args: Mapping[str, object]) -> dict[str, list[str]]:
    """``extra_args`` flags that arms of ``arms`` set too -> those arms (empty: none clash)."""
    out = {}
    for name in ARM_EXTRA_FLAGS:
        owners = [arm for arm in arms if name in ARM_FLAGS[canonical_arm(arm)]]
        if name in extra_args and owners:
            out[name] = owners
    return out


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


def _sorted_in(name: str, values: tuple[int, ...], low: int, high: int) -> None:
    if list(values) != sorted(set(values)):
        raise ValueError(f"{name} must be sorted and without repeats, got {values}")
    if values and not (low <= values[0] and values[-1] <= high):
        raise ValueError(f"{name} values must lie in [{low}, {high}], got {values[0]}..{values[-1]}")


@dataclass(frozen=True)
class SpeculativeSpace:
    """The valid (num_steps, eagle_topk, num_draft_tokens) points of a product of values, listed
    (SGLang-sized bounds in ``serving.speculative_rules`` keep that at most ~16,000 points).

    Attributes:
        num_steps: Candidate step counts, sorted, without repeats.
        eagle_topk: Candidate top-k values, sorted, without repeats.
        num_draft_tokens: Candidate draft counts for top-k > 1, sorted (top-k 1 is a chain and
            derives its draft count from the steps).
        include_auto: Whether SGLang's own choice (all three unset) is a point too.

    Raises:
        ValueError: values unsorted, repeated or beyond the bounds.
    """

    num_steps: tuple[int, ...] = ()
    eagle_topk: tuple[int, ...] = ()
    num_draft_tokens: tuple[int, ...] = ()
    include_auto: bool = False
    points: tuple[SpeculativeTriple, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _sorted_in("num_steps", self.num_steps, 1, MAX_NUM_STEPS)
        _sorted_in("eagle_topk", self.eagle_topk, 1, MAX_EAGLE_TOPK)
        _sorted_in("num_draft_tokens", self.num_draft_tokens, 2, MAX_NUM_DRAFT_TOKENS)
        points = [AUTO] if self.include_auto else []
        points += [SpeculativeTriple(steps, topk, draft) for steps in self.num_steps for topk in self.eagle_topk
                   for draft in self.draft_choices(num_steps=steps, eagle_topk=topk)]
        object.__setattr__(self, "points", tuple(points))

    def draft_choices(self, *, num_steps: int, eagle_topk: int) -> tuple[int, ...]:
        """The draft counts SGLang accepts with these steps and top-k, ascending: ``num_steps + 1``
        for a chain, else each candidate ``d`` with ``d - 1 <= tree_capacity``."""
        if eagle_topk == 1:
            return (chain_num_draft_tokens(num_steps),)
        most = tree_capacity(num_steps=num_steps, eagle_topk=eagle_topk) + 1
        return tuple(d for d in self.num_draft_tokens if d <= most)

    def topk_choices(self, *, num_steps: int) -> tuple[int, ...]:
        """The top-k values that have at least one valid draft count with these steps."""
        return tuple(k for k in self.eagle_topk if self.draft_choices(num_steps=num_steps, eagle_topk=k))

    def steps_choices(self) -> tuple[int, ...]:
        """The step counts that have at least one valid (top-k, draft count)."""
        return tuple(s for s in self.num_steps if self.topk_choices(num_steps=s))

    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self) -> Iterator[SpeculativeTriple]:
        """Auto first (when included), then by steps, top-k, draft count."""
        return iter(self.points)

    def __contains__(self, triple: object) -> bool:
        return triple in self.points

    def values_used(self) -> tuple[list[int], list[int], list[int]]:
        """The steps, top-k and draft values that appear in at least one point (auto aside)."""
        return _values_used(self.points)

    def values_dropped(self) -> dict[str, list[int]]:
        """Each dimension's listed values that appear in no point (SGLang's rules leave no valid
        combination with them), by the spec's name; empty where every value is used. Draft counts
        given with top-k 1 alone are all dropped: a chain derives its own."""
        steps, topks, _ = self.values_used()
        used = {"num_steps": set(steps), "eagle_topk": set(topks),
                "num_draft_tokens": {t.num_draft_tokens for t in self.points if not t.is_auto and t.eagle_topk > 1}}
        listed = {"num_steps": self.num_steps, "eagle_topk": self.eagle_topk, "num_draft_tokens": self.num_draft_tokens}
        dropped = {name: [v for v in values if v not in used[name]] for name, values in listed.items()}
        return {name: values for name, values in dropped.items() if values}


TREE_RULE = "num_draft_tokens - 1 <= topk + (num_steps - 1) * topk^2"
"""SGLang's rule for a draft tree, as a message states it (``serving.speculative_rules``)."""

AUTO_ONLY = SpeculativeSpace(include_auto=True)
"""The speculative space of a spec that does not search the numbers (or does not speculate)."""

TRIPLE_NAMES = {"num_steps": "num_steps", "eagle_topk": "eagle_topk", "num_draft_tokens": "num_draft_tokens"}
"""The three numbers as a sweep spec names them, for SGLang's rule messages about a listed triple."""


@dataclass(frozen=True)
class SpeculativeList:
    """Exactly the listed (num_steps, eagle_topk, num_draft_tokens) points (``search.speculative.triples``),
    in the listed order, after SGLang's auto choice when ``include_auto``.

    Attributes:
        triples: The points, each valid by SGLang's rules, without repeats.
        include_auto: Whether SGLang's own choice is a point too.
    """

    triples: tuple[SpeculativeTriple, ...] = ()
    include_auto: bool = False

    def __post_init__(self) -> None:
        # Validated specs always satisfy this; it keeps hand-made lists (a replayed grid) honest.
        for triple in self.triples:
            problem = triple_problem(triple)
            if problem:
                raise ValueError(f"({triple.label()}): {problem}")
        if len(set(self.triples)) != len(self.triples):
            raise ValueError(f"repeated triples in {[t.label() for t in self.triples]}")

    def __len__(self) -> int:
        return len(self.triples) + (1 if self.include_auto else 0)

    def __iter__(self) -> Iterator[SpeculativeTriple]:
        """Auto first (when included), then the triples in the listed order."""
        if self.include_auto:
            yield AUTO
        yield from self.triples

    def __contains__(self, triple: object) -> bool:
        if triple == AUTO:
            return self.include_auto
        return triple in self.triples

    def values_used(self) -> tuple[list[int], list[int], list[int]]:
        """The steps, top-k and draft values that appear in at least one listed triple."""
        return _values_used(self.triples)


def _values_used(triples: tuple[SpeculativeTriple, ...]) -> tuple[list[int], list[int], list[int]]:
    listed = [t for t in triples if not t.is_auto]
    steps, topks, drafts = ([getattr(t, name) for t in listed] for name in ("num_steps", "eagle_topk", "num_draft_tokens"))
    return sorted(set(steps)), sorted(set(topks)), sorted(set(drafts))


def triple_problem(triple: SpeculativeTriple) -> str | None:
    """Which of SGLang's rules ``triple`` breaks (``serving.speculative_rules``), in the spec's names."""
    if triple.is_auto:
        return "auto (all three unset) is not a listed triple; use include_auto"
    return speculative_problem(
        num_steps=triple.num_steps, eagle_topk=triple.eagle_topk, num_draft_tokens=triple.num_draft_tokens,
        names=TRIPLE_NAMES,
    )


NcclPreset = Mapping[str, str]
"""One listed set of NCCL variables (``{}``: NCCL's defaults); a variable absent is unset."""


def preset_label(preset: NcclPreset) -> str:
    """``NCCL_ALGO=Ring,NCCL_PROTO=LL`` (by name), or ``default`` for NCCL's defaults."""
    return ",".join(f"{k}={preset[k]}" for k in sorted(preset)) or "default"


@dataclass(frozen=True)
class Candidate:
    """One point of the search space."""

    speculative: SpeculativeTriple
    all_reduce: AllReduce = "default"
    nccl_env: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.speculative, self.all_reduce, tuple(sorted(self.nccl_env.items()))))

    def applied_to(self, template: EngineConfig) -> EngineConfig:
        """``template`` (the spec's engine, ``EngineSpec.template()``) with this point's settings:
        its speculative numbers, its all-reduce arm's switches, flags and environment (``ARM_ENV``),
        its NCCL variables over the template's environment. Validated again, so SGLang's rules hold
        for the result.

        Raises:
            pydantic.ValidationError: the point breaks SGLang's rules (only possible for points
                made by hand, see ``candidate_from_settings``).
        """
        return EngineConfig.model_validate({
            **template.model_dump(), "speculative_num_steps": self.speculative.num_steps,
            "speculative_eagle_topk": self.speculative.eagle_topk,
            "speculative_num_draft_tokens": self.speculative.num_draft_tokens, **arm_flags(self.all_reduce),
            "extra_args": {**template.extra_args, **arm_extra_args(self.all_reduce)},
            "env": {**template.env, **arm_env(self.all_reduce), **self.nccl_env},
        })


@dataclass(frozen=True)
class SearchSpace:
    """Every configuration a sweep may try: speculative points x all-reduce paths x NCCL points.

    Attributes:
        speculative: The speculative points (a product of values, or listed triples).
        all_reduce: The all-reduce paths, in the spec's order.
        nccl_env: NCCL variable -> its choices (``None`` = unset, NCCL's default), in the spec's order.
        nccl_presets: Instead of ``nccl_env``: exactly these sets of NCCL variables, in the spec's
            order (``{}`` = NCCL's defaults). ``None`` when the spec uses ``nccl_env``.
        nccl_arms: The all-reduce arms on which NCCL carries decode's all-reduce, where the NCCL
            settings are searched; the other arms run with NCCL's defaults only. ``None``: every
            arm (the node is not known yet).
    """

    speculative: SpeculativeSpace | SpeculativeList = AUTO_ONLY
    all_reduce: tuple[AllReduce, ...] = ("default",)
    nccl_env: Mapping[str, tuple[Optional[str], ...]] = field(default_factory=dict)
    nccl_presets: tuple[NcclPreset, ...] | None = None
    nccl_arms: tuple[AllReduce, ...] | None = None

    def __post_init__(self) -> None:
        if self.nccl_presets is not None and self.nccl_env:
            raise ValueError("give nccl_env or nccl_presets, not both")

    def searches_nccl(self, arm: str) -> bool:
        """Whether the NCCL settings are searched on ``arm`` (NCCL carries decode there)."""
        return self.nccl_arms is None or arm in self.nccl_arms

    def dimension_sizes(self) -> dict[str, int]:
        """Points per dimension: ``speculative``, ``all_reduce`` and each NCCL variable (sorted),
        or ``nccl_presets`` as one dimension."""
        sizes = {"speculative": len(self.speculative), "all_reduce": len(self.all_reduce)}
        if self.nccl_presets is not None:
            sizes["nccl_presets"] = len(self.nccl_presets)
        sizes.update({name: len(self.nccl_env[name]) for name in sorted(self.nccl_env)})
        return sizes

    def __len__(self) -> int:
        """How many configurations (nothing is listed): speculative points x (for each arm, the
        NCCL points where NCCL carries decode, else one)."""
        sizes = self.dimension_sizes()
        nccl = math.prod(size for name, size in sizes.items() if name not in ("speculative", "all_reduce"))
        per_speculative = sum(nccl if self.searches_nccl(arm) else 1 for arm in self.all_reduce)
        return sizes["speculative"] * per_speculative

    def nccl_points(self) -> Iterator[dict[str, str]]:
        """Every NCCL setting of the space, lazily: the presets in order, or the product of
        ``nccl_env`` by variable name (unset variables absent)."""
        if self.nccl_presets is not None:
            for preset in self.nccl_presets:
                yield dict(preset)
            return
        names = sorted(self.nccl_env)

        def product(i: int, chosen: dict[str, str]) -> Iterator[dict[str, str]]:
            if i == len(names):
                yield dict(chosen)
                return
            for value in self.nccl_env[names[i]]:
                nxt = dict(chosen)
                if value is not None:
                    nxt[names[i]] = value
                yield from product(i + 1, nxt)

        yield from product(0, {})

    def has_nccl_setting(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` is one of ``nccl_points()`` (without listing a product)."""
        if self.nccl_presets is not None:
            return dict(env) in [dict(p) for p in self.nccl_presets]
        if not set(env) <= set(self.nccl_env):
            return False
        return all(env.get(name) in choices for name, choices in self.nccl_env.items())

    def __iter__(self) -> Iterator[Candidate]:
        """Every configuration, lazily, in a stable order (speculative, all-reduce, NCCL)."""
        for triple in self.speculative:
            for all_reduce in self.all_reduce:
                for env in (self.nccl_points() if self.searches_nccl(all_reduce) else iter([{}])):
                    yield Candidate(triple, all_reduce, env)

    def __contains__(self, candidate: object) -> bool:
        """Whether ``candidate`` is one of the points (as ``candidate in set(self)``, without the set)."""
        if not isinstance(candidate, Candidate):
            return False
        if candidate.speculative not in self.speculative or candidate.all_reduce not in self.all_reduce:
            return False
        if not self.searches_nccl(candidate.all_reduce):
            return not candidate.nccl_env
        return self.has_nccl_setting(candidate.nccl_env)


def space_problems(space: SearchSpace) -> Iterator[str]:
    """Why a spec may not use ``space``, each as ``"field: message"``: empty, or beyond the bound."""
    speculative = len(space.speculative)
    searched = isinstance(space.speculative, SpeculativeSpace) and bool(space.speculative.num_steps)
    if speculative == 0 or (searched and not any(not t.is_auto for t in space.speculative)):
        yield (
            "search.speculative: no combination of num_steps, eagle_topk and num_draft_tokens satisfies "
            f"SGLang's rules ({TREE_RULE})"
            + ("; only SGLang's own choice (include_auto) would run, which is no search" if speculative else "")
        )
        return
    total = len(space)
    if total > MAX_CONFIGURATIONS:
        sizes = space.dimension_sizes()
        largest = max(sizes, key=lambda name: sizes[name])
        product = " x ".join(f"{name} {size:,}" for name, size in sizes.items())
        yield (
            f"search: {total:,} configurations ({product}); at most {MAX_CONFIGURATIONS:,} are allowed: "
            f"narrow the largest dimension, {largest}"
        )


# --- what this module needs of a spec (orchestrator.spec.SweepSpec, which imports this module) ---


class HasSearchSpace(Protocol):
    """A spec with a search space (``SweepSpec.space``)."""

    def space(self) -> SearchSpace: ...


class HasSpeculativeSpace(Protocol):
    """A speculative search section (``SpeculativeSpec.space``)."""

    def space(self) -> SpeculativeSpace | SpeculativeList: ...


def speculative_triples(search: HasSpeculativeSpace) -> list[SpeculativeTriple]:
    """Every valid speculative combination of ``search`` (auto included if asked for).

    Lists the points: for a spec's space (bounded by ``MAX_CONFIGURATIONS``) or a small search;
    count with ``len(search.space())``.
    """
    return list(search.space())


def count_candidates(spec: HasSearchSpace) -> int:
    """How many distinct configurations the spec's space holds (counted, not listed)."""
    return len(spec.space())


def iter_candidates(spec: HasSearchSpace) -> Iterator[Candidate]:
    """Every configuration of the space, lazily, in a stable order (speculative, all-reduce, NCCL)."""
    return iter(spec.space())
