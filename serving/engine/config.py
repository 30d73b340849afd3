"""EngineConfig: one model of "how to start an engine", in SGLang's own flag names.

Validation is pure (no ports, no GPU queries, no downloads). SGLang's speculative rules live in
``serving.speculative_rules``; ``speculative_problem`` and ``tree_capacity`` are re-exported here.
"""

from __future__ import annotations

from typing import Callable, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from serving.all_reduce_rules import GpuKind
from serving.engine import nccl
from serving.errors import EngineConfigError
from serving.sglang_flags import flag_problem, sglang_flags
from serving.speculative_rules import FIELD_NAMES, speculative_problem, tree_capacity

__all__ = [
    "EngineConfig",
    "EngineFlagChecks",
    "EngineKind",
    "FlagValue",
    "MANAGED_FLAGS",
    "checked_extra_args",
    "draft_problem",
    "engine_flag_names",
    "extra_args_problems",
    "nodes_problem",
    "managed_flag_field",
    "normalise_flag_name",
    "speculative_problem",
    "tree_capacity",
    "validated_extra_args",
]

EngineKind = Literal["sglang", "reference"]
FlagValue = Union[bool, int, float, str, list[Union[int, float, str]]]

MANAGED_FLAGS: dict[str, str] = {
    "model_path": "model_path",
    "model": "model_path",
    "tp_size": "tp_size",
    "tensor_parallel_size": "tp_size",
    "host": "(chosen at launch)",
    "port": "(chosen at launch)",
    "speculative_algorithm": "speculative_algorithm",
    "speculative_draft_model_path": "speculative_draft_model_path",
    "speculative_draft_model": "speculative_draft_model_path",
    "speculative_num_steps": "speculative_num_steps",
    "speculative_eagle_topk": "speculative_eagle_topk",
    "speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "disable_custom_all_reduce": "disable_custom_all_reduce",
    "enforce_disable_flashinfer_allreduce_fusion": "enforce_disable_flashinfer_allreduce_fusion",
    "reference_gpu_kind": "reference_gpu_kind",
    "reference_mscclpp_installed": "reference_mscclpp_installed",
    "nnodes": "nnodes",
    "node_rank": "(chosen at launch)",
    "dist_init_addr": "(chosen at launch)",
    "nccl_init_addr": "(chosen at launch)",
}
"""Engine flags (and SGLang 0.5.23's aliases for them) -> the typed field that sets them;
``extra_args`` may not set them (rendered later on the command line, they would win)."""


def normalise_flag_name(name: str) -> str:
    """``--speculative-num-steps`` / ``speculative-num-steps`` -> ``speculative_num_steps``."""
    return name.strip().lstrip("-").replace("-", "_")


def managed_flag_field(name: str) -> str | None:
    """The typed field that owns flag ``name`` (normalised), or None if ``extra_args`` may set it.

    A prefix of a managed flag (``speculative_num_step``) is managed too, as argparse would read it.
    """
    if name in MANAGED_FLAGS:
        return MANAGED_FLAGS[name]
    owners = {field for flag, field in MANAGED_FLAGS.items() if len(name) >= 2 and flag.startswith(name)}
    return owners.pop() if len(owners) == 1 else (", ".join(sorted(owners)) or None)


def validated_extra_args(flags: object, *, use_instead: Callable[[str], str]) -> object:
    """Normalise ``extra_args`` flag names, refusing any that spectune sets from a typed field.

    A pydantic "before" hook shared by the spec and EngineConfig; only the hint differs. Every
    refused flag is named at once, one line each (``flag: message``, so the caller's formatter
    files it under ``extra_args.flag``); a prefix of a managed flag (``speculative_num_step``,
    which SGLang's parser reads as the whole name) says which flag it stands for.

    Args:
        flags: ``{flag: value}`` as written by the user (non-mappings are returned unchanged, for
            pydantic to reject with its own message).
        use_instead: Owner field (a value of ``MANAGED_FLAGS``) -> what the user should set
            instead, for the error message; called once per owner.

    Raises:
        ValueError: ``"<flag>: set by spectune[: SGLang reads it as <flag>]; use <hint> instead"``,
            one line per refused flag.
    """
    if not isinstance(flags, dict):
        return flags
    out: dict[str, object] = {}
    problems = []
    for raw, item in flags.items():
        name = normalise_flag_name(str(raw))
        if managed_flag_field(name):
            read_as = [name] if name in MANAGED_FLAGS else sorted(
                flag for flag in MANAGED_FLAGS if len(name) >= 2 and flag.startswith(name))
            owners = dict.fromkeys(MANAGED_FLAGS[flag] for flag in read_as)
            hints = list(dict.fromkeys(use_instead(owner) for owner in owners))
            shown = ["--" + flag.replace("_", "-") for flag in read_as]
            if read_as == [name]:
                what = "set by spectune"
            elif len(shown) == 1:
                what = f"set by spectune: SGLang reads it as {shown[0]}"
            else:
                what = f"set by spectune: a prefix of {', '.join(shown[:-1])} and {shown[-1]}"
            hint = hints[0] if len(hints) == 1 else f"{', '.join(hints[:-1])} or {hints[-1]}"
            problems.append(f"{name}: {what}; use {hint} instead")
            continue
        out[name] = item
    if problems:
        raise ValueError("\n".join(problems))
    return out


