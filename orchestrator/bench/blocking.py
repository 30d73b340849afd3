"""The blocking twin of a coroutine function, made in one line instead of copied by hand.

``run_probe = blocking(arun_probe)`` is a function that runs ``arun_probe`` to completion in a new
event loop (``asyncio.run``) and returns its result. Its signature *is* ``arun_probe``'s: the
parameters are not repeated, so one added to the coroutine function reaches the blocking twin
without a second copy to forget. ``functools.wraps`` sets ``__wrapped__``, which
``inspect.signature`` and ``help()`` follow, so a reader still sees every keyword-only parameter;
the ``ParamSpec`` gives type checkers the same. The docstring is the coroutine function's, under a
first line that says the twin blocks.

The twin's name is the coroutine function's without its leading ``a`` (``arun_probe`` ->
``run_probe``), the convention this package follows; bind it to that name at module level, so
pickling by reference (Ray ships functions that way) finds the twin and not the coroutine
function.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, Coroutine, ParamSpec, TypeVar

__all__ = ["blocking"]

P = ParamSpec("P")
R = TypeVar("R")


def blocking(afn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, R]:
    """The blocking twin of the coroutine function ``afn`` (see the module docstring).

    Args:
        afn: An ``async def`` whose name starts with ``a`` (``arun_benchmark``).

    Returns:
        A function taking ``afn``'s arguments that returns what ``afn`` returns; called from a
        running event loop it raises ``RuntimeError`` (``asyncio.run``'s rule), so async callers
        use ``afn``.

    Raises:
        ValueError: ``afn`` is not a coroutine function or its name does not start with ``a``.
    """
    if not inspect.iscoroutinefunction(afn):
        raise ValueError(f"blocking() takes an async def; {afn!r} is not one")
    if not afn.__name__.startswith("a"):
        raise ValueError(f"blocking(): {afn.__name__!r} should be named a<name> so its twin can be <name>")
    name = afn.__name__[1:]

    @functools.wraps(afn)
    def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return asyncio.run(afn(*args, **kwargs))

    twin.__name__ = name
    twin.__qualname__ = afn.__qualname__[: -len(afn.__name__)] + name
    twin.__doc__ = (
        f"Blocking :func:`{afn.__name__}`: runs it in a new event loop (``asyncio.run``), for callers "
        f"not already in one.\n\n{inspect.cleandoc(afn.__doc__ or '')}"
    )
    return twin
