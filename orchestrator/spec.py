"""SweepSpec: the validated YAML that says what to tune, how to measure it and within what budget.

A spec is checked completely before anything starts: unknown keys, wrong types, NCCL values NCCL
does not document, dangerous NCCL values that were not allowed by name, variables SGLang manages
itself, and SGLang's speculative rules. Every problem names its field, the value and what is
allowed. Loading has no side effects (no ports, no GPUs, no files written).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from orchestrator.errors import SpecError, SpecProblem
from serving.engine import nccl
from serving.engine.config import (
    EngineConfig,
    EngineKind,
    FlagValue,
    speculative_problem,
    validated_extra_args,
)

__all__ = [
    "BenchmarkSpec",
    "BudgetSpec",
    "EngineSpec",
    "IntRange",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SearchSpec",
    "SloSpec",
    "SpeculativeSearch",
    "SweepSpec",
    "TrackingSpec",
    "OBJECTIVE_METRICS",
]

DEFAULT_VALUE_WORDS = ("default", "unset")
"""Spellings (besides YAML null) of "leave this variable unset: NCCL's own choice"."""

OBJECTIVE_METRICS: dict[str, Literal["max", "min"]] = {
    "output_tok_per_s": "max",
    "request_per_s": "max",
    "accept_length": "max",
    "ttft_ms_p50": "min",
    "ttft_ms_p99": "min",
    "tpot_ms_p50": "min",
    "tpot_ms_p99": "min",
    "e2e_ms_p50": "min",
    "e2e_ms_p99": "min",
    "cycle_ms": "min",
}
"""Metrics a sweep can optimise, with the direction that means "better"."""


DANGEROUS_FLAGS: dict[str, str] = {
    "enable_nccl_nvls": "turns on NVLink multicast (NCCL_NVLS_ENABLE=1); never do this on shared GPU machines",
    "enable_symm_mem": "turns on NVLink multicast (recent SGLang sets NCCL_NVLS_ENABLE=1 with it); never do this "
    "on shared GPU machines",
}
"""Engine flags spectune refuses unless ``search.allow_dangerous`` names them."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
        """Every value in the range."""
        return list(range(self.low, self.high + 1, self.step))


def _parse_dimension(value: Any) -> "int | list[int] | IntRange":
    """Accept a number, a list of numbers or ``{low, high[, step]}``, with one clear error otherwise."""
    if isinstance(value, IntRange):
        return value
    if isinstance(value, bool):
        raise ValueError(f"must be a number, a list of numbers or {{low, high}}, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if isinstance(value, dict):
        return IntRange.model_validate(value)
    raise ValueError(f"must be a number, a list of numbers or {{low, high}}, got {value!r}")


IntDimension = Annotated[
    Union[int, list[int], IntRange],
    PlainValidator(_parse_dimension),
    PlainSerializer(lambda v: v.model_dump() if isinstance(v, IntRange) else v),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}},
                              {"type": "object", "properties": {"low": {"type": "integer"},
                                                                "high": {"type": "integer"},
                                                                "step": {"type": "integer"}}}]}),
]
"""A fixed value, a list of choices, or a range."""


def dimension_values(dim: IntDimension) -> list[int]:
    """The candidate values of one integer dimension, sorted and without repeats."""
    if isinstance(dim, IntRange):
        return dim.values()
    if isinstance(dim, int):
        return [dim]
    return sorted(set(dim))


def _check_dimension(dim: IntDimension, *, minimum: int, name: str) -> IntDimension:
    values = dimension_values(dim)
    if not values:
        raise ValueError(f"{name} has no values; give a number, a list or {{low, high}}")
    if values[0] < minimum:
        raise ValueError(f"{name} values must be >= {minimum}, got {values[0]}")
    return dim


