"""The ``search`` section of a spec: what a sweep varies (the speculative dimensions, the all-reduce
arms, the NCCL variables or presets) and when it stops a trial early (``early_stopping``).

Every value is checked as written: speculative numbers against SGLang's rules
(``serving.speculative_rules``), NCCL values against NCCL's own sets (``serving.engine.nccl``).
:class:`orchestrator.spec.SweepSpec` holds a :class:`SearchSpec` and checks it against the rest
of the spec.
"""

from __future__ import annotations

from typing import Annotated, Any, Iterator, Optional, Union

from pydantic import (
    AfterValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.space import (
    ALL_REDUCE_ARMS,
    ARM_MULTICAST,
    SpeculativeList,
    SpeculativeSpace,
    SpeculativeTriple,
    canonical_arm,
    triple_problem,
)
from orchestrator.space.points import AllReduce
from orchestrator.validation import StrictModel as _Model
from orchestrator.validation import short_repr, validation_problems
from serving.engine import nccl
from serving.speculative_rules import MAX_EAGLE_TOPK, MAX_NUM_DRAFT_TOKENS, MAX_NUM_STEPS

__all__ = [
    "DANGEROUS_FLAGS",
    "EarlyStoppingSpec",
    "IntRange",
    "MAX_CHOICES",
    "SearchSpec",
    "SpeculativeSpec",
    "dimension_text",
    "dimension_values",
    "socket_thread_problems",
]


DANGEROUS_FLAGS: dict[str, str] = {
    "enable_nccl_nvls": "turns on NVLink multicast (NCCL_NVLS_ENABLE=1); never do this on shared GPU machines",
    "enable_symm_mem": "turns on NVLink multicast (recent SGLang sets NCCL_NVLS_ENABLE=1 with it); never do this "
    "on shared GPU machines",
    "enable_torch_symm_mem": "PyTorch's symmetric-memory all-reduce runs NVLink multicast (multimem) kernels; never "
    "do this on shared GPU machines",
    "enable_mscclpp": "MSCCL++ picks NVLS (NVLink multicast) algorithms where the node supports them; never do this "
    "on shared GPU machines",
}
"""Engine flags spectune refuses unless ``search.allow_dangerous`` names them."""


MAX_CHOICES = 1024
"""The most values one list in a spec may hold (a speculative dimension, an NCCL variable's choices)."""

class IntRange(_Model):
    """An inclusive integer range, ``{low: 1, high: 6}``."""

    low: int = Field(ge=1, description="Smallest value (inclusive).")
    high: int = Field(ge=1, description="Largest value (inclusive).")
    step: int = Field(default=1, ge=1, description="Spacing between values.")

    @model_validator(mode="after")
    def _ordered(self) -> "IntRange":
        if self.high < self.low:
            raise ValueError(f"high={self.high} is below low={self.low}")
        return self

    def values(self) -> list[int]:
        """Every value in the range (bounded by the dimension's limits before this is called)."""
        return list(range(self.low, self.high + 1, self.step))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dimension_parser(*, low: int, high: int) -> Any:
    """The validator of one speculative dimension whose values must lie in ``[low, high]``: a
    number, a list of numbers or ``{low, high[, step]}``, bounds checked as written (never listed)."""
    allowed = f"a number, a list of numbers or {{low, high}} with values in [{low}, {high}]"

    def outside(value: int) -> bool:
        return not low <= value <= high

    def parse(value: Any) -> "int | list[int] | IntRange":
        if isinstance(value, dict):
            try:
                value = IntRange.model_validate(value)
            except ValidationError as exc:
                raise ValueError("\n".join(str(p) for p in validation_problems(exc, model=IntRange))) from None
        if isinstance(value, IntRange):
            ends = [f"{name}={getattr(value, name)}" for name in ("low", "high") if outside(getattr(value, name))]
            if ends:
                verb = "is" if len(ends) == 1 else "are"
                raise ValueError(f"{' and '.join(ends)} {verb} outside [{low}, {high}]")
            return value
        if _is_int(value):
            if outside(value):
                raise ValueError(f"{short_repr(value)} is outside [{low}, {high}]")
            return value
        if isinstance(value, list) and value and all(_is_int(v) for v in value):
            if len(value) > MAX_CHOICES:
                raise ValueError(f"{len(value)} values; at most {MAX_CHOICES} are allowed")
            bad = list(dict.fromkeys(v for v in value if outside(v)))
            if bad:
                shown = ", ".join(short_repr(v) for v in bad[:MAX_SHOWN]) + (", ..." if len(bad) > MAX_SHOWN else "")
                raise ValueError(f"{shown} {'is' if len(bad) == 1 else 'are'} outside [{low}, {high}]")
            return list(value)
        raise ValueError(f"must be {allowed}, got {short_repr(value)}")

    return parse


def _dimension(*, low: int, high: int) -> Any:
    """An integer dimension type: a fixed value, a list of choices, or a range, in ``[low, high]``."""
    number = {"type": "integer", "minimum": low, "maximum": high}
    return Annotated[
        Union[int, list[int], IntRange],
        PlainValidator(_dimension_parser(low=low, high=high)),
        PlainSerializer(lambda v: v.model_dump() if isinstance(v, IntRange) else v),
        WithJsonSchema(
            {
                "anyOf": [
                    number,
                    {"type": "array", "items": number, "minItems": 1, "maxItems": MAX_CHOICES},
                    {"type": "object", "properties": {"low": number, "high": number, "step": {"type": "integer"}}},
                ]
            }
        ),
    ]


StepsDimension = _dimension(low=1, high=MAX_NUM_STEPS)
TopkDimension = _dimension(low=1, high=MAX_EAGLE_TOPK)
DraftDimension = _dimension(low=2, high=MAX_NUM_DRAFT_TOKENS)
IntDimension = Union[int, list[int], IntRange]
"""A fixed value, a list of choices, or a range (validated per dimension by the types above)."""


def dimension_values(dim: IntDimension) -> list[int]:
    """The candidate values of one integer dimension, sorted and without repeats."""
    if isinstance(dim, IntRange):
        return dim.values()
    if isinstance(dim, int):
        return [dim]
    return sorted(set(dim))


MAX_SHOWN = 8
"""Values of one listed dimension shown by ``dimension_text`` before the rest are counted."""


def dimension_text(dim: IntDimension) -> str:
    """One integer dimension as the spec wrote it: ``3``, a list ``[4, 6, 8]`` in its own order
    (the first ``MAX_SHOWN`` and ``... (+N more)``), a range ``2-8`` or ``1-9 step 2``; never the
    values the space derives from it (``spectune validate``'s summary; what SGLang's rules drop is
    ``SweepSpec.warnings``')."""
    if isinstance(dim, IntRange):
        return f"{dim.low}-{dim.high}" + (f" step {dim.step}" if dim.step != 1 else "")
    if isinstance(dim, int):
        return str(dim)
    shown = ", ".join(map(str, dim[:MAX_SHOWN]))
    return f"[{shown}" + (f", ... (+{len(dim) - MAX_SHOWN} more)]" if len(dim) > MAX_SHOWN else "]")


def _triples(value: Any) -> list[list[int]]:
    """``search.speculative.triples``: a non-empty list of ``[num_steps, eagle_topk, num_draft_tokens]``,
    each valid by SGLang's rules (``serving.speculative_rules``), without repeats."""
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"must be a non-empty list of [num_steps, eagle_topk, num_draft_tokens], got {short_repr(value)}"
        )
    if len(value) > MAX_CHOICES:
        raise ValueError(f"{len(value)} triples; at most {MAX_CHOICES} are allowed")
    seen: set[tuple[int, ...]] = set()
    problems = []
    for i, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 3 and all(_is_int(v) for v in item)):
            problems.append(f"[{i}] = {short_repr(item)}: a triple is [num_steps, eagle_topk, num_draft_tokens], "
                            "three integers")
            continue
        problem = triple_problem(SpeculativeTriple(*item))
        if problem:
            problems.append(f"[{i}] = {item}: {problem}")
        elif tuple(item) in seen:
            problems.append(f"[{i}] = {item} is listed twice")
        seen.add(tuple(item))
    if problems:  # every bad triple at once, one line each
        raise ValueError("\n".join(problems))
    return [list(item) for item in value]


