"""Fault switches of the reference engine, parsed from ``SPECTUNE_REFERENCE_FAULT``.

They let the code that launches engines test its failure paths against a real server; the
switches and their syntax are listed in docs/reference-engine.md ("Fault switches").
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping, Optional

from serving.environ import ENV
from serving.redaction import redact

__all__ = ["CORRUPTION", "CorruptedAllReduce", "EnvCondition", "Faults", "parse_faults", "perturb_verify_logits"]

CORRUPTION = 0.25
"""Share of each value's neighbour added to it by ``corrupt_allreduce_when`` (``@share=X`` sets another)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True, repr=False)
class EnvCondition:
    """``NAME=VALUE``: holds in an environment where ``NAME`` is set to exactly ``VALUE``."""

    name: str
    value: str

    def holds(self, environ: Mapping[str, str]) -> bool:
        return environ.get(self.name) == self.value

    def __str__(self) -> str:
        return f"{self.name}={redact(self.name, self.value)}"

    __repr__ = __str__


@dataclasses.dataclass(frozen=True)
class Faults:
    """The parsed switches; ``str()`` spells them as they were set."""

    crash_on_start: bool = False
    crash_on_start_speculative: bool = False
    hang_on_start: bool = False
    die_after_tokens: Optional[int] = None
    die_after_tokens_when: Optional[EnvCondition] = None
    die_after_steps: Optional[int] = None
    die_after_steps_node: Optional[int] = None
    die_after_steps_when: Optional[EnvCondition] = None
    late_env: tuple[str, ...] = ()
    corrupt_allreduce_when: Optional[EnvCondition] = None
    corruption_share: float = CORRUPTION
    perturb_verify: Optional[float] = None
    drop_fields: tuple[str, ...] = ()
    pcie_ipc_build_fails: bool = False

    @property
    def any(self) -> bool:
        return self != Faults()

    def tokens_before_death(self, environ: Mapping[str, str]) -> Optional[int]:
        """``die_after_tokens``'s N where it applies in ``environ`` (the server's), else None."""
        if self.die_after_tokens is None:
            return None
        if self.die_after_tokens_when is not None and not self.die_after_tokens_when.holds(environ):
            return None
        return self.die_after_tokens

    def steps_before_death(self, node_rank: int, environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
        """``die_after_steps``'s N if it is armed on node rank ``node_rank`` with ``environ`` (the
        node's engine process's; default ``os.environ``), else None."""
        if self.die_after_steps is None:
            return None
        if self.die_after_steps_node is not None and self.die_after_steps_node != node_rank:
            return None
        if self.die_after_steps_when is not None and not self.die_after_steps_when.holds(
                os.environ if environ is None else environ):
            return None
        return self.die_after_steps

    def __str__(self) -> str:
        parts = [name for name in ("crash_on_start", "hang_on_start", "pcie_ipc_build_fails") if getattr(self, name)]
        if self.crash_on_start_speculative:
            parts.append("crash_on_start@speculative")
        if self.die_after_tokens is not None:
            when = f"@{self.die_after_tokens_when}" if self.die_after_tokens_when is not None else ""
            parts.append(f"die_after_tokens:{self.die_after_tokens}{when}")
        if self.die_after_steps is not None:
            node = f"@node_rank={self.die_after_steps_node}" if self.die_after_steps_node is not None else ""
            when = f"@{self.die_after_steps_when}" if self.die_after_steps_when is not None else ""
            parts.append(f"die_after_steps:{self.die_after_steps}{node}{when}")
        if self.late_env:
            parts.append("late_env:" + ",".join(self.late_env))
        if self.corrupt_allreduce_when is not None:
            share = f"@share={self.corruption_share:g}" if self.corruption_share != CORRUPTION else ""
            parts.append(f"corrupt_allreduce_when:{self.corrupt_allreduce_when}{share}")
        if self.perturb_verify is not None:
            parts.append(f"perturb_verify:{self.perturb_verify:g}")
        if self.drop_fields:
            parts.append("drop_field:" + ",".join(self.drop_fields))
        return "; ".join(parts) or "(none)"


class CorruptedAllReduce:
    """A TP group whose all-reduce results are perturbed the same way on every rank."""

    def __init__(self, inner: Any, share: float = CORRUPTION) -> None:
        self.inner = inner
        self.share = share
        self.rank = inner.rank
        self.world_size = inner.world_size

    def all_reduce(self, tensor: Any) -> None:
        self.inner.all_reduce(tensor)
        tensor.add_(tensor.roll(1, -1), alpha=self.share)

    def broadcast_object(self, obj: Any) -> Any:
        return self.inner.broadcast_object(obj)


def parse_faults(value: Optional[str] = None) -> Faults:
    """Parse the switch (``SPECTUNE_REFERENCE_FAULT`` unless ``value`` is given).

    Raises:
        ValueError: an unknown switch or a bad argument, naming the variable and the value.
    """
    raw = ENV.SPECTUNE_REFERENCE_FAULT.get() if value is None else value
    name = ENV.SPECTUNE_REFERENCE_FAULT.name
    fields: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in raw.split(";"))):
        key, _, arg = item.partition(":")
        if key in ("crash_on_start", "hang_on_start", "pcie_ipc_build_fails") and not arg:
            fields[key] = True
        elif item == "crash_on_start@speculative":
            fields["crash_on_start_speculative"] = True
        elif key == "die_after_tokens":
            count, at, when = arg.partition("@")
            if not count.isdigit() or int(count) < 1:
                raise ValueError(
                    f"{name}: die_after_tokens needs a positive integer (die_after_tokens:N or "
                    f"die_after_tokens:N@NAME=VALUE), got {_shown(item)}"
                )
            fields[key] = int(count)
            fields["die_after_tokens_when"] = _condition(when, item=item, variable=name) if at else None
        elif key == "die_after_steps":
            count, *conditions = arg.split("@")
            node: Optional[int] = None
            when: Optional[EnvCondition] = None
            usage = (f"{name}: die_after_steps needs a positive integer and optionally a node rank and a variable "
                     f"(die_after_steps:N[@node_rank=R][@NAME=VALUE]), got {_shown(item)}")
            if not count.isdigit() or int(count) < 1 or len(conditions) > 2:
                raise ValueError(usage)
            for condition in conditions:
                cond_key, eq, value = condition.partition("=")
                if cond_key.strip() == "node_rank":
                    if not (eq and value.strip().isdigit()) or node is not None:
                        raise ValueError(usage)
                    node = int(value)
                elif when is None and "=" in condition and _NAME.match(cond_key.strip()):
                    when = _condition(condition, item=item, variable=name)
                else:
                    raise ValueError(usage)
            fields[key] = int(count)
            fields["die_after_steps_node"] = node
            fields["die_after_steps_when"] = when
        elif key == "late_env":
            names = tuple(n.strip() for n in arg.split(",") if n.strip())
            if not names:
                raise ValueError(f"{name}: late_env needs variable names (late_env:NAME[,NAME...]), got {item!r}")
            fields[key] = names
        elif key == "corrupt_allreduce_when":
            condition, at, share = arg.partition("@share=")
            fields[key] = _condition(condition, item=item, variable=name)
            if at:
                fields["corruption_share"] = _positive(share, item=item, usage=(
                    f"{name}: corrupt_allreduce_when's share must be a number > 0 "
                    "(corrupt_allreduce_when:NAME=VALUE@share=X)"))
        elif key == "drop_field":
            names = tuple(n.strip() for n in arg.split(",") if n.strip())
            if not names:
                raise ValueError(f"{name}: drop_field needs field names (drop_field:NAME[,NAME...]), got {item!r}")
            fields["drop_fields"] = names
        elif key == "perturb_verify":
            fields[key] = _positive(arg, item=item, usage=(
                f"{name}: perturb_verify needs a relative size > 0 (perturb_verify:X; 0.0039 is bf16's rounding)"))
        else:
            raise ValueError(
                f"{name}={_shown(raw)}: unknown fault {_shown(item)}; use crash_on_start[@speculative], hang_on_start, "
                "die_after_tokens:N[@NAME=VALUE], die_after_steps:N[@node_rank=R], late_env:NAME[,NAME...], "
                "corrupt_allreduce_when:NAME=VALUE[@share=X], perturb_verify:X, drop_field:NAME[,NAME...] or "
                "pcie_ipc_build_fails "
                "(';' combines several)"
            )
    return Faults(**fields)  # type: ignore[arg-type]


