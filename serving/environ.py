"""spectune's own environment variables: one typed registry, read when used (standard library only).

Every variable spectune reads is declared here once, with its type, default and meaning; an
undeclared name is an ``AttributeError`` at the call site. Values are read from ``os.environ`` on
each ``get()``, never at import::

    from serving.environ import ENV
    fault = ENV.SPECTUNE_REFERENCE_FAULT.get()
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Generic, Iterator, Mapping, Optional, TypeVar

__all__ = ["ENV", "EnvVar", "Registry", "parse_bool"]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(text: str) -> bool:
    """Parse the usual spellings of a boolean; anything else is an error naming the value."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


@dataclasses.dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, how to parse it, its default and what it does.

    Attributes:
        name: The variable's name in the environment.
        parse: Turns the raw string into a typed value; raises ``ValueError`` on bad input.
        default: The value when the variable is unset (or set to the empty string).
        doc: One or two sentences for the documentation and ``--help`` style listings.
    """

    name: str
    parse: Callable[[str], T]
    default: T
    doc: str

    def get(self, environ: Optional[Mapping[str, str]] = None) -> T:
        """Read and parse the current value (from ``os.environ`` unless a mapping is given).

        Raises:
            ValueError: the variable is set to something ``parse`` rejects; the message names
                the variable and the value.
        """
        source = os.environ if environ is None else environ
        raw = source.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"environment variable {self.name}={raw!r} is invalid: {exc}") from exc

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """Whether the variable is present and non-empty."""
        source = os.environ if environ is None else environ
        return bool(source.get(self.name))


class Registry:
    """The set of declared variables, reachable as attributes (``ENV.SPECTUNE_...``)."""

    def __init__(self, *variables: EnvVar) -> None:
        self._vars = {}
        for var in variables:
            if var.name in self._vars:
                raise ValueError(f"environment variable {var.name} is declared twice")
            self._vars[var.name] = var

    def __getattr__(self, name: str) -> EnvVar:
        try:
            return self.__dict__["_vars"][name]
        except KeyError:
            raise AttributeError(f"no spectune environment variable named {name!r}") from None

    def __iter__(self) -> Iterator[EnvVar]:
        return iter(self._vars.values())

    def __contains__(self, name: object) -> bool:
        return name in self._vars


ENV = Registry(
    EnvVar(
        name="SPECTUNE_REFERENCE_FAULT",
        parse=str,
        default="",
        doc=(
            "Fault switch of the reference engine (serving.reference), for tests of the failure "
            "paths of whatever launches it. One of: 'crash_on_start' (exit 1 before serving; '@speculative': only a speculative engine), "
            "'hang_on_start' (spawn the workers, then never become healthy), "
            "'die_after_tokens:N' (the server process exits hard once it has emitted N tokens in "
            "total; 'die_after_tokens:N@NAME=VALUE' only where the server's environment has "
            "NAME=VALUE), 'late_env:NAME[,NAME...]' (hide those variables from the TP workers: they are "
            "popped from os.environ while the workers are spawned and restored afterwards), "
            "'corrupt_allreduce_when:NAME=VALUE' (TP workers whose own environment has NAME=VALUE "
            "perturb every all-reduce result: outputs change, the server stays healthy). ';' "
            "combines switches. Empty: no fault."
        ),
    ),
    EnvVar(
        name="SPECTUNE_REFERENCE_TORCH_THREADS",
        parse=int,
        default=0,
        doc=(
            "Intra-op torch threads per reference-engine TP worker. 0 (default) means 1: the "
            "reference models' kernels are tiny, and on a 2-core machine two OpenMP threads per "
            "worker decoded ~10x slower than one; TP ranks are the way to use more cores."
        ),
    ),
    EnvVar(
        name="SPECTUNE_SWEEP_FAULT",
        parse=str,
        default="",
        doc=(
            "Fault switch of the sweep's trials, for tests of the env audit: "
            "'env_in_driver_only:NAME' sets NAME in the trial process's own environment (\"the "
            "driver's shell\") instead of the engine host's runtime_env, so the variable never "
            "reaches the engine and the audit must fail the trial (reason env_audit). Empty: no fault."
        ),
    ),
    EnvVar(
        name="SPECTUNE_RESULTS_ROOT",
        parse=str,
        default="",
        doc=(
            "Where a sweep run by `ray job submit --working-dir` puts a relative results_dir (the "
            "job's working directory is a temporary copy): default ~/spectune-results."
        ),
    ),
    EnvVar(
        name="SPECTUNE_QUIET_LIMIT_S",
        parse=float,
        default=30.0,
        doc=(
            "Longest a sweep's job log stays silent: after this many seconds without a trial event, "
            "the driver prints what it is waiting for (a trial's engine, a free node, a confirmation "
            "visit), and again every as many seconds. Default 30."
        ),
    ),
    EnvVar(
        name="SPECTUNE_API_KEY",
        parse=str,
        default="",
        doc=(
            "API key `spectune serve` requires from clients (as `Authorization: Bearer <key>`) when "
            "`--api-key` is not given. Empty: no key. Read by the CLI only; replicas receive the "
            "key's SHA-256, never the key."
        ),
    ),
)
