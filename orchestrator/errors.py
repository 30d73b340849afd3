"""spectune's error hierarchy: few classes, messages that name the field, the value and the fix.

The root, ``SpectuneError``, and the engine errors are ``serving.errors``' (the lower layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.errors import SpectuneError

__all__ = ["BenchmarkError", "SpecError", "SpecProblem", "SpectuneError"]


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a sweep spec.

    Attributes:
        field: Dotted path of the offending field, e.g. ``search.nccl_env.NCCL_PROTO``.
        message: What is wrong and what is allowed.
    """

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class SpecError(SpectuneError, ValueError):
    """A sweep spec cannot be used. Holds every problem found, not just the first."""

    def __init__(self, problems: list[SpecProblem], *, source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid sweep spec {source}" if source else "invalid sweep spec"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{head} ({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n{lines}")


class BenchmarkError(SpectuneError):
    """A benchmark run could not produce a result (e.g. the server died mid-run)."""