TripleList = Annotated[
    list[list[int]],
    PlainValidator(_triples),
    WithJsonSchema({"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
                    "items": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}}),
]


class SpeculativeSpec(_Model):
    """The speculative dimensions: each a fixed value, a list, or ``{low, high}``; or exact ``triples``.

    With ``eagle_topk`` 1 ``num_draft_tokens`` is ``num_steps + 1`` (derived); for larger top-k,
    draft-token values the tree cannot hold are skipped.
    """

    num_steps: Optional[StepsDimension] = Field(
        default=None, description=f"--speculative-num-steps values, in [1, {MAX_NUM_STEPS}] (or use triples)."
    )
    eagle_topk: TopkDimension = Field(
        default=1, description=f"--speculative-eagle-topk values, in [1, {MAX_EAGLE_TOPK}]."
    )
    num_draft_tokens: Optional[DraftDimension] = Field(
        default=None,
        description=f"--speculative-num-draft-tokens values for top-k > 1, in [2, {MAX_NUM_DRAFT_TOKENS}] "
        "(derived for top-k 1).",
    )
    triples: Optional[TripleList] = Field(
        default=None,
        description="Instead of the three dimensions: exactly these [num_steps, eagle_topk, num_draft_tokens] "
        "points, each checked against SGLang's rules.",
    )
    include_auto: bool = Field(
        default=False, description="Also try SGLang's own choice (all three numbers unset)."
    )

    @model_validator(mode="after")
    def _dimensions(self) -> "SpeculativeSpec":
        if self.triples is not None:
            both = sorted({"num_steps", "eagle_topk", "num_draft_tokens"} & self.model_fields_set)
            if both:
                raise ValueError(f"give triples or {', '.join(both)}, not both: triples lists the exact points")
            return self
        problems = []
        if self.num_steps is None:
            problems.append("num_steps is required (or list the exact points in triples)")
        if self.num_draft_tokens is None and any(k > 1 for k in dimension_values(self.eagle_topk)):
            problems.append("num_draft_tokens is required when eagle_topk has values above 1")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """With ``triples``, leave the three dimensions out of the dump, so that
        ``model_validate(model_dump())`` gives the same spec back."""
        data = handler(self)
        if self.triples is not None:
            for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
                data.pop(name, None)
        return data

    def values_text(self) -> str:
        """The three dimensions as written (``dimension_text``), the draft count's rule for top-k 1
        said where top-k 1 is searched: ``steps [1, 2, 3]; topk [1, 2]; draft 4-8 (top-k 1: steps + 1)``.
        With ``triples``: empty (the caller lists the triples)."""
        if self.triples is not None:
            return ""
        assert self.num_steps is not None
        chain = 1 in dimension_values(self.eagle_topk)
        if self.num_draft_tokens is None:
            draft = "steps + 1"
        else:
            draft = dimension_text(self.num_draft_tokens) + (" (top-k 1: steps + 1)" if chain else "")
        return f"steps {dimension_text(self.num_steps)}; topk {dimension_text(self.eagle_topk)}; draft {draft}"

    def space(self) -> SpeculativeSpace | SpeculativeList:
        """The valid (num_steps, eagle_topk, num_draft_tokens) points (see ``orchestrator.space``)."""
        if self.triples is not None:
            return SpeculativeList(
                triples=tuple(SpeculativeTriple(*t) for t in self.triples), include_auto=self.include_auto
            )
        assert self.num_steps is not None
        drafts = dimension_values(self.num_draft_tokens) if self.num_draft_tokens is not None else []
        return SpeculativeSpace(
            num_steps=tuple(dimension_values(self.num_steps)),
            eagle_topk=tuple(dimension_values(self.eagle_topk)),
            num_draft_tokens=tuple(drafts),
            include_auto=self.include_auto,
        )


