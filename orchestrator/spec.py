"""SweepSpec: the validated YAML that says what to tune, how to measure it and within what budget.

A spec is checked completely before anything starts (types strictly, bounds, NCCL values, SGLang's
speculative rules, the size of the search space), and every problem names its field, the value
and what is allowed. Loading has no side effects; reading the file itself is
``orchestrator.spec_file``'s job, the ``search`` section is ``orchestrator.spec_search``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from orchestrator.errors import SpecError
from orchestrator.space import (
    ARM_MULTICAST,
    TREE_RULE,
    Candidate,
    SearchSpace,
    SpeculativeSpace,
    SpeculativeTriple,
    arm_flag_clashes,
    space_problems,
)
from orchestrator.spec_benchmark import OBJECTIVE_METRICS, BenchmarkSpec, ProbeSpec
from orchestrator.spec_file import read_spec_file, yaml_data
from orchestrator.spec_search import (
    DANGEROUS_FLAGS,
    MAX_CHOICES,
    EarlyStoppingSpec,
    IntRange,
    SearchSpec,
    SpeculativeSpec,
    socket_thread_problems,
)
from orchestrator.spec_run import (
    DEFAULT_ENGINE_START_S,
    DEFAULT_TPOT_MS,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_PARALLEL_TRIALS,
    MAX_RESOURCES,
    BudgetSpec,
    ConfirmationSpec,
    ObjectiveSpec,
    ResourcesSpec,
    SloSpec,
    TrackingSpec,
)
from orchestrator.spec_run import SpecSection as _Model
from orchestrator.statistics import MIN_VALUES
from orchestrator.validation import validation_problems
from serving.engine import nccl
from orchestrator.space.arms import ArmsOnNode, arms_on_node, multicast_possible
from serving.all_reduce_rules import PCIE_IPC_ENV, GpuKind
from serving.engine.config import (
    EngineConfig,
    EngineFlagChecks,
    EngineKind,
    FlagValue,
    draft_problem,
    nodes_problem,
    validated_extra_args,
)
from serving.engine.placement import EnginePlacement, engine_placement

__all__ = [
    "BudgetSpec",
    "DEFAULT_ENGINE_START_S",
    "DEFAULT_TPOT_MS",
    "ConfirmationSpec",
    "ProbeSpec",
    "EngineSpec",
    "MAX_CONCURRENCY",
    "MAX_DURATION_S",
    "MAX_PARALLEL_TRIALS",
    "MAX_RESOURCES",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SloSpec",
    "SweepSpec",
    "TrackingSpec",
]


_SPEC_FIELD_FOR: dict[str, str] = {
    "model_path": "engine.model_path",
    "tp_size": "engine.tp_size",
    "nnodes": "engine.nnodes",
    "speculative_algorithm": "engine.speculative_algorithm",
    "speculative_draft_model_path": "engine.draft_model_path",
    "speculative_num_steps": "search.speculative.num_steps",
    "speculative_eagle_topk": "search.speculative.eagle_topk (with num_steps, and num_draft_tokens for top-k above 1)",
    "speculative_num_draft_tokens": "search.speculative.num_draft_tokens (with num_steps, for top-k above 1)",
    "disable_custom_all_reduce": "search.all_reduce (its 'nccl' arm)",
    "enforce_disable_flashinfer_allreduce_fusion": "search.all_reduce (its 'no_fusion' arm)",
    "reference_gpu_kind": "engine.gpu_kind",
    "reference_mscclpp_installed": "engine.mscclpp_installed",
    "(chosen at launch)": "nothing (spectune picks host, port, node rank and rendezvous address at launch)",
}
"""Each engine field ``extra_args`` may not set (``serving.engine.config.MANAGED_FLAGS``) -> where a
spec sets it; tests/unit/test_validator_messages.py follows each advice and loads the spec."""


def _spec_field_for(owner: str) -> str:
    """Where in a spec the user sets what engine field ``owner`` holds."""
    return _SPEC_FIELD_FOR.get(owner, f"engine.{owner}")


class EngineSpec(_Model, EngineFlagChecks):
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
    nnodes: int = Field(
        default=1, ge=1, le=64,
        description="--nnodes: nodes one engine spans, tp_size / nnodes ranks on each (one placement-group bundle "
        "per node, STRICT_SPREAD; --node-rank and --dist-init-addr are chosen per trial).",
    )
    extra_args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="Further engine flags by SGLang name (mem_fraction_static: 0.85, trust_remote_code: true).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Fixed environment for every trial's engine and its workers (e.g. NCCL_DEBUG: WARN).",
    )
    gpu_kind: str = Field(
        default="auto",
        description="The node the engines run on, which decides the kernel of decode's all-reduce: auto (the "
        "preflight reads compute capability and NVLink from the node), or cpu / smNN-nvlink / smNN-pcie "
        "(sm90-nvlink: H100/H200; sm100-nvlink: B200; sm120-pcie: RTX PRO 6000). The reference engine follows "
        "SGLang's rule for it (--reference-gpu-kind).",
    )
    architecture: Optional[str] = Field(
        default=None, min_length=1,
        description="The model's architectures[0] from its config.json (e.g. KimiK25ForConditionalGeneration), "
        "which decides whether SGLang turns on FlashInfer all-reduce fusion; default: read from a local model "
        "directory by the preflight (the reference engine: its preset's).",
    )
    mscclpp_installed: bool = Field(
        default=False,
        description="The engine's Python has the mscclpp package (SGLang 0.5.23 does not install it). Without it "
        "--enable-mscclpp logs 'PyMscclpp is unavailable' and custom all-reduce carries decode, so the 'mscclpp' arm "
        "is measured as the arm that runs that. The reference engine follows it (--reference-mscclpp-installed).",
    )

    @field_validator("extra_args", mode="before")
    @classmethod
    def _flags(cls, value: Any) -> Any:
        return validated_extra_args(value, use_instead=_spec_field_for)

    @field_validator("gpu_kind")
    @classmethod
    def _gpu_kind(cls, value: str) -> str:
        return value if value == "auto" else GpuKind.parse(value).name

    @model_validator(mode="after")
    def _rules(self) -> "EngineSpec":
        """The node and the draft head: every problem at once, one line each."""
        problems = []
        if self.kind == "sglang" and self.gpu_kind == "cpu":
            problems.append("gpu_kind: cpu is only for the reference engine; SGLang runs on GPUs (use auto or smNN-...)")
        problem = draft_problem(self.speculative_algorithm, self.draft_model_path, draft_field="draft_model_path")
        if problem:
            problems.append(problem)
        if PCIE_IPC_ENV in self.env:
            problems.append(
                f"env.{PCIE_IPC_ENV}: {self.env[PCIE_IPC_ENV]!r} would switch FlashInfer's PCIe-IPC all-reduce on for "
                "every trial, under every all-reduce arm, and the plan would not know it; search it as the arm that sets "
                "it (search.all_reduce: [pcie_ipc, default]) and drop it from engine.env")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def template(self) -> EngineConfig:
        """This section as the EngineConfig every point starts from: SGLang's own speculative
        numbers and all-reduce, the fixed environment (a point applies its settings with
        ``Candidate.applied_to``). The reference engine is told the node (``gpu_kind``) and the
        model's architecture (through ``json_model_override_args``, SGLang's way)."""
        extra_args = dict(self.extra_args)
        reference_gpu_kind = None
        if self.kind == "reference":
            reference_gpu_kind = None if self.gpu_kind == "auto" else self.gpu_kind
            if self.architecture:
                overrides = json.loads(str(extra_args.get("json_model_override_args") or "{}"))
                extra_args["json_model_override_args"] = json.dumps({**overrides, "architectures": [self.architecture]})
        return EngineConfig(
            kind=self.kind, model_path=self.model_path, tp_size=self.tp_size, nnodes=self.nnodes,
            speculative_algorithm=self.speculative_algorithm,
            speculative_draft_model_path=self.draft_model_path if self.speculative_algorithm else None,
            reference_gpu_kind=reference_gpu_kind, extra_args=extra_args, env=dict(self.env),
            reference_mscclpp_installed=self.kind == "reference" and self.mscclpp_installed,
        )


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
    probe: ProbeSpec = Field(default_factory=ProbeSpec, description="The correctness probe of every trial.")
    confirmation: ConfirmationSpec = Field(
        default_factory=ConfirmationSpec, description="Re-measure the best configurations before naming a winner."
    )
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
        for name in search.nccl_variables():
            where = f"search.nccl_env.{name}" if name in search.nccl_env else "search.nccl_presets"
            if name in engine.env:
                yield f"{where}: {name} is also fixed in engine.env.{name}; keep one"
            if nccl.not_searchable(name):
                yield f"{where}: {nccl.not_searchable(name)}"
            elif nccl.NCCL_VARIABLES[name].scope == "network" and engine.nnodes == 1:
                yield (f"{where}: {name} only acts on traffic between nodes, and with engine.nnodes: 1 every "
                       "all-reduce stays inside the node (NVLink, PCIe P2P or shared memory): its trials would "
                       "measure nothing of it; search it for an engine across nodes (engine.nnodes > 1), or drop it")
        yield from socket_thread_problems(engine.env, search)
        for where, name, value in search.nccl_settings():
            reason = value is not None and nccl.danger_of(name, value)
            if reason and not search.is_allowed(name, value):
                yield (
                    f"{where}: {value!r} is dangerous ({reason}); remove it or add "
                    f"'{name}={value}' to search.allow_dangerous"
                )
        for flag, reason in DANGEROUS_FLAGS.items():
            if engine.extra_args.get(flag) and flag not in search.allow_dangerous:
                yield f"engine.extra_args.{flag}: {reason}; remove it or add '{flag}' to search.allow_dangerous"
        for arm in search.all_reduce:
            if arm in ARM_MULTICAST and arm not in search.allow_dangerous and multicast_possible(engine.gpu_kind):
                yield (f"search.all_reduce: the arm '{arm}' turns on NVLink multicast ({ARM_MULTICAST[arm]}), which "
                       f"can put GPUs others share out of service; on a node nobody shares add '{arm}' to "
                       "search.allow_dangerous, else drop it")
        for flag, arms in arm_flag_clashes(search.all_reduce, engine.extra_args).items():
            yield (f"engine.extra_args.{flag}: the search.all_reduce arm{'s' if len(arms) > 1 else ''} "
                   f"{', '.join(repr(a) for a in arms)} set{'' if len(arms) > 1 else 's'} it for its trials; drop it "
                   "from extra_args")
        for name, value in engine.env.items():
            reason = nccl.danger_of(name, value)
            if reason and not search.is_allowed(name, value):
                yield (
                    f"engine.env.{name}: {value!r} is dangerous ({reason}); remove it or add "
                    f"'{name}={value}' to search.allow_dangerous"
                )
        if set(search.all_reduce) - {"default"} and engine.tp_size == 1:
            other = ", ".join(repr(a) for a in search.all_reduce if a != "default")
            yield f"search.all_reduce: {other} only matters with engine.tp_size > 1 (one rank has no all-reduce)"
        if search.nccl_env and engine.tp_size == 1:
            yield "search.nccl_env: NCCL variables only matter with engine.tp_size > 1 (one rank has no all-reduce)"
        if search.nccl_presets is not None and len(search.nccl_presets) > 1 and engine.tp_size == 1:
            yield "search.nccl_presets: NCCL variables only matter with engine.tp_size > 1 (one rank has no all-reduce)"
        yield from self._all_reduce_problems()
        yield from space_problems(self.space())  # empty, or beyond the bound (counted, never listed)
        level = self.objective.concurrency
        if level is not None and level not in self.benchmark.concurrency:
            yield f"objective.concurrency: {level} is not one of benchmark.concurrency {self.benchmark.concurrency}"
        gpus = self.resources.gpus_per_trial
        if engine.kind == "sglang" and gpus is not None and gpus < engine.tp_size:
            yield f"resources.gpus_per_trial: {gpus} is below engine.tp_size={engine.tp_size}"
        problem = nodes_problem(engine.tp_size, engine.nnodes, names={"tp_size": "engine.tp_size", "nnodes": "engine.nnodes"})
        if problem:
            yield problem
        elif self.gpus_per_trial % engine.nnodes:
            yield (f"resources.gpus_per_trial: {self.gpus_per_trial} GPUs do not split evenly over "
                   f"engine.nnodes={engine.nnodes} (one bundle of gpus_per_trial / nnodes GPUs per node)")
        if self.budget.max_concurrent_trials > self.budget.num_trials:
            yield (
                f"budget.max_concurrent_trials: {self.budget.max_concurrent_trials} exceeds "
                f"budget.num_trials={self.budget.num_trials}"
            )

    def _all_reduce_problems(self) -> Iterator[str]:
        """Arms SGLang refuses on the node, every one; NCCL settings searched on a node where no arm
        of the spec lets NCCL carry decode."""
        search = self.search
        plan = self.arms_on_node()
        if plan.gpu_kind is not None and not plan.measured:
            yield (f"search.all_reduce: SGLang refuses to start with every arm of {search.all_reduce} on "
                   f"{plan.gpu_kind} ({'; '.join(plan.lines())}); add 'default'")
            return
        if not (search.nccl_env or (search.nccl_presets is not None and len(search.nccl_presets) > 1)):
            return
        if plan.gpu_kind is None or plan.nccl_arms or self.engine.tp_size == 1:
            return
        where = "search.nccl_env" if search.nccl_env else "search.nccl_presets"
        kernels = "; ".join(plan.lines())
        yield (f"{where}: on {plan.gpu_kind} NCCL carries decode's all-reduce on none of the arms "
               f"{search.all_reduce} ({kernels}); add 'nccl' to search.all_reduce, or drop {where}")

    def warnings(self) -> list[str]:
        """Settings that are valid but cannot give what a user would act on (``spectune validate``
        and the sweep print them): intervals need 3 values (``orchestrator.statistics``)."""
        out = []
        bench = self.benchmark
        most = bench.repetitions
        if most < MIN_VALUES:
            target = ("; benchmark.target_ci_rel can never be met, so every level runs all of them"
                      if bench.target_ci_rel is not None else "")
            out.append(f"benchmark.repetitions: {most} gives no interval for a trial (an interval needs {MIN_VALUES} "
                       f"repetitions); the table will say 'too few repetitions for an interval'{target}")
        elif bench.target_ci_rel is not None and bench.min_repetitions is not None and bench.min_repetitions < MIN_VALUES:
            out.append(f"benchmark.min_repetitions: {bench.min_repetitions} acts as {MIN_VALUES} (no interval is stated "
                       f"from fewer values, so no level stops before {MIN_VALUES} repetitions)")
        if self.engine.kind == "sglang" and bench.api != "chat":
            out.append(
                f"benchmark.api: {bench.api} sends raw text with no chat template; if {self.engine.model_path} is "
                "served as a chat model, its draft was trained on chat-formatted text and accepts differently on raw "
                "text, so the best chain length found here may not be production's: set benchmark.api: chat (and "
                "dataset: request_log for your own traffic)")
        confirmation = self.confirmation
        if confirmation.enabled and confirmation.max_visits < MIN_VALUES:
            out.append(f"confirmation.max_visits: {confirmation.max_visits} can never decide a verdict (an interval "
                       f"needs {MIN_VALUES} visits of each contender); it will end 'undecided'")
        plan = self.arms_on_node()
        merged = {arm: to for arm, to in plan.stands_for.items() if arm != to}
        if merged:
            out.append(f"search.all_reduce: on {plan.gpu_kind} " + ", ".join(
                f"'{arm}' runs the kernel of '{to}'" for arm, to in merged.items())
                + ": measured once (spectune validate's all-reduce table says why)")
        elif plan.gpu_kind is None and len(self.search.all_reduce) > 1:
            out.append("search.all_reduce: which kernel each arm runs depends on the node (engine.gpu_kind: auto); "
                       "the preflight reads it there, and arms that run one kernel are measured once")
        speculative = self.space().speculative
        if isinstance(speculative, SpeculativeSpace):
            for name, values in speculative.values_dropped().items():
                out.append(f"search.speculative.{name}: {', '.join(map(str, values))} "
                           f"{'is' if len(values) == 1 else 'are'} in no combination SGLang accepts "
                           f"({TREE_RULE}; top-k 1 chains derive their draft count): the search leaves {'it' if len(values) == 1 else 'them'} out")
        out.extend(self._nccl_proof_warnings())
        if self.benchmark.min_repetition_s == 0 and self.engine.kind == "sglang":
            out.append("benchmark.min_repetition_s: 0 lets a repetition on a GPU last a few seconds (16 prompts x 128 "
                       "tokens took 8 s on an H200, and two such repetitions were 18% apart)")
        return out

    def _nccl_proof_warnings(self) -> list[str]:
        """Which half of the proof that the NCCL variables reached every rank is off: NCCL's own
        per-rank lines (``serving.engine.nccl_log``) need ``NCCL_DEBUG=INFO`` and its ENV subsystem."""
        if self.engine.kind != "sglang" or self.engine.tp_size < 2:
            return []
        env = self.engine.env
        level = (env.get("NCCL_DEBUG") or "").strip().upper()
        both = "set NCCL_DEBUG: INFO with NCCL_DEBUG_SUBSYS: INIT,ENV (the Kimi specs do) for both"
        if level not in ("INFO", "TRACE"):
            shown = f"NCCL_DEBUG: {env['NCCL_DEBUG']}" if env.get("NCCL_DEBUG") else "NCCL_DEBUG unset"
            return [f"engine.env: {shown} turns off NCCL's own per-rank proof (each rank's 'NCCL_X set by environment' "
                    f"lines, checked by trial as nccl_log); only the env audit of every process proves the NCCL "
                    f"variables arrived; {both}"]
        subsystems = [s.strip().upper() for s in (env.get("NCCL_DEBUG_SUBSYS") or "").split(",") if s.strip()]
        if subsystems and not subsystems[0].startswith("^") and not {"ENV", "ALL"} & set(subsystems):
            return [f"engine.env.NCCL_DEBUG_SUBSYS: {env['NCCL_DEBUG_SUBSYS']} leaves out ENV, whose lines are the "
                    "ones NCCL's per-rank proof reads: every trial would fail nccl_log; add ENV"]
        if subsystems and subsystems[0].startswith("^") and "ENV" in {s.lstrip("^") for s in subsystems}:
            return [f"engine.env.NCCL_DEBUG_SUBSYS: {env['NCCL_DEBUG_SUBSYS']} excludes ENV, whose lines are the ones "
                    "NCCL's per-rank proof reads: every trial would fail nccl_log"]
        return []

    def space(self) -> SearchSpace:
        """Every configuration the sweep may try (see ``orchestrator.space``; counted, never listed).
        Without ``search.speculative`` the speculative dimension is SGLang's own choice (or off)."""
        speculative = self.search.speculative
        if self.engine.speculative_algorithm is None or speculative is None:
            numbers = SpeculativeSpace(include_auto=True)
        else:
            numbers = speculative.space()
        arms = self.arms_on_node()
        return SearchSpace(
            speculative=numbers,
            all_reduce=arms.measured,  # type: ignore[arg-type]
            nccl_env={name: tuple(choices) for name, choices in self.search.nccl_env.items()},
            nccl_presets=None if self.search.nccl_presets is None else tuple(self.search.nccl_presets),
            nccl_arms=arms.nccl_arms,  # type: ignore[arg-type]
        )

    def arms_on_node(self, *, gpu_kind: str | None = None) -> ArmsOnNode:
        """The all-reduce arms on the spec's node (or ``gpu_kind``): each arm's kernel, the arms
        measured (one per kernel), where NCCL_* is searched (``orchestrator.space.arms``)."""
        return arms_on_node(self.engine, self.search.all_reduce, gpu_kind=gpu_kind)

    def on_node(self, *, gpu_kind: str | None, architecture: str | None = None) -> "SweepSpec":
        """This spec with ``engine.gpu_kind`` (and ``engine.architecture``) set to what the preflight
        found on the node, validated again; itself when nothing was found."""
        if (gpu_kind is None or gpu_kind == self.engine.gpu_kind) and architecture is None:
            return self
        data = self.model_dump()
        if gpu_kind is not None:
            data["engine"]["gpu_kind"] = gpu_kind
        if architecture is not None:
            data["engine"]["architecture"] = architecture
        return type(self).model_validate(data)

    @property
    def objective_concurrency(self) -> int:
        """The concurrency level whose result is the objective."""
        return self.objective.concurrency or max(self.benchmark.concurrency)

    @property
    def trial_placement(self) -> EnginePlacement:
        """One trial's placement-group bundles, strategy and engine-host bundles: one node, or one
        bundle per node of an engine across ``engine.nnodes`` nodes (``serving.engine.placement``)."""
        return engine_placement(gpus=self.gpus_per_trial, cpus=self.resources.cpus_per_trial, nnodes=self.engine.nnodes)

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
        eagle_topk: int | None,
        num_draft_tokens: int | None,
        all_reduce: str = "default",
        nccl_env: dict[str, str] | None = None,
    ) -> EngineConfig:
        """The EngineConfig of one point given by its settings: the engine template with them
        applied (``Candidate.applied_to``)."""
        point = Candidate(SpeculativeTriple(num_steps, eagle_topk, num_draft_tokens), all_reduce,  # type: ignore[arg-type]
                          dict(nccl_env or {}))
        return point.applied_to(self.engine.template())

    # --- loading ---------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path: str | Path) -> "SweepSpec":
        """Load and validate a spec file.

        Raises:
            SpecError: with every problem found, each naming its field (or the file, when it
                cannot be read as UTF-8 YAML text: see ``orchestrator.spec_file``).
        """
        return cls.from_yaml_text(read_spec_file(path), source=str(path))

    @classmethod
    def from_yaml_text(cls, text: str, *, source: str = "<string>") -> "SweepSpec":
        """Validate a spec given as YAML text (see ``from_yaml``; duplicate keys are refused)."""
        return cls.from_dict(yaml_data(text, source=source), source=source)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> "SweepSpec":
        """Validate a spec given as a dict (see ``from_yaml``)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(validation_problems(exc, model=cls), source=source) from None
