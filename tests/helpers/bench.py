"""Test doubles for the benchmark tests, and the reference engines they measure.

``FakeServer`` is a small aiohttp app speaking enough of SGLang's API (``/generate`` with SSE,
``/server_info``, ``/flush_cache``, ``/health_generate``) and of OpenAI's (``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``) to exercise every path of the harness in milliseconds:
a server that lies about its accept length, 5xx answers, dropped streams, hangs, a plain OpenAI
server without speculative fields, a server that dies mid-run, one that is slow until warmed at each
concurrency level, one whose accept length changes from flush to flush. It runs on its own event loop in a
background thread, bound to port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from aiohttp import web

if TYPE_CHECKING:  # pragma: no cover
    from serving.engine.process import EngineProcess


@dataclass
class Behaviour:
    """How the fake server behaves; tests change fields before sending load.

    Attributes:
        accept_length: Tokens each verify cycle emits (bonus included): the truth.
        reported_accept_length: What /server_info claims once there are verify cycles to report
            (like SGLang, no value before that); None reports the truth.
        reset_on_flush: /flush_cache resets the speculative counters (SGLang 0.5.23, the
            reference engine); False keeps lifetime totals, as some older SGLang versions did.
        decode_log_interval: Reported in /server_info like SGLang's server arg (None: not
            reported). The fake folds a request's cycles into its totals when the request ends,
            so 1 is the truth: any decoding at all moves the lifetime mean.
        speculative: Report spec_verify_ct / avg_spec_accept_length at all.
        native: Serve SGLang's native endpoints (False: a plain OpenAI server, 404 on them).
        fail_every: Every n-th generation request answers HTTP 500 (0: never).
        drop_every: Every n-th stream is cut after its first chunk (0: never).
        hang_every: Every n-th request never answers (0: never).
        fail_text: The body of the HTTP 500 answers.
        output_text: Generated text to return instead of the letters derived from the token ids
            (non-streamed only; the native API then returns no output_ids, so text is compared).
        on_request: Called (on the server's thread) as each generation request arrives.
        error_event_every: Every n-th stream sends SGLang's ``{"error": ...}`` event (0: never).
        die_after: After this many generation requests the server stops listening and drops
            every connection (None: never).
        flush_drops: /flush_cache closes the connection without answering (a failed flush).
        token_delay_s: Pause between chunks (0: as fast as possible).
        vary_output: Make the output depend on this value (a "different seed").
        cold_requests_per_level: An engine that warms per batch size (as CUDA graphs are captured per
            size): whenever the number of requests in flight reaches a new high, the next this many
            requests to arrive (the one that set the high included) are cold, pausing
            ``cold_delay_s`` between chunks instead of ``token_delay_s`` (0: never cold).
        cold_delay_s: The pause between chunks of a cold request.
        accept_lengths_per_flush: The accept length after each /flush_cache, cycled (the first
            applies from the first flush on; ``accept_length`` before it): repetitions that differ, in
            a known way, without depending on timing.
    """

    accept_length: int = 3
    reported_accept_length: float | None = None
    reset_on_flush: bool = True
    speculative: bool = True
    native: bool = True
    fail_every: int = 0
    drop_every: int = 0
    hang_every: int = 0
    fail_text: str = "fake internal error"
    output_text: str | None = None
    on_request: Callable[[], None] | None = None
    decode_log_interval: int | None = 1
    error_event_every: int = 0
    die_after: int | None = None
    flush_drops: bool = False
    token_delay_s: float = 0.0
    vary_output: int = 0
    cold_requests_per_level: int = 0
    cold_delay_s: float = 0.05
    accept_lengths_per_flush: list[int] = field(default_factory=list)


@dataclass
class _Counters:
    requests: int = 0
    in_flight: int = 0
    decode_tokens: int = 0
    verify_cycles: int = 0
    flushes: int = 0
    max_in_flight: int = 0
    prompts: list[str] = field(default_factory=list)
    peak_in_flight: int = 0
    cold_left: int = 0
    cold_requests: list[int] = field(default_factory=list)
    """Numbers (1, 2, ... in order of arrival) of the requests that were cold."""


class FakeServer:
    """The fake SGLang/OpenAI server; ``url`` is its base URL."""

    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.counters = _Counters()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-sglang", daemon=True)
        self._hangs: list[asyncio.Future] = []
        self._dead = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "FakeServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health_generate", self._native(self._health))
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._native(self._server_info))
        app.router.add_get("/get_server_info", self._native(self._server_info))
        app.router.add_post("/flush_cache", self._native(self._flush))
        app.router.add_post("/generate", self._native(self._generate))
        app.router.add_post("/v1/completions", self._openai)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def reset(self) -> None:
        """Back to a healthy, truthful speculative server with fresh counters."""
        self.behaviour = Behaviour()
        self.counters = _Counters()
        self._release_hangs()

    def _release_hangs(self) -> None:
        def release() -> None:
            for fut in self._hangs:
                if not fut.done():
                    fut.set_result(None)
            self._hangs.clear()

        self._loop.call_soon_threadsafe(release)

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._release_hangs()
        if self._runner is not None and not self._dead:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _die(self, request: web.Request) -> None:
        """Stop listening and close every connection, like a crashed process."""
        assert self._runner is not None
        if request.transport is not None:
            request.transport.close()
        if not self._dead:
            self._dead = True
            self._cleanup_task = asyncio.get_running_loop().create_task(self._runner.cleanup())

    # --- helpers -----------------------------------------------------------------------------

    def _native(self, handler):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            if not self.behaviour.native:
                raise web.HTTPNotFound()
            return await handler(request)

        return wrapped

    def _tokens(self, prompt: str, count: int) -> list[int]:
        """Deterministic "generation": token ids from the prompt, the position and vary_output."""
        base = sum(prompt.encode()) + 7919 * self.behaviour.vary_output
        return [(base + 31 * i) % 250 + 3 for i in range(count)]

    def _chunks(self, count: int) -> list[int]:
        """Tokens per streamed chunk: 1 from prefill, then accept_length per verify cycle."""
        sizes = [1] if count else []
        left = count - 1
        step = self.behaviour.accept_length if self.behaviour.speculative else 1
        while left > 0:
            sizes.append(min(step, left))
            left -= sizes[-1]
        return sizes

    async def _begin(self, request: web.Request) -> int:
        c = self.counters
        c.requests += 1
        number = c.requests
        b = self.behaviour
        if b.on_request is not None:
            b.on_request()
        if self._dead or (b.die_after is not None and number > b.die_after):
            self._die(request)
            raise ConnectionResetError("fake server died")
        if b.hang_every and number % b.hang_every == 0:
            fut = asyncio.get_running_loop().create_future()
            self._hangs.append(fut)
            await fut
        if b.fail_every and number % b.fail_every == 0:
            raise web.HTTPInternalServerError(text=b.fail_text)
        return number

    # --- endpoints ---------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _server_info(self, request: web.Request) -> web.Response:
        c, b = self.counters, self.behaviour
        if not b.speculative or not c.verify_cycles:
            accept = None
        elif b.reported_accept_length is not None:
            accept = b.reported_accept_length
        else:
            accept = c.decode_tokens / c.verify_cycles
        return web.json_response(
            {
                "model_path": "fake-model",
                "tp_size": 1,
                "speculative_algorithm": "EAGLE3" if b.speculative else None,
                "speculative_num_steps": 2 if b.speculative else None,
                "internal_states": [{"last_gen_throughput": 0.0, "avg_spec_accept_length": accept}],
                "version": "fake",
                **({"decode_log_interval": b.decode_log_interval} if b.decode_log_interval is not None else {}),
            }
        )

    async def _flush(self, request: web.Request) -> web.Response:
        if self.behaviour.flush_drops:
            request.transport.close()  # type: ignore[union-attr]
            raise ConnectionResetError("fake flush dropped")
        if self.counters.in_flight:
            return web.Response(status=400, text="Cache not flushed: there are running requests")
        if self.behaviour.reset_on_flush:
            self.counters.decode_tokens = self.counters.verify_cycles = 0
        self.counters.flushes += 1
        schedule = self.behaviour.accept_lengths_per_flush
        if schedule:
            self.behaviour.accept_length = schedule[(self.counters.flushes - 1) % len(schedule)]
        return web.Response(text="Cache flushed.")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        number = await self._begin(request)
        c, b = self.counters, self.behaviour
        c.in_flight += 1
        c.max_in_flight = max(c.max_in_flight, c.in_flight)
        delay_s = self._chunk_delay(number)
        try:
            params = body.get("sampling_params") or {}
            count = int(params.get("max_new_tokens", 16))
            text_in = body.get("text", "")
            c.prompts.append(text_in)
            ids = self._tokens(text_in, count)
            sizes = self._chunks(count)
            cycles = len(sizes) - 1 if b.speculative else 0
            meta_final: dict[str, Any] = {
                "id": f"req-{number}",
                "prompt_tokens": len(text_in.encode()),
                "completion_tokens": count,
                "finish_reason": {"type": "length", "length": count},
                "e2e_latency": 0.01,
            }
            if b.speculative:
                meta_final["spec_verify_ct"] = cycles
                meta_final["spec_accept_length"] = count / cycles if cycles else 1.0
            if not body.get("stream"):
                self._account(count, cycles)
                if b.output_text is not None:
                    return web.json_response({"text": b.output_text, "meta_info": meta_final})
                return web.json_response(
                    {"text": "".join(chr(97 + i % 26) for i in ids), "output_ids": ids, "meta_info": meta_final}
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            sent = 0
            for index, size in enumerate(sizes):
                if b.drop_every and number % b.drop_every == 0 and index == 1:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if b.error_event_every and number % b.error_event_every == 0 and index == 1:
                    await resp.write(b'data: {"error": {"message": "fake out of memory"}}\n\n')
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                sent += size
                last = index == len(sizes) - 1
                meta = dict(meta_final) if last else {
                    "id": f"req-{number}", "prompt_tokens": meta_final["prompt_tokens"],
                    "completion_tokens": sent, "finish_reason": None,
                }
                event = {"text": "".join(chr(97 + i % 26) for i in ids[:sent]), "output_ids": ids[sent - size:sent],
                         "meta_info": meta}
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                if delay_s:
                    await asyncio.sleep(delay_s)
            await resp.write(b"data: [DONE]\n\n")
            self._account(count, cycles)
            return resp
        finally:
            c.in_flight -= 1

    def _chunk_delay(self, number: int) -> float:
        """The pause between this request's chunks: ``cold_delay_s`` while the level is cold."""
        c, b = self.counters, self.behaviour
        if b.cold_requests_per_level and c.in_flight > c.peak_in_flight:
            c.peak_in_flight = c.in_flight
            c.cold_left = b.cold_requests_per_level
        if c.cold_left > 0:
            c.cold_left -= 1
            c.cold_requests.append(number)
            return b.cold_delay_s
        return b.token_delay_s

    def _account(self, count: int, cycles: int) -> None:
        if self.behaviour.speculative and count:
            self.counters.decode_tokens += count - 1
            self.counters.verify_cycles += cycles

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        number = await self._begin(request)
        chat = request.path.endswith("/chat/completions")
        count = int(body.get("max_tokens", 16))
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        ids = self._tokens(prompt, count)
        usage = {"prompt_tokens": len(prompt.encode()), "completion_tokens": count, "total_tokens": 0}
        if not body.get("stream"):
            text = self.behaviour.output_text or "".join(chr(97 + i % 26) for i in ids)
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return web.json_response({"id": f"cmpl-{number}", "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, token in enumerate(ids):
            piece = chr(97 + token % 26)
            choice = {"index": 0, "finish_reason": "length" if i == count - 1 else None}
            choice.update({"delta": {"content": piece}} if chat else {"text": piece})
            await resp.write(b"data: " + json.dumps({"id": f"cmpl-{number}", "choices": [choice], "usage": None}).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + json.dumps({"id": f"cmpl-{number}", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@contextlib.contextmanager
def logged(logger: str, level: int = logging.WARNING) -> Iterator[list[logging.LogRecord]]:
    """The records of ``level`` and above that ``logger`` (and its children) emit meanwhile.

    A handler on the logger itself, so records are seen whether or not they propagate to the root
    (the CLI turns propagation off), and each record once.
    """
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append  # type: ignore[method-assign]
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield records
    finally:
        target.removeHandler(handler)


def expected_accept_length(*, tokens: int, accept_length: int) -> float:
    """Tokens per verify cycle of the fake server for one request of ``tokens`` tokens."""
    cycles = math.ceil((tokens - 1) / accept_length)
    return (tokens - 1) / cycles


# --- reference engines (real servers, started through the production EngineProcess) ----------
# Their config is the one shared by every engine test: ``helpers.engine.reference_config``.


@contextlib.contextmanager
def running_engine(config, log_dir: Path) -> Iterator["EngineProcess"]:
    """Start ``config``, wait until healthy, stop it afterwards (the log tail is in any launch error)."""
    from serving.engine.process import EngineProcess

    engine = EngineProcess.from_config(config, log_dir=log_dir, start_timeout_s=180)
    engine.start()
    try:
        engine.wait_healthy()
        yield engine
    finally:
        engine.stop()