def _nccl_choice(value: Any) -> "str | int | None":
    """One NCCL value as written: a string, an integer, or null (NCCL's default); never a boolean."""
    if value is None or isinstance(value, str) or _is_int(value):
        return value
    raise ValueError(f"must be a string, an integer or null (NCCL's default), got {short_repr(value)}")


def _nccl_preset(preset: dict[str, Any]) -> dict[str, str]:
    """One listed set of NCCL variables, each value checked and normalised, unset ones dropped."""
    settings = {name: nccl.searched_value(name, choice) for name, choice in preset.items()}
    return {name: value for name, value in settings.items() if value is not None}


def socket_thread_problems(env: dict[str, str], search: "SearchSpec") -> Iterator[str]:
    """NCCL caps NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD at ``nccl.SOCKETS_LIMIT`` (lowering the
    sockets with a warning): a point above it would run another setting than the one recorded."""
    names = ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD")
    if search.nccl_presets is not None:
        points = [(f"search.nccl_presets.{i}", dict(p)) for i, p in enumerate(search.nccl_presets)]
    else:  # the largest values searched meet in one point of the product
        points = [("search.nccl_env", {n: str(max(int(v) for v in search.nccl_env[n] if v is not None))
                                       for n in names if any(v is not None for v in search.nccl_env.get(n, ()))})]
    for where, point in points:
        shown = [(point[n], f"{where}.{n}") if n in point else (env.get(n), f"engine.env.{n}") for n in names]
        if all(value for value, _ in shown) and int(shown[0][0]) * int(shown[1][0]) > nccl.SOCKETS_LIMIT:
            (threads, threads_at), (sockets, sockets_at) = shown
            yield (f"{sockets_at}: NCCL_SOCKET_NTHREADS={threads} ({threads_at}) x NCCL_NSOCKS_PERTHREAD={sockets} "
                   f"exceeds NCCL's limit of {nccl.SOCKETS_LIMIT} sockets: NCCL lowers the sockets per thread to "
                   f"{nccl.SOCKETS_LIMIT // int(threads)}, so that trial would measure another setting than it "
                   f"records; keep the product at most {nccl.SOCKETS_LIMIT}")


