"""EngineConfig: one model of "how to start an engine", in SGLang's own flag names.

The sweep turns (template + one candidate from the search space) into an EngineConfig; Serve
loads one from the best-config file. The command builder renders it to argv for SGLang or the
reference engine. Validation here is pure: no ports, no GPU queries, no downloads — the port is
chosen by whoever owns the machine, at launch.
"""

from __future__ import annotations

from typing import Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.engine import nccl

__all__ = [
    "EngineConfig",
    "EngineKind",
    "FlagValue",
    "MANAGED_FLAGS",
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
    "tp": "tp_size",
    "tensor_parallel_size": "tp_size",
    "host": "(chosen at launch)",
    "port": "(chosen at launch)",
    "speculative_algorithm": "speculative_algorithm",
    "speculative_algo": "speculative_algorithm",
    "speculative_draft_model_path": "speculative_draft_model_path",
    "speculative_draft_model": "speculative_draft_model_path",
    "speculative_num_steps": "speculative_num_steps",
    "speculative_eagle_topk": "speculative_eagle_topk",
    "speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "disable_custom_all_reduce": "disable_custom_all_reduce",
}
"""Engine flags (and SGLang's aliases of them) spectune sets from typed fields; ``extra_args`` may
not set them behind its back: rendered later on the command line, they would win."""


def normalise_flag_name(name: str) -> str:
    """``--speculative-num-steps`` / ``speculative-num-steps`` -> ``speculative_num_steps``."""
    return name.strip().lstrip("-").replace("-", "_")


def managed_flag_field(name: str) -> str | None:
    """The typed field that owns flag ``name`` (normalised), or None if ``extra_args`` may set it.

    argparse accepts unambiguous prefixes of long options (SGLang's parser does), so a prefix of
    a managed flag (``speculative_num_step``) is managed too.
    """
    if name in MANAGED_FLAGS:
        return MANAGED_FLAGS[name]
    owners = {field for flag, field in MANAGED_FLAGS.items() if len(name) >= 2 and flag.startswith(name)}
    return owners.pop() if len(owners) == 1 else (", ".join(sorted(owners)) or None)


def validated_extra_args(flags: object, *, use_instead: Callable[[str], str]) -> object:
    """Normalise ``extra_args`` flag names, refusing any that spectune sets from a typed field.

    A pydantic "before" hook shared by the spec and EngineConfig; only the hint differs.

    Args:
        flags: ``{flag: value}`` as written by the user (non-mappings are returned unchanged, for
            pydantic to reject with its own message).
        use_instead: Owner field -> what the user should set instead, for the error message.

    Raises:
        ValueError: ``"'<flag>' is set by spectune; use <hint> instead"``.
    """
    if not isinstance(flags, dict):
        return flags
    out: dict[str, object] = {}
    for raw, item in flags.items():
        name = normalise_flag_name(str(raw))
        owner = managed_flag_field(name)
        if owner:
            raise ValueError(f"{raw!r} is set by spectune; use {use_instead(owner)} instead")
        out[name] = item
    return out


def tree_capacity(*, num_steps: int, topk: int) -> int:
    """How many candidate tokens an EAGLE draft tree of this shape holds.

    The first step proposes ``topk`` tokens; each later step expands the ``topk`` best leaves by
    ``topk`` children, so the tree has ``topk + (num_steps - 1) * topk**2`` candidates. The
    verifier sees ``num_draft_tokens - 1`` of them (plus the root), so that many must exist.
    """
    return topk + (num_steps - 1) * topk * topk


def speculative_problem(
    *, num_steps: int | None, topk: int | None, num_draft_tokens: int | None
) -> str | None:
    """Say which of SGLang's speculative rules the triple breaks, or ``None``.

    Rules (SGLang ``ServerArgs``): all three set or none (SGLang's auto choice); topk == 1 is a
    chain, so num_draft_tokens == num_steps + 1; otherwise num_draft_tokens - 1 must not exceed
    the tree capacity.
    """
    given = {
        "speculative_num_steps": num_steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": num_draft_tokens,
    }
    unset = [k for k, v in given.items() if v is None]
    if 0 < len(unset) < 3:
        return (
            f"set all three speculative numbers or none (SGLang's auto choice); unset: {', '.join(unset)}"
        )
    if not unset:
        assert num_steps is not None and topk is not None and num_draft_tokens is not None
        if num_steps < 1 or topk < 1 or num_draft_tokens < 2:
            return (
                f"need speculative_num_steps >= 1, speculative_eagle_topk >= 1 and "
                f"speculative_num_draft_tokens >= 2 (got {num_steps}, {topk}, {num_draft_tokens})"
            )
        if topk == 1 and num_draft_tokens != num_steps + 1:
            return (
                f"speculative_eagle_topk=1 is a chain: speculative_num_draft_tokens must be "
                f"speculative_num_steps + 1 = {num_steps + 1}, got {num_draft_tokens}"
            )
        capacity = tree_capacity(num_steps=num_steps, topk=topk)
        if num_draft_tokens - 1 > capacity:
            return (
                f"speculative_num_draft_tokens={num_draft_tokens} needs {num_draft_tokens - 1} "
                f"candidates but a tree of num_steps={num_steps}, topk={topk} holds {capacity}; "
                f"use at most {capacity + 1}"
            )
    return None


class EngineConfig(BaseModel):
    """Everything needed to start one engine, in SGLang's flag names (``_`` for ``-``).

    The same object drives ``python -m sglang.launch_server`` and ``python -m serving.reference``;
    only the program differs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EngineKind = Field(description="Which engine: 'sglang' on GPUs or the CPU/GPU 'reference' engine.")
    model_path: str = Field(min_length=1, description="--model-path: HF repo/path (SGLang) or preset name (reference).")
    tp_size: int = Field(default=1, ge=1, le=64, description="--tp-size: tensor-parallel ranks (= GPUs per engine).")
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
        default=False, description="--disable-custom-all-reduce: route decode all-reduce through NCCL."
    )
    extra_args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="Further engine flags by SGLang name (e.g. mem_fraction_static: 0.85); true renders a bare flag.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for the engine and every worker it spawns (NCCL_* etc.)."
    )

    @field_validator("extra_args", mode="before")
    @classmethod
    def _normalise_extra_args(cls, value: object) -> object:
        return validated_extra_args(value, use_instead=lambda owner: f"the field {owner!r}")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        return nccl.validated_env(value)

    @model_validator(mode="after")
    def _check_speculative(self) -> "EngineConfig":
        numbers = (
            self.speculative_num_steps,
            self.speculative_eagle_topk,
            self.speculative_num_draft_tokens,
        )
        if self.speculative_algorithm is None:
            if any(n is not None for n in numbers) or self.speculative_draft_model_path:
                raise ValueError(
                    "speculative fields are set but speculative_algorithm is not; set it to EAGLE3 "
                    "(or EAGLE) or remove the speculative_* fields"
                )
            return self
        if not self.speculative_draft_model_path:
            raise ValueError(
                f"speculative_algorithm={self.speculative_algorithm} needs speculative_draft_model_path"
            )
        problem = speculative_problem(
            num_steps=self.speculative_num_steps,
            topk=self.speculative_eagle_topk,
            num_draft_tokens=self.speculative_num_draft_tokens,
        )
        if problem:
            raise ValueError(problem)
        return self

    @property
    def speculative(self) -> bool:
        """Whether speculative decoding is on."""
        return self.speculative_algorithm is not None