def _spec_field_for(owner: str) -> str:
    """Where in a spec the user sets what engine field ``owner`` holds."""
    return {
        "speculative_draft_model_path": "engine.draft_model_path",
        "disable_custom_all_reduce": "search.all_reduce",
        "(chosen at launch)": "nothing (spectune picks host and port at launch)",
    }.get(owner, f"engine.{owner} or search.speculative")


class EngineSpec(_Model):
    """The part of the engine configuration every trial shares."""

    kind: EngineKind = Field(description="'sglang' (GPUs) or 'reference' (the CPU/GPU reference engine).")
    model_path: str = Field(min_length=1, description="--model-path: HF repo/path, or a reference preset name.")
    draft_model_path: str | None = Field(
        default=None, description="--speculative-draft-model-path: the EAGLE draft head."
    )
    speculative_algorithm: Literal["EAGLE", "EAGLE3"] | None = Field(
        default="EAGLE3", description="--speculative-algorithm; null runs without speculative decoding."
    )
    tp_size: int = Field(default=1, ge=1, le=64, description="--tp-size: tensor-parallel ranks (GPUs per engine).")
    extra_args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="Further engine flags by SGLang name (mem_fraction_static: 0.85, trust_remote_code: true).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Fixed environment for every trial's engine and its workers (e.g. NCCL_DEBUG: WARN).",
    )

    @field_validator("extra_args", mode="before")
    @classmethod
    def _flags(cls, value: Any) -> Any:
        return validated_extra_args(value, use_instead=_spec_field_for)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        return nccl.validated_env(value)

    @model_validator(mode="after")
    def _draft(self) -> "EngineSpec":
        if self.speculative_algorithm and not self.draft_model_path:
            raise ValueError(
                f"speculative_algorithm={self.speculative_algorithm} needs draft_model_path "
                "(or set speculative_algorithm: null to run without speculation)"
            )
        return self


class SpeculativeSearch(_Model):
    """The speculative dimensions. Each is a fixed value, a list, or ``{low, high}``.

    With ``eagle_topk`` 1 the draft is a chain and ``num_draft_tokens`` is ``num_steps + 1``
    (derived, not searched); for larger top-k, draft-token values the tree cannot hold are skipped.
    """

    num_steps: IntDimension = Field(description="--speculative-num-steps values.")
    eagle_topk: IntDimension = Field(default=1, description="--speculative-eagle-topk values.")
    num_draft_tokens: IntDimension | None = Field(
        default=None,
        description="--speculative-num-draft-tokens values for top-k > 1 (derived for top-k 1).",
    )
    include_auto: bool = Field(
        default=False, description="Also try SGLang's own choice (all three numbers unset)."
    )

    @model_validator(mode="after")
    def _dimensions(self) -> "SpeculativeSearch":
        _check_dimension(self.num_steps, minimum=1, name="num_steps")
        _check_dimension(self.eagle_topk, minimum=1, name="eagle_topk")
        if self.num_draft_tokens is not None:
            _check_dimension(self.num_draft_tokens, minimum=2, name="num_draft_tokens")
        elif any(k > 1 for k in dimension_values(self.eagle_topk)):
            raise ValueError("num_draft_tokens is required when eagle_topk has values above 1")
        return self

    def triples(self) -> list[tuple[int | None, int | None, int | None]]:
        """Every valid (num_steps, eagle_topk, num_draft_tokens), with (None, None, None) for auto.

        Top-k 1 derives draft = steps + 1 (the draft dimension does not apply to chains); larger
        top-k values take each draft value the tree can hold (SGLang's rules, see
        ``serving.engine.config.speculative_problem``).
        """
        found: list[tuple[int | None, int | None, int | None]] = [(None, None, None)] if self.include_auto else []
        draft_values = dimension_values(self.num_draft_tokens) if self.num_draft_tokens is not None else []
        for steps in dimension_values(self.num_steps):
            for topk in dimension_values(self.eagle_topk):
                for draft in [steps + 1] if topk == 1 else draft_values:
                    if speculative_problem(num_steps=steps, topk=topk, num_draft_tokens=draft) is None:
                        found.append((steps, topk, draft))
        return found


