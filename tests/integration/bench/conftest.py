"""Servers for the benchmark tests: the HTTP-level test double and the shared reference engines.

The fake server (``bench_testing.FakeServer``) is one per session, reset around each test. The
reference-engine fixtures start real engines through the production ``EngineProcess`` (one per
session, shared by every test that needs it: startup costs seconds on two cores).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from bench_testing import FakeServer


@pytest.fixture(scope="session")
def _fake_server_instance() -> Iterator[FakeServer]:
    server = FakeServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def fake_server(_fake_server_instance: FakeServer) -> Iterator[FakeServer]:
    """A healthy, truthful fake speculative server (shared; reset around each test)."""
    _fake_server_instance.reset()
    yield _fake_server_instance
    _fake_server_instance.reset()


@pytest.fixture()
def dying_server() -> Iterator[FakeServer]:
    """A fake server of its own, for tests that kill it."""
    server = FakeServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def unused_url() -> Iterator[str]:
    """A URL where nothing listens: a port bound (to 0) but not listening refuses connections."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
