"""``blocking``: the sync twins keep their names, signatures and docstrings, and pickle as themselves."""

from __future__ import annotations

import inspect
import pickle

import pytest

from orchestrator.bench.blocking import blocking
from orchestrator.bench.probe import arun_probe, run_probe
from orchestrator.bench.runner import arun_benchmark, run_benchmark


async def aadd(*, x: int, y: int = 2) -> int:
    """Add."""
    return x + y


def test_the_twin_returns_the_coroutine_result_and_takes_its_keywords() -> None:
    add = blocking(aadd)
    assert add(x=1) == 3 and add(x=1, y=5) == 6
    with pytest.raises(TypeError):
        add(1)  # keyword-only, as the coroutine function


@pytest.mark.parametrize(("twin", "afn"), [(run_probe, arun_probe), (run_benchmark, arun_benchmark)])
def test_public_twins_read_like_hand_written_functions(twin: object, afn: object) -> None:
    assert twin.__name__ == afn.__name__[1:] and twin.__qualname__ == twin.__name__  # type: ignore[attr-defined]
    assert inspect.signature(twin) == inspect.signature(afn)  # type: ignore[arg-type]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in inspect.signature(twin).parameters.values())  # type: ignore[arg-type]
    doc = inspect.getdoc(twin) or ""
    assert doc.startswith("Blocking :func:") and inspect.getdoc(afn) in doc  # type: ignore[operator]
    assert pickle.loads(pickle.dumps(twin)) is twin  # by reference, to the twin, not the coroutine function


def test_only_a_named_coroutine_functions_get_twins() -> None:
    with pytest.raises(ValueError, match="async def"):
        blocking(lambda: None)  # type: ignore[arg-type]

    async def probe() -> None: ...

    with pytest.raises(ValueError, match="a<name>"):
        blocking(probe)