def _positive(text: str, *, item: str, usage: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{usage}, got {_shown(item)}")
    return value


def perturb_verify_logits(logits: Any, *, size: float, key: Any) -> Any:
    """``logits`` with each value scaled by ``1 + size * u``, ``u`` uniform in [-1, 1): what rounding
    to a precision of ``size`` does to the verify pass (bf16 rounds to 2**-8 = 0.0039).

    ``u`` is drawn from a generator seeded with ``key`` (the verified tokens and their positions),
    so every rank perturbs alike and a rerun gives the same output."""
    import zlib

    import torch

    generator = torch.Generator(device="cpu")
    generator.manual_seed(zlib.crc32(repr(key).encode()))
    noise = torch.rand(logits.shape, generator=generator, dtype=torch.float64) * 2 - 1
    return logits * (1 + size * noise.to(device=logits.device, dtype=logits.dtype))


def _condition(text: str, *, item: str, variable: str) -> EnvCondition:
    cond_name, eq, cond_value = text.partition("=")
    cond_name = cond_name.strip()
    if not eq or not _NAME.match(cond_name):
        raise ValueError(
            f"{variable}: {_shown(item)} needs a condition NAME=VALUE with NAME an environment "
            "variable name (letters, digits, '_')"
        )
    return EnvCondition(name=cond_name, value=cond_value)


def _shown(text: str) -> str:
    """``text`` quoted, with the value of any secret-looking ``NAME=VALUE`` in it redacted."""
    return repr(re.sub(r"([A-Za-z_][A-Za-z0-9_]*)=([^;@]*)", lambda m: f"{m[1]}={redact(m[1], m[2])}", text))
