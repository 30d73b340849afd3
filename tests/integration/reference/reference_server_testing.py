"""Helpers for the reference engine's server tests (imported by name: pytest puts this folder on
sys.path). Servers are started through the production ``EngineProcess`` (own session, log file,
free port, health polling that checks ``poll()`` and quotes the log tail, tree-proof teardown)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import aiohttp
import psutil

from serving.engine.command import EngineCommand
from serving.engine.process import EngineProcess
from serving.ports import free_port

PRESET = "ref-tiny"


def reference_process(
    *flags: str, log_dir: Path, env: Optional[Mapping[str, str]] = None, start_timeout_s: float = 120.0
) -> EngineProcess:
    """An (unstarted) reference engine on a free port with extra ``flags``."""
    port = free_port()
    argv = [sys.executable, "-m", "serving.reference", "--model-path", PRESET, "--port", str(port), *flags]
    command = EngineCommand(argv=argv, env=dict(env or {}), host="127.0.0.1", port=port)
    return EngineProcess(command=command, log_path=log_dir / f"reference-{port}.log", start_timeout_s=start_timeout_s)


@contextmanager
def running_server(*flags: str, log_dir: Path, env: Optional[Mapping[str, str]] = None) -> Iterator[EngineProcess]:
    """A healthy reference engine for the duration of the block (stopped and proven gone after)."""
    engine = reference_process(*flags, log_dir=log_dir, env=env)
    with engine:
        yield engine


def http(
    engine: EngineProcess, path: str, body: Optional[Any] = None, *, raw: Optional[bytes] = None, timeout_s: float = 60.0
) -> tuple[int, Any]:
    """One request; returns (status, parsed JSON or text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(engine.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def sse_events(engine: EngineProcess, path: str, body: Any, *, timeout_s: float = 60.0) -> list[Any]:
    """POST a streaming request; return the decoded ``data:`` events ("[DONE]" as a string)."""
    req = urllib.request.Request(
        engine.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    events: list[Any] = []
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[len(b"data: "):].decode()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def generate_concurrently(engine: EngineProcess, bodies: Sequence[Any], *, timeout_s: float = 120.0) -> list[Any]:
    """POST every body to /generate at once (one aiohttp session); return the JSON answers."""

    async def run() -> list[Any]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(body: Any) -> Any:
                async with session.post(engine.url + "/generate", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    return await resp.json()

            return list(await asyncio.gather(*(one(b) for b in bodies)))

    return asyncio.run(run())


def worker_processes(engine: EngineProcess) -> list[psutil.Process]:
    """The server's TP workers (children named ``ref::tp<r>``)."""
    return [c for c in psutil.Process(engine.pid).children() if c.name().startswith("ref::tp")]


def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return dict(
            entry.decode(errors="replace").split("=", 1) for entry in handle.read().split(b"\0") if b"=" in entry
        )


def port_open(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def python_env(**extra: str) -> dict[str, str]:
    """This environment plus ``extra`` (for launching with additional variables)."""
    env = dict(os.environ)
    env.update(extra)
    return env