NcclChoice = Annotated[
    Union[str, int, None],
    PlainValidator(_nccl_choice),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
]
"""One value an NCCL variable may take in the search (checked against NCCL's own set later)."""

NcclPresetSpec = Annotated[dict[str, NcclChoice], AfterValidator(_nccl_preset)]
"""One entry of ``search.nccl_presets``: variable -> value, ``{}`` for NCCL's defaults."""


class EarlyStoppingSpec(_Model):
    """ASHA over benchmark repetitions: a trial clearly behind the others after ``grace_repetitions``
    is stopped (it is then recorded as early_stopped and can never be the best). Baselines are
    never stopped."""

    enabled: bool = Field(default=True, description="Stop hopeless trials early (Ray Tune's ASHAScheduler).")
    grace_repetitions: int = Field(
        default=1, ge=1, le=100, description="Repetitions every trial runs before it may be stopped."
    )
    reduction_factor: float = Field(
        default=2.0, gt=1, le=16, description="ASHA's reduction factor: keep the best 1/factor at each rung."
    )


class SearchSpec(_Model):
    """What the sweep varies."""

    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative dimensions; omit to use SGLang's auto choice only."
    )
    all_reduce: list[AllReduce] = Field(
        default_factory=lambda: ["default"],
        description="All-reduce arms: 'default' = SGLang's own choice (custom all-reduce, or FlashInfer fusion where "
        "SGLang turns it on); 'no_fusion' adds --enforce-disable-flashinfer-allreduce-fusion; 'nccl' adds that and "
        "--disable-custom-all-reduce ('custom' is read as 'default'); 'fusion_trtllm' / 'fusion_mnnvl' / "
        "'fusion_cutedsl' give --flashinfer-allreduce-fusion-backend; 'mscclpp' (--enable-mscclpp, fusion off), "
        "'torch_symm_mem' (--enable-torch-symm-mem) and 'nccl_symm_mem' (--enable-symm-mem), the last two with custom "
        "all-reduce and fusion off; 'pcie_ipc' (FlashInfer's PCIe-IPC all-reduce: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 "
        "in the engine's env, custom all-reduce off). Arms that run one kernel on the node are measured once, arms SGLang refuses there "
        "are left out; fusion_mnnvl, mscclpp, torch_symm_mem and nccl_symm_mem use NVLink multicast and must be named "
        "in allow_dangerous.",
    )
    nccl_env: dict[str, Annotated[list[NcclChoice], Field(max_length=MAX_CHOICES)]] = Field(
        default_factory=dict,
        description="NCCL variable -> values to try; null or 'default' means unset (NCCL's own choice).",
    )
    nccl_presets: Optional[Annotated[list[NcclPresetSpec], Field(min_length=1, max_length=MAX_CHOICES)]] = Field(
        default=None,
        description="Instead of nccl_env: exactly these sets of NCCL variables, e.g. [{}, {NCCL_ALGO: Ring, "
        "NCCL_PROTO: LL}]; {} (NCCL's defaults) must be among them, a variable absent (or null) is unset.",
    )
    allow_dangerous: list[str] = Field(
        default_factory=list,
        description="Dangerous settings to allow anyway: 'NCCL_X=VALUE', 'NCCL_X' (all values), the engine flags "
        "'enable_nccl_nvls' / 'enable_symm_mem' / 'enable_torch_symm_mem' / 'enable_mscclpp', or the NVLink-multicast "
        "all-reduce arms 'fusion_mnnvl' / 'mscclpp' / 'torch_symm_mem' / 'nccl_symm_mem'. Only on GPUs nobody shares.",
    )
    seed: int = Field(
        default=0, ge=0, le=2**32 - 1, description="Seed of the sampler: the same spec and seed propose the same trials."
    )
    early_stopping: EarlyStoppingSpec = Field(
        default_factory=EarlyStoppingSpec, description="Stop hopeless trials after a few repetitions (ASHA)."
    )

    @field_validator("all_reduce", mode="before")
    @classmethod
    def _legacy_arms(cls, value: Any) -> Any:
        return [canonical_arm(v) if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @field_validator("all_reduce")
    @classmethod
    def _all_reduce(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"give at least one of {', '.join(repr(a) for a in ALL_REDUCE_ARMS)}")
        if len(set(value)) != len(value):
            raise ValueError(f"repeated values in {value}")
        return value

    @field_validator("nccl_env", mode="after")
    @classmethod
    def _nccl_env(cls, value: dict[str, list[Any]]) -> dict[str, list[str | None]]:
        out: dict[str, list[str | None]] = {}
        problems = []  # every variable's, one line each ("NAME: ...", filed under nccl_env.NAME)
        for name, choices in value.items():
            if not choices:
                problems.append(f"{name}: give at least one value")
                continue
            normalised, bad = [], []
            for choice in choices:
                try:
                    normalised.append(nccl.searched_value(name, choice))
                except ValueError as exc:
                    bad.append(str(exc))
            if bad:  # each bad value of the variable (a name that is no NCCL variable: once)
                problems.extend(dict.fromkeys(bad))
                continue
            if None not in normalised:
                problems.append(
                    f"{name}: the choices {short_repr(choices)} leave out NCCL's default; add null (or 'default') — "
                    "NCCL's default is often the best, and a forced setting must beat it measurably. "
                    "To force one value for every trial, put it in engine.env instead"
                )
            elif len(set(normalised)) != len(normalised):
                problems.append(f"{name}: repeated values in {short_repr(choices)}")
            out[name] = normalised
        if problems:
            raise ValueError("\n".join(problems))
        return out

    @field_validator("nccl_presets", mode="after")
    @classmethod
    def _nccl_presets(cls, value: list[dict[str, str]] | None) -> list[dict[str, str]] | None:
        if value is None:
            return None
        problems = [f"preset {i} ({short_repr(preset)}) repeats preset {value.index(preset)}"
                    for i, preset in enumerate(value) if preset in value[:i]]
        problems += [f"preset {i}: {line}" for i, preset in enumerate(value) for line in nccl.conflicts(preset)]
        if {} not in value:
            problems.append(
                "the presets leave out NCCL's defaults; add {} — NCCL's default is often the best, and a forced "
                "setting must beat it measurably. To force one setting for every trial, put it in engine.env instead"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return value

    @model_validator(mode="after")
    def _one_nccl_form(self) -> "SearchSpec":
        if self.nccl_presets is not None and self.nccl_env:
            raise ValueError("give nccl_env (values per variable) or nccl_presets (exact sets), not both")
        return self

    def nccl_settings(self) -> Iterator[tuple[str, str, str | None]]:
        """Every ``(field, variable, value)`` the search may set, ``None`` for unset, with the spec field
        that holds it (``search.nccl_env.NCCL_ALGO`` or ``search.nccl_presets.2.NCCL_ALGO``): what the
        spec's cross-checks (danger, engine.env overlap) judge, whichever form the spec uses."""
        for name, choices in self.nccl_env.items():
            for choice in choices:
                yield f"search.nccl_env.{name}", name, choice
        for i, preset in enumerate(self.nccl_presets or ()):
            for name, choice in preset.items():
                yield f"search.nccl_presets.{i}.{name}", name, choice

    def nccl_variables(self) -> list[str]:
        """The NCCL variables the search varies, sorted (either form)."""
        return sorted({name for _, name, _ in self.nccl_settings()})

    @field_validator("allow_dangerous")
    @classmethod
    def _allow_dangerous(cls, value: list[str]) -> list[str]:
        out, problems = [], []
        for item in value:
            name, _, setting = item.partition("=")
            name = name.strip()
            if (name in DANGEROUS_FLAGS or name in ARM_MULTICAST) and not setting:
                out.append(name)
                continue
            if name not in nccl.NCCL_VARIABLES or not nccl.NCCL_VARIABLES[name].dangerous:
                dangerous = sorted([*(n for n, v in nccl.NCCL_VARIABLES.items() if v.dangerous), *DANGEROUS_FLAGS,
                                    *ARM_MULTICAST])
                problems.append(f"{item!r}: only {', '.join(dangerous)} can be dangerous")
                continue
            out.append(f"{name}={nccl.normalise_value(name, setting)}" if setting else name)
        if problems:  # every bad item at once
            raise ValueError("\n".join(problems))
        return out

    def is_allowed(self, name: str, value: str) -> bool:
        """Whether the spec allows the dangerous setting ``name=value``."""
        return name in self.allow_dangerous or f"{name}={value}" in self.allow_dangerous
