"""How many streamed chunks per second spectune's load generator handles on one core.

The client must never be the bottleneck of a benchmark: if it is, every trial measures the
client. This starts a trivial SGLang-like streaming server in a separate process (pinned to one
core, a raw asyncio server that does almost nothing per chunk), pins this process (the client) to
another core, drives the server with ``orchestrator.bench.loadgen.run_load`` exactly as a
benchmark does (SSE parsing, one JSON parse per event, records), and prints JSON:
``chunks_per_s`` is the number to compare with the target of 5,000.

Each event looks like SGLang's (cumulative ``text``, ``output_ids``, ``meta_info`` with
``completion_tokens``), one token per chunk (the worst case: speculation sends fewer, larger
chunks). Like a real engine, the server emits one event per running request every decode step
(``--step-ms``), so events arrive one per socket read instead of coalesced into large reads; the
offered load is concurrency / step, and the client keeps up if ``chunks_per_s`` reaches it.
``client_cpu_utilisation`` is the share of its core the client used, so
``chunks_per_s / client_cpu_utilisation`` estimates what one saturated core would handle.
``--step-ms 0`` streams flat out instead.

Usage: python benchmarks/loadgen_capacity.py [--concurrency 64] [--step-ms 8] [--requests 640] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_CHUNKS_PER_S = 5000


# --- the trivial server (runs in its own process) ---------------------------------------------


class _StreamServer(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: POST /generate streams SSE events, chunked encoding."""

    step_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buffer = b""
        self.busy = False

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[:head_end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buffer) < head_end + 4 + length:
            return
        body = self.buffer[head_end + 4:head_end + 4 + length]
        self.buffer = self.buffer[head_end + 4 + length:]
        self.busy = True
        asyncio.get_running_loop().create_task(self._respond(head.split(" ", 2)[1], body))

    async def _respond(self, path: str, body: bytes) -> None:
        write = self.transport.write  # type: ignore[attr-defined]
        if path != "/generate":
            payload = b"ok"
            write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        else:
            request = json.loads(body)
            tokens = int(request["sampling_params"]["max_new_tokens"])
            write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            text = ""
            for k in range(1, tokens + 1):
                text += "x"
                meta = {"id": "r", "finish_reason": None, "prompt_tokens": 10, "completion_tokens": k, "cached_tokens": 0}
                if k == tokens:
                    meta.update(finish_reason={"type": "length", "length": tokens}, e2e_latency=0.1)
                event = b"data: " + json.dumps({"text": text, "output_ids": [k], "meta_info": meta}).encode() + b"\n\n"
                write(b"%x\r\n%s\r\n" % (len(event), event))
                await asyncio.sleep(self.step_s)  # one decode step: every stream emits one event
            done = b"data: [DONE]\n\n"
            write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        self.busy = False
        if self.buffer:
            self._next()


def serve(core: int | None, step_ms: float) -> None:
    """Server process: pin, bind port 0, print the port, serve until killed."""
    _StreamServer.step_s = step_ms / 1000.0
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        import uvloop  # the server should be as cheap as possible; the client is what is measured

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_StreamServer, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


# --- the client (this process) ----------------------------------------------------------------


async def drive(url: str, *, concurrency: int, requests: int, tokens: int) -> dict:
    import aiohttp

    from orchestrator.bench.loadgen import Sampling, WorkItem, run_load

    items = [WorkItem(prompt_id=f"p{i}", text="hello world") for i in range(requests)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # warm the connection pool and the code paths
        await run_load(session=session, base_url=url, api="generate", items=items[:concurrency],
                       concurrency=concurrency, sampling=Sampling(max_new_tokens=4), timeout_s=60)
        cpu0 = time.process_time()
        result = await run_load(session=session, base_url=url, api="generate", items=items, concurrency=concurrency,
                                sampling=Sampling(max_new_tokens=tokens), timeout_s=120)
        cpu = time.process_time() - cpu0
    errors = [r for r in result.records if r.error is not None]
    chunks = sum(r.num_chunks or 0 for r in result.records)
    return {
        "chunks": chunks,
        "duration_s": round(result.duration_s, 3),
        "chunks_per_s": round(chunks / result.duration_s, 1),
        "requests_per_s": round(requests / result.duration_s, 1),
        "client_cpu_s": round(cpu, 3),
        "client_cpu_utilisation": round(cpu / result.duration_s, 3),
        "estimated_capacity_chunks_per_s": round(chunks / cpu, 1) if cpu > 0 else None,
        "errors": len(errors),
        "first_error": errors[0].error if errors else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--step-ms", type=float, default=8.0, help="Decode step of the server (0: flat out).")
    parser.add_argument("--tokens", type=int, default=64, help="Tokens (= chunks) per request.")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.core, args.step_ms)
        return

    cores = sorted(os.sched_getaffinity(0))
    client_core = cores[0]
    server_core = cores[1] if len(cores) > 1 else cores[0]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--core", str(server_core), "--step-ms", str(args.step_ms)], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        os.sched_setaffinity(0, {client_core})
        stats = asyncio.run(drive(f"http://127.0.0.1:{port}", concurrency=args.concurrency,
                                  requests=args.requests, tokens=args.tokens))
    finally:
        server.terminate()
        server.wait(timeout=10)
    report = {
        "benchmark": "loadgen_capacity",
        "target_chunks_per_s": TARGET_CHUNKS_PER_S,
        "passed": stats["chunks_per_s"] >= TARGET_CHUNKS_PER_S and stats["errors"] == 0,
        "client_core": client_core,
        "server_core": server_core,
        "shared_core": client_core == server_core,
        "concurrency": args.concurrency,
        "step_ms": args.step_ms,
        "offered_chunks_per_s": round(args.concurrency * 1000 / args.step_ms, 1) if args.step_ms else None,
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "python": sys.version.split()[0],
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **stats,
    }
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