class SearchSpec(_Model):
    """What the sweep varies."""

    speculative: SpeculativeSearch | None = Field(
        default=None, description="Speculative dimensions; omit to use SGLang's auto choice only."
    )
    all_reduce: list[Literal["custom", "nccl"]] = Field(
        default_factory=lambda: ["custom"],
        description="'custom' = SGLang's custom all-reduce (default); 'nccl' adds --disable-custom-all-reduce.",
    )
    nccl_env: dict[str, list[Union[str, int, None]]] = Field(
        default_factory=dict,
        description="NCCL variable -> values to try; null or 'default' means unset (NCCL's own choice).",
    )
    allow_dangerous: list[str] = Field(
        default_factory=list,
        description="Dangerous settings to allow anyway: 'NCCL_X=VALUE', 'NCCL_X' (all values), or the engine flags "
        "'enable_nccl_nvls' / 'enable_symm_mem'.",
    )

    @field_validator("all_reduce")
    @classmethod
    def _all_reduce(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one of 'custom', 'nccl'")
        if len(set(value)) != len(value):
            raise ValueError(f"repeated values in {value}")
        return value

    @field_validator("nccl_env", mode="after")
    @classmethod
    def _nccl_env(cls, value: dict[str, list[Any]]) -> dict[str, list[str | None]]:
        out: dict[str, list[str | None]] = {}
        for name, choices in value.items():
            if not choices:
                raise ValueError(f"{name}: give at least one value")
            normalised: list[str | None] = []
            for choice in choices:
                if choice is None or str(choice).strip().lower() in DEFAULT_VALUE_WORDS:
                    normalised.append(None)
                    continue
                problem = nccl.check_value(name, str(choice))
                if problem:
                    raise ValueError(f"{name}: {problem}")
                normalised.append(nccl.normalise_value(name, str(choice)))
            if None not in normalised:
                raise ValueError(
                    f"{name}: the choices {choices} leave out NCCL's default; add null (or 'default') — "
                    "NCCL's default is often the best, and a forced setting must beat it measurably. "
                    "To force one value for every trial, put it in engine.env instead"
                )
            if len(set(normalised)) != len(normalised):
                raise ValueError(f"{name}: repeated values in {choices}")
            out[name] = normalised
        return out

    @field_validator("allow_dangerous")
    @classmethod
    def _allow_dangerous(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            name, _, setting = item.partition("=")
            name = name.strip()
            if name in DANGEROUS_FLAGS and not setting:
                out.append(name)
                continue
            if name not in nccl.NCCL_VARIABLES or not nccl.NCCL_VARIABLES[name].dangerous:
                dangerous = sorted([*(n for n, v in nccl.NCCL_VARIABLES.items() if v.dangerous), *DANGEROUS_FLAGS])
                raise ValueError(f"{item!r}: only {', '.join(dangerous)} can be dangerous")
            out.append(f"{name}={nccl.normalise_value(name, setting)}" if setting else name)
        return out

    def is_allowed(self, name: str, value: str) -> bool:
        """Whether the spec allows the dangerous setting ``name=value``."""
        return name in self.allow_dangerous or f"{name}={value}" in self.allow_dangerous


class SloSpec(_Model):
    """Service-level limits; a trial that breaks one is infeasible whatever its throughput."""

    ttft_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 time to first token (ms).")
    tpot_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 time per output token (ms).")
    e2e_ms_p99: float | None = Field(default=None, gt=0, description="Limit on p99 end-to-end latency (ms).")


class ObjectiveSpec(_Model):
    """What "best" means."""

    metric: str = Field(default="output_tok_per_s", description=f"One of {', '.join(OBJECTIVE_METRICS)}.")
    mode: Literal["max", "min"] | None = Field(
        default=None, description="max or min; defaults to the metric's natural direction."
    )
    concurrency: int | None = Field(
        default=None, ge=1, description="Concurrency level whose result is the objective (default: the highest)."
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="Optional latency limits.")

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if value not in OBJECTIVE_METRICS:
            close = difflib.get_close_matches(value, OBJECTIVE_METRICS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown metric {value!r}{hint}; allowed: {', '.join(OBJECTIVE_METRICS)}")
        return value

    @model_validator(mode="after")
    def _direction(self) -> "ObjectiveSpec":
        natural = OBJECTIVE_METRICS[self.metric]
        if self.mode is not None and self.mode != natural:
            raise ValueError(
                f"mode={self.mode} would make {self.metric} worse as it 'improves'; use mode: {natural} (or omit it)"
            )
        return self

    @property
    def direction(self) -> Literal["max", "min"]:
        """The resolved optimisation direction."""
        return self.mode or OBJECTIVE_METRICS[self.metric]


class BenchmarkSpec(_Model):
    """How each trial is measured (see orchestrator/bench for the metric definitions)."""

    dataset: Literal["builtin", "sharegpt", "random"] = Field(
        default="builtin", description="Prompt source: the shipped prompt set, a ShareGPT JSON file, or random."
    )
    dataset_path: str | None = Field(default=None, description="Path of the ShareGPT-format JSON file.")
    allow_random_prompts: bool = Field(
        default=False,
        description="Allow tuning on random prompts (speculation looks better on them than on real text).",
    )
    random_input_len: int = Field(default=128, ge=1, description="Prompt length (words) for random prompts.")
    num_prompts: int = Field(default=32, ge=1, le=100_000, description="Prompts per repetition and concurrency level.")
    output_len: int = Field(default=128, ge=1, le=65_536, description="max_new_tokens per request.")
    concurrency: list[int] = Field(default_factory=lambda: [1, 8], description="Closed-loop concurrency levels.")
    request_rate: float | None = Field(default=None, gt=0, description="Open-loop requests/s (instead of closed loop).")
    warmup_requests: int = Field(default=4, ge=0, description="Requests sent and discarded before measuring.")
    repetitions: int = Field(default=3, ge=1, le=100, description="Measured repetitions per concurrency level.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature (0 = greedy).")
    seed: int = Field(default=0, ge=0, description="Sampling and prompt-selection seed.")
    request_timeout_s: float = Field(default=300.0, gt=0, description="Per-request timeout.")

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("give at least one concurrency level")
        if any(c < 1 for c in value):
            raise ValueError(f"concurrency levels must be >= 1, got {value}")
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


class BudgetSpec(_Model):
    """How much the sweep may spend."""

    num_trials: int = Field(default=20, ge=1, le=10_000, description="Trials to run in total.")
    max_concurrent_trials: int = Field(default=1, ge=1, description="Trials running at once (each owns its GPUs).")
    time_limit_s: float | None = Field(default=None, gt=0, description="Stop starting trials after this many seconds.")
    trial_timeout_s: float = Field(default=3600.0, gt=0, description="A trial running longer is stopped and failed.")
    engine_start_timeout_s: float = Field(default=1800.0, gt=0, description="Time an engine may take to become healthy.")


class ResourcesSpec(_Model):
    """What one trial reserves from Ray."""

    gpus_per_trial: int | None = Field(default=None, ge=0, description="GPUs per trial (default: engine.tp_size).")
    cpus_per_trial: float = Field(default=1.0, gt=0, description="CPUs for the trial's driver bundle.")


class TrackingSpec(_Model):
    """Where results go."""

    mlflow_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default: sqlite:///<results_dir>/mlflow.db)."
    )
    experiment_name: str | None = Field(default=None, description="MLflow experiment (default: the spec's name).")


class SweepSpec(_Model):
    """A whole sweep: engine template, search space, objective, benchmark, budget, resources, tracking."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100, description="Sweep name (file-name safe).")
    description: str = Field(default="", description="Free text for humans.")
    engine: EngineSpec = Field(description="What every trial's engine shares.")
    search: SearchSpec = Field(default_factory=SearchSpec, description="What the sweep varies.")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What 'best' means.")
    benchmark: BenchmarkSpec = Field(default_factory=BenchmarkSpec, description="How each trial is measured.")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="How much the sweep may spend.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="What one trial reserves.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Where results go.")
    results_dir: str = Field(default="results", description="Directory for results, best config and the MLflow DB.")

    @model_validator(mode="after")
    def _cross_checks(self) -> "SweepSpec":
        problems = list(self._cross_problems())
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _cross_problems(self) -> Iterator[str]:
        """Rules that span sections, each as "field: message"."""
        engine, search = self.engine, self.search
        if search.speculative is not None and not engine.speculative_algorithm:
            yield "search.speculative: set, but engine.speculative_algorithm is null; remove one of them"
        for name in search.nccl_env:
            if name in engine.env:
                yield f"search.nccl_env.{name}: also fixed in engine.env.{name}; keep one"
        for name, choices in search.nccl_env.items():
            for value in choices:
                reason = value is not None and nccl.danger_of(name, value)
                if reason and not search.is_allowed(name, value):
                    yield (
                        f"search.nccl_env.{name}: {value!r} is dangerous ({reason}); remove it or add "
                        f"'{name}={value}' to search.allow_dangerous"
                    )
        for flag, reason in DANGEROUS_FLAGS.items():
            if engine.extra_args.get(flag) and flag not in search.allow_dangerous:
                yield f"engine.extra_args.{flag}: {reason}; remove it or add '{flag}' to search.allow_dangerous"
        for name, value in engine.env.items():
            reason = nccl.danger_of(name, value)
            if reason and not search.is_allowed(name, value):
                yield (
                    f"engine.env.{name}: {value!r} is dangerous ({reason}); remove it or add "
                    f"'{name}={value}' to search.allow_dangerous"
                )
        if "nccl" in search.all_reduce and engine.tp_size == 1:
            yield "search.all_reduce: 'nccl' only matters with engine.tp_size > 1 (one rank has no all-reduce)"
        if search.nccl_env and engine.tp_size == 1:
            yield "search.nccl_env: NCCL variables only matter with engine.tp_size > 1 (one rank has no all-reduce)"
        if search.speculative is not None:
            if not search.speculative.triples():
                yield (
                    "search.speculative: no combination of num_steps, eagle_topk and num_draft_tokens satisfies "
                    "SGLang's rules (num_draft_tokens - 1 <= topk + (num_steps - 1) * topk^2)"
                )
        level = self.objective.concurrency
        if level is not None and level not in self.benchmark.concurrency:
            yield f"objective.concurrency: {level} is not one of benchmark.concurrency {self.benchmark.concurrency}"
        gpus = self.resources.gpus_per_trial
        if engine.kind == "sglang" and gpus is not None and gpus < engine.tp_size:
            yield f"resources.gpus_per_trial: {gpus} is below engine.tp_size={engine.tp_size}"
        if self.budget.max_concurrent_trials > self.budget.num_trials:
            yield (
                f"budget.max_concurrent_trials: {self.budget.max_concurrent_trials} exceeds "
                f"budget.num_trials={self.budget.num_trials}"
            )

    # --- resolved values -------------------------------------------------------------------

    @property
    def objective_concurrency(self) -> int:
        """The concurrency level whose result is the objective."""
        return self.objective.concurrency or max(self.benchmark.concurrency)

    @property
    def gpus_per_trial(self) -> int:
        """GPUs one trial reserves: explicit, else tp_size for SGLang, else 0 for the CPU reference."""
        if self.resources.gpus_per_trial is not None:
            return self.resources.gpus_per_trial
        return self.engine.tp_size if self.engine.kind == "sglang" else 0

    def results_path(self, *, base: Path | None = None) -> Path:
        """The results directory, relative paths taken from ``base`` (default: the working dir)."""
        path = Path(self.results_dir).expanduser()
        return path if path.is_absolute() else (base or Path.cwd()) / path

    def mlflow_uri(self, *, base: Path | None = None) -> str:
        """The MLflow tracking URI (default: a SQLite file in the results directory)."""
        if self.tracking.mlflow_uri:
            return self.tracking.mlflow_uri
        return f"sqlite:///{self.results_path(base=base) / 'mlflow.db'}"

    @property
    def experiment_name(self) -> str:
        """The MLflow experiment name."""
        return self.tracking.experiment_name or self.name

    def engine_config(
        self,
        *,
        num_steps: int | None,
        topk: int | None,
        num_draft_tokens: int | None,
        all_reduce: Literal["custom", "nccl"] = "custom",
        nccl_env: dict[str, str] | None = None,
    ) -> EngineConfig:
        """The EngineConfig of one point of the space (the template plus this candidate)."""
        engine = self.engine
        speculative = engine.speculative_algorithm is not None
        return EngineConfig(
            kind=engine.kind,
            model_path=engine.model_path,
            tp_size=engine.tp_size,
            speculative_algorithm=engine.speculative_algorithm,
            speculative_draft_model_path=engine.draft_model_path if speculative else None,
            speculative_num_steps=num_steps,
            speculative_eagle_topk=topk,
            speculative_num_draft_tokens=num_draft_tokens,
            disable_custom_all_reduce=all_reduce == "nccl",
            extra_args=dict(engine.extra_args),
            env={**engine.env, **(nccl_env or {})},
        )

    # --- loading ---------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path: str | Path) -> "SweepSpec":
        """Load and validate a spec file.

        Raises:
            SpecError: with every problem found, each naming its field.
        """
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError([SpecProblem("", f"cannot read {source}: {exc.strerror or exc}")], source=source) from None
        return cls.from_yaml_text(text, source=source)

    @classmethod
    def from_yaml_text(cls, text: str, *, source: str = "<string>") -> "SweepSpec":
        """Validate a spec given as YAML text (see ``from_yaml``)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError([SpecProblem("", f"not valid YAML: {exc}")], source=source) from None
        if not isinstance(data, dict):
            raise SpecError(
                [SpecProblem("", f"the top level must be a mapping of sections, got {type(data).__name__}")],
                source=source,
            )
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> "SweepSpec":
        """Validate a spec given as a dict (see ``from_yaml``)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(_problems_of(exc, data), source=source) from None


_SUBFIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.*)$")


def _problems_of(exc: ValidationError, data: dict[str, Any]) -> list[SpecProblem]:
    """Turn pydantic's errors into one readable problem per field (union noise collapsed)."""
    problems: list[SpecProblem] = []
    seen: set[tuple[str, str]] = set()
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        # Union arms (nccl_env's str | int | None) add their type name to loc; keep the user's path.
        loc = [p for p in loc if p not in ("str", "int", "none")]
        field = ".".join(loc)
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            key = loc[-1] if loc else ""
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown key{hint}; allowed here: {', '.join(allowed)}"
        elif "input" in error and error["type"] not in ("missing", "value_error", "assertion_error"):
            message = f"{message} (got {error['input']!r})"
        for line in message.split("\n"):
            # Validators name a sub-field as "sub.field: message"; move it into the path.
            where = field
            match = _SUBFIELD.match(line)
            if match:
                where = ".".join(p for p in (field, match.group(1)) if p)
                line = match.group(2)
            if (where, line) not in seen:
                seen.add((where, line))
                problems.append(SpecProblem(where, line))
    return problems


def _allowed_keys(path: list[str]) -> list[str]:
    """Field names of the model found at ``path`` inside SweepSpec (for 'did you mean')."""
    model: type[BaseModel] = SweepSpec
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)
