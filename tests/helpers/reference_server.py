"""Reference-engine servers for the reference engine's server tests, and how to talk to them.

Servers are started through the production ``EngineProcess`` (own session, log file, free port,
health polling that checks ``poll()`` and quotes the log tail, tree-proof teardown), or in this
process (``in_process_server``: the production app, engine client and TP worker processes, wired
as ``serving.reference.server.serve`` wires them) where a test must reach into the app or throw
many requests cheaply."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Mapping, Optional, Protocol, Sequence

import aiohttp
import psutil
from aiohttp import web

from serving.engine.command import EngineCommand
from serving.engine.process import EngineProcess
from serving.ports import free_port
from serving.reference.http_common import AppState
from serving.reference.http_server import build_app
from serving.reference.launcher import WorkerGroup
from serving.reference.server import attach_engine, new_state, runner, warm_up
from serving.reference.server_args import parse_args

PRESET = "ref-tiny"


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


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


def node_processes(
    *flags: str, nnodes: int, log_dir: Path, envs: Sequence[Mapping[str, str]], start_timeout_s: float = 120.0
) -> list[EngineProcess]:
    """One (unstarted) reference engine across ``nnodes`` nodes on this machine: an EngineProcess
    per node rank (``envs[r]`` its environment), each on a free port, all meeting at one free
    ``--dist-init-addr`` port on 127.0.0.1, as each node's launcher renders its own command."""
    dist_init_addr = f"127.0.0.1:{free_port()}"
    return [
        reference_process(*flags, "--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", dist_init_addr,
                          log_dir=log_dir, env=envs[rank], start_timeout_s=start_timeout_s)
        for rank in range(nnodes)
    ]


@contextmanager
def running_nodes(
    *flags: str, nnodes: int, log_dir: Path, envs: Sequence[Mapping[str, str]]
) -> Iterator[list[EngineProcess]]:
    """A healthy engine across ``nnodes`` nodes (``node_processes``) for the block: every node
    started, then each waited for; stopped node 0 first (the others end with its shutdown
    broadcast) and every tree proven gone."""
    engines = node_processes(*flags, nnodes=nnodes, log_dir=log_dir, envs=envs)
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_healthy()
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def http(
    engine: HasUrl,
    path: str,
    body: Optional[Any] = None,
    *,
    raw: Optional[bytes] = None,
    content_type: str = "application/json",
    method: Optional[str] = None,
    timeout_s: float = 60.0,
) -> tuple[int, Any]:
    """One request; returns (status, parsed JSON or text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(engine.url + path, data=data, headers={"Content-Type": content_type}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def sse_events(engine: HasUrl, path: str, body: Any, *, timeout_s: float = 60.0) -> list[Any]:
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


def generate_concurrently(engine: HasUrl, bodies: Sequence[Any], *, timeout_s: float = 120.0) -> list[Any]:
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


def metric_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` in Prometheus text, over every label set that has
    ``labels`` (0 when there is none): how SGLang's own clients read a counter, e.g.
    ``get_cache_tokens_from_metrics`` in ``python/sglang/bench_one_batch_server.py`` adds up every
    ``sglang:prompt_tokens_total{...}`` line, whatever its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def worker_processes(engine: EngineProcess) -> list[psutil.Process]:
    """The server's TP workers (children named ``ref::tp<r>``)."""
    return [c for c in psutil.Process(engine.pid).children() if c.name().startswith("ref::tp")]


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


PrepareHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


@dataclasses.dataclass
class InProcessServer:
    """A reference engine whose HTTP side runs in this process (on a thread of its own)."""

    url: str
    state: AppState
    workers: WorkerGroup
    fatal: list[str]
    """Why the engine would have exited (a dead or failed worker); empty while it is fine."""


@contextmanager
def in_process_server(*flags: str, on_response_prepare: Sequence[PrepareHook] = ()) -> Iterator[InProcessServer]:
    """A ready reference engine (``ref-tiny`` plus ``flags``) served from a thread of this process.

    ``on_response_prepare`` hooks are added to the app (aiohttp's signal), e.g. to drop a
    connection at a chosen moment.
    """
    args = parse_args(["--model-path", PRESET, "--host", "127.0.0.1", "--port", str(free_port()), *flags])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="in-process-reference", daemon=True)
    thread.start()
    fatal: list[str] = []
    state = new_state(args)
    app = build_app(state)
    for hook in on_response_prepare:
        app.on_response_prepare.append(hook)
    app_runner = runner(app)
    workers = WorkerGroup(args=args)

    async def start() -> None:
        await app_runner.setup()
        await web.TCPSite(app_runner, host=args.host, port=args.port).start()
        workers.start()
        ready = await loop.run_in_executor(None, lambda: workers.wait_ready(timeout_s=120))
        client = attach_engine(state, workers, ready, die_after_tokens=None, on_fatal=fatal.append, loop=loop)
        assert await warm_up(client), fatal
        state.ready = True

    async def stop() -> None:
        state.ready = False
        if state.client is not None:
            state.client.stop()
        await loop.run_in_executor(None, lambda: workers.stop(grace_s=5.0))
        await app_runner.cleanup()

    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=180)
        yield InProcessServer(url=f"http://{args.host}:{args.port}", state=state, workers=workers, fatal=fatal)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