def engine_flag_names(kind: EngineKind) -> frozenset[str]:
    """The option strings ``extra_args`` may name for an engine of ``kind``: SGLang 0.5.23's own
    (``serving/data/sglang_server_flags.json``), or the reference engine parser's, less the deprecated ones."""
    if kind == "sglang":
        return sglang_flags().accepted
    from serving.reference.server_args import option_strings  # the parser, not the engine

    return option_strings() - sglang_flags().deprecated


def extra_args_problems(flags: Mapping[str, FlagValue], *, kind: EngineKind) -> list[str]:
    """What is wrong with ``extra_args`` (names already normalised) for an engine of ``kind``.

    Each name must be an exact, non-deprecated flag name of that engine, and its value must render as
    the flag expects: ``true``/``false`` for a switch, a value (a list only where it takes several)
    for the others.
    """
    accepted = engine_flag_names(kind)
    engine = "SGLang" if kind == "sglang" else "the reference engine"
    table = sglang_flags().flags
    problems = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        problem = flag_problem(flag, accepted=accepted, engine=engine)
        known = table.get(flag)
        if problem is None and known is not None:
            if not known.takes_value and not isinstance(value, bool):
                problem = f"{flag} is a switch; give true (the bare flag) or false (left out), not {value!r}"
            elif known.takes_value and value is True:
                problem = f"{flag} takes a value; true would render the bare flag"
            elif isinstance(value, list) and known.nargs not in ("+", "*") and not isinstance(known.nargs, int):
                problem = f"{flag} takes one value, not a list ({value!r})"
        if problem:
            problems.append(f"{name}: {problem}")
    return problems


def checked_extra_args(flags: dict[str, FlagValue], info: ValidationInfo) -> dict[str, FlagValue]:
    """A pydantic "after" hook shared by the spec and EngineConfig: ``extra_args_problems`` for the
    model's ``kind``; skipped when ``kind`` itself is invalid."""
    kind = info.data.get("kind")
    if kind is None:
        return flags
    problems = extra_args_problems(flags, kind=kind)
    if problems:
        raise ValueError("; ".join(problems))
    return flags


def nodes_problem(tp_size: int, nnodes: int, *, names: Mapping[str, str] | None = None) -> str | None:
    """SGLang's rule (``arg_groups/validation_hook.py``): ``tp_size`` must be divisible by the number of
    nodes, each node holding ``tp_size / nnodes`` ranks; the problem in the caller's field ``names``
    (``{"tp_size": ..., "nnodes": ...}``), or None."""
    tp, nodes = (names or {}).get("tp_size", "tp_size"), (names or {}).get("nnodes", "nnodes")
    if tp_size % nnodes:
        return (f"{nodes}: {nnodes} does not divide {tp}={tp_size} (SGLang: tp_size must be divisible by number of "
                "nodes; each node holds tp_size / nnodes ranks)")
    return None


def draft_problem(algorithm: str | None, draft_model_path: str | None, *, draft_field: str) -> str | None:
    """A speculative algorithm needs its draft head: the problem, naming the caller's ``draft_field``, or None."""
    if algorithm and not draft_model_path:
        return (f"speculative_algorithm={algorithm} needs {draft_field} (or set speculative_algorithm to null to run "
                "without speculation)")
    return None


class EngineFlagChecks(BaseModel):
    """The checks of ``extra_args`` (:func:`checked_extra_args`) and ``env`` (``nccl.validated_env``),
    shared by ``orchestrator.spec.EngineSpec`` and ``EngineConfig``; each subclass declares both fields."""

    @field_validator("extra_args", check_fields=False)
    @classmethod
    def _known_flags(cls, value: dict[str, FlagValue], info: ValidationInfo) -> dict[str, FlagValue]:
        return checked_extra_args(value, info)

    @field_validator("env", mode="before", check_fields=False)
    @classmethod
    def _env(cls, value: object) -> object:
        return nccl.validated_env(value)


