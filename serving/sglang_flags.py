"""SGLang's server flags, as SGLang's own parser registers them (data, no sglang import).

Reads ``serving/data/sglang_server_flags.json``, generated from SGLang's parser by
``scripts/write_sglang_flags.py``, so a flag SGLang's launcher would refuse or misread is caught when a
spec or config is loaded.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

__all__ = ["SglangFlag", "SglangFlags", "close_matches", "flag_problem", "sglang_flags"]

DATA_FILE = "sglang_server_flags.json"


@dataclass(frozen=True)
class SglangFlag:
    """One option string of SGLang's server parser.

    Attributes:
        name: The option string (``--tp-size``; aliases are entries of their own).
        dest: The ``ServerArgs`` field it sets.
        option_strings: Every spelling of the same action (the canonical one first).
        takes_value: False for switches (``store_true``, ``nargs=0``).
        nargs: argparse's ``nargs`` (None: exactly one value; ``"+"``, ``"*"``: a list).
        deprecated: SGLang marks it deprecated (a ``Deprecated*Action`` or a "Deprecated" help).
        help: The first line of its help text.
        use_instead: What SGLang's deprecation warning points to, where it names one.
    """

    name: str
    dest: str
    option_strings: tuple[str, ...]
    takes_value: bool
    nargs: int | str | None
    deprecated: bool
    help: str
    use_instead: str | None = None


@dataclass(frozen=True)
class SglangFlags:
    """The whole list: ``version`` and ``flags`` by option string."""

    version: str
    flags: Mapping[str, SglangFlag]

    @property
    def names(self) -> frozenset[str]:
        """Every option string, aliases included (``--model`` as well as ``--model-path``)."""
        return frozenset(self.flags)

    @property
    def deprecated(self) -> frozenset[str]:
        """Option strings SGLang marks deprecated."""
        return frozenset(name for name, flag in self.flags.items() if flag.deprecated)

    @property
    def accepted(self) -> frozenset[str]:
        """What a command line may carry: every option string but the deprecated ones and ``--help``."""
        return frozenset(name for name, flag in self.flags.items() if not flag.deprecated and flag.dest != "help")


def close_matches(name: str, candidates: frozenset[str] | set[str], *, n: int = 3) -> list[str]:
    """Names in ``candidates`` like ``name`` (a typo or an abbreviation), for a did-you-mean; names it
    is a prefix of come first."""
    prefixed = sorted(flag for flag in candidates if flag.startswith(name) and flag != name)
    similar = difflib.get_close_matches(name, sorted(candidates), n=n, cutoff=0.75)
    return prefixed[:n] if prefixed else similar


def _load(data: Mapping[str, Any]) -> SglangFlags:
    flags = {
        name: SglangFlag(
            name=name,
            dest=entry["dest"],
            option_strings=tuple(entry["option_strings"]),
            takes_value=bool(entry["takes_value"]),
            nargs=entry["nargs"],
            deprecated=bool(entry["deprecated"]),
            help=entry.get("help", ""),
            use_instead=entry.get("use_instead"),
        )
        for name, entry in data["flags"].items()
    }
    return SglangFlags(version=data["sglang_version"], flags=flags)


@functools.cache
def sglang_flags() -> SglangFlags:
    """The list shipped with spectune (read once; the file is package data of ``serving.data``)."""
    text = resources.files("serving").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    return _load(json.loads(text))


def flag_problem(flag: str, *, accepted: frozenset[str] | None = None, engine: str = "SGLang") -> str | None:
    """Why ``flag`` (an option string, ``--tp-size``) must not be on an engine's command line, or None.

    Exact names only: a prefix is refused even where SGLang would read it as the longer flag.

    Args:
        flag: The option string as it would be rendered.
        accepted: The names the engine takes (default: ``SglangFlags.accepted``).
        engine: The engine's name, for the message.
    """
    table = sglang_flags()
    accepted = table.accepted if accepted is None else accepted
    if flag in accepted:
        return None
    known = table.flags.get(flag)
    if known is not None and known.deprecated:
        hint = f"; use {known.use_instead} instead" if known.use_instead else f": {known.help}"
        return f"{flag} is deprecated in SGLang {table.version}{hint}"
    if known is not None and known.dest == "help":
        return f"{flag} prints the help and exits; it is not an engine setting"
    matches = close_matches(flag, accepted)
    hint = f"; did you mean {' or '.join(matches)}?" if matches else ""
    if sum(name.startswith(flag) for name in accepted) > 1:
        return f"{flag} is not a flag of {engine}, only a prefix of several (argparse refuses it as ambiguous){hint}"
    version = f" {table.version}" if engine == "SGLang" else ""
    return f"{flag} is not a flag of {engine}{version}{hint}"
