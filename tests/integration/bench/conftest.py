"""Servers for the benchmark tests: the HTTP-level test double and the shared reference engines.

The fake server (``helpers.bench.FakeServer``) is one per session, reset around each test. The
reference-engine fixtures start real engines through the production ``EngineProcess`` (one per
session, shared by every test that needs it: startup costs seconds on two cores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

from helpers.bench import FakeServer, running_engine
from helpers.engine import reference_config

if TYPE_CHECKING:  # pragma: no cover
    from serving.engine.process import EngineProcess


@pytest.fixture(scope="session")
def _fake_server_instance() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


@pytest.fixture()
def fake_server(_fake_server_instance: FakeServer) -> Iterator[FakeServer]:
    """A healthy, truthful fake speculative server (shared; reset around each test)."""
    _fake_server_instance.reset()
    yield _fake_server_instance
    _fake_server_instance.reset()


@pytest.fixture()
def dying_server() -> Iterator[FakeServer]:
    """A fake server of its own, for tests that kill it."""
    with FakeServer() as server:
        yield server


@pytest.fixture()
def unused_url() -> Iterator[str]:
    """A URL where nothing listens: a port bound (to 0) but not listening refuses connections."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="session")
def reference_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator["EngineProcess"]:
    """One speculative reference engine shared by every test of the session."""
    config = reference_config(speculative=True, enable_metrics=True)
    with running_engine(config, tmp_path_factory.mktemp("ref-spec")) as engine:
        yield engine


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Put the engine's log tail into the report of a failed test that used it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for name in ("reference_engine",):
            engine = getattr(item, "funcargs", {}).get(name)
            if engine is not None:
                report.sections.append((f"{name} log tail ({engine.log_path})", engine.log_tail(60)))