class EngineConfig(EngineFlagChecks):
    """Everything needed to start one engine (SGLang or the reference engine), in SGLang's flag names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EngineKind = Field(description="Which engine: 'sglang' on GPUs or the CPU/GPU 'reference' engine.")
    model_path: str = Field(min_length=1, description="--model-path: HF repo/path (SGLang) or preset name (reference).")
    tp_size: int = Field(default=1, ge=1, le=64, description="--tp-size: tensor-parallel ranks (= GPUs per engine).")
    nnodes: int = Field(
        default=1, ge=1, le=64,
        description="--nnodes: nodes the engine spans, tp_size / nnodes ranks on each (--node-rank and "
        "--dist-init-addr are chosen at launch, per node).",
    )
    speculative_algorithm: Literal["EAGLE", "EAGLE3"] | None = Field(
        default=None, description="--speculative-algorithm; None disables speculative decoding."
    )
    speculative_draft_model_path: str | None = Field(
        default=None, description="--speculative-draft-model-path: the EAGLE draft head."
    )
    speculative_num_steps: int | None = Field(default=None, ge=1, description="--speculative-num-steps: draft depth.")
    speculative_eagle_topk: int | None = Field(default=None, ge=1, description="--speculative-eagle-topk: branching per step.")
    speculative_num_draft_tokens: int | None = Field(
        default=None, ge=2, description="--speculative-num-draft-tokens: tokens verified per cycle (incl. root)."
    )
    disable_custom_all_reduce: bool = Field(
        default=False, description="--disable-custom-all-reduce: no custom all-reduce (NCCL where nothing else runs)."
    )
    enforce_disable_flashinfer_allreduce_fusion: bool = Field(
        default=False,
        description="--enforce-disable-flashinfer-allreduce-fusion: no FlashInfer all-reduce fusion (SGLang turns it "
        "on by itself for some MoE architectures on sm90/sm100 nodes).",
    )
    reference_gpu_kind: str | None = Field(
        default=None,
        description="Reference engine only (--reference-gpu-kind): the node whose all-reduce rule it follows and "
        "logs as SGLang would (cpu, sm90-nvlink, sm120-pcie, ...; serving.all_reduce_rules).",
    )
    reference_mscclpp_installed: bool = Field(
        default=False,
        description="Reference engine only (--reference-mscclpp-installed): behave as if the mscclpp package were "
        "installed, so --enable-mscclpp engages where SGLang's rule lets it (serving.all_reduce_rules).",
    )
    extra_args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="Further engine flags by SGLang name (e.g. mem_fraction_static: 0.85); true renders a bare flag.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for the engine and every worker it spawns (NCCL_* etc.)."
    )

    @field_validator("reference_gpu_kind")
    @classmethod
    def _gpu_kind(cls, value: str | None) -> str | None:
        return None if value is None else GpuKind.parse(value).name

    @field_validator("extra_args", mode="before")
    @classmethod
    def _normalise_extra_args(cls, value: object) -> object:
        return validated_extra_args(value, use_instead=lambda owner: "nothing: it is (chosen at launch)"
                                    if owner == "(chosen at launch)" else f"the field {owner!r}")

    @model_validator(mode="after")
    def _check_speculative(self) -> "EngineConfig":
        """SGLang's speculative rules (``serving.speculative_rules``) and what they need; raises ``EngineConfigError``."""
        problem = nodes_problem(self.tp_size, self.nnodes)
        if problem:
            raise EngineConfigError(problem)
        if self.reference_gpu_kind is not None and self.kind != "reference":
            raise EngineConfigError(f"reference_gpu_kind={self.reference_gpu_kind!r} is the reference engine's own "
                                    "flag; SGLang reads its node itself (remove it for kind sglang)")
        if self.reference_mscclpp_installed and self.kind != "reference":
            raise EngineConfigError("reference_mscclpp_installed is the reference engine's own flag; SGLang imports "
                                    "mscclpp itself (remove it for kind sglang)")
        numbers = (
            self.speculative_num_steps,
            self.speculative_eagle_topk,
            self.speculative_num_draft_tokens,
        )
        if self.speculative_algorithm is None:
            if any(n is not None for n in numbers) or self.speculative_draft_model_path:
                raise EngineConfigError(
                    "speculative fields are set but speculative_algorithm is not; set it to EAGLE3 "
                    "(or EAGLE) or remove the speculative_* fields"
                )
            return self
        problem = draft_problem(self.speculative_algorithm, self.speculative_draft_model_path,
                                draft_field="speculative_draft_model_path")
        if problem:
            raise EngineConfigError(problem)
        problem = speculative_problem(
            num_steps=self.speculative_num_steps,
            eagle_topk=self.speculative_eagle_topk,
            num_draft_tokens=self.speculative_num_draft_tokens,
            names=FIELD_NAMES,
        )
        if problem:
            raise EngineConfigError(problem)
        return self

    @property
    def ranks_per_node(self) -> int:
        """TP ranks on each node (SGLang's ``tp_size_per_node``, pp 1)."""
        return self.tp_size // self.nnodes

    @property
    def speculative(self) -> bool:
        """Whether speculative decoding is on."""
        return self.speculative_algorithm is not None
