"""A node of rank >= 1 holds its health port from before its ranks start (they open sockets on ephemeral
ports, one of which could otherwise be the port the launcher picked: seen once in CI as "address already
in use"), and refuses connections on it until the health server listens."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import ClientSession, ClientConnectorError, web

from serving.ports import free_port
from serving.reference.follower import _bind, build_health_app


def test_the_port_is_held_refused_until_served_then_answers() -> None:
    port = free_port()

    async def scenario() -> int:
        held = _bind("127.0.0.1", port)
        try:
            for reuse in (False, True):  # nobody else can bind it meanwhile (an ephemeral port, say)
                with socket.socket() as other, pytest.raises(OSError):
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse))
                    other.bind(("127.0.0.1", port))
            async with ClientSession() as client:
                with pytest.raises(ClientConnectorError):  # bound, not listening: refused, as SGLang's node is
                    await client.get(f"http://127.0.0.1:{port}/health")
                runner = web.AppRunner(build_health_app(enable_metrics=False))
                await runner.setup()
                await web.SockSite(runner, held).start()
                try:
                    async with client.get(f"http://127.0.0.1:{port}/health") as resp:
                        return resp.status
                finally:
                    await runner.cleanup()
        finally:
            held.close()

    assert asyncio.run(scenario()) == 200


def test_a_taken_port_is_refused_at_once() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError):
            _bind("127.0.0.1", other.getsockname()[1])
