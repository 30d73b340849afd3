"""Benchmark the reference engine: output tok/s without and with speculation, side by side.

Starts one reference-engine server per configuration (plain decoding and a few speculative
configurations), all in this one run, then measures them in alternating rounds (plain, spec A,
spec B, ..., plain, spec A, ...) so that drift of the machine hits every configuration alike.
Each measurement sends the same greedy prompts (``ignore_eos``, fixed ``max_new_tokens``) at a
fixed concurrency over HTTP (``/generate``, streaming) and reports:

* ``output_tok_per_s``: completion tokens / wall time of the round (median over rounds);
* ``speedup_vs_plain``: the median over rounds of (this round's tok/s / plain's tok/s in the same
  round), which cancels most of the machine's drift between rounds;
* ``accept_length``: the server's ``avg_spec_accept_length`` after ``/flush_cache`` (tokens per
  verify cycle, bonus included), cross-checked with the per-request aggregate
  ``sum(completion_tokens - 1) / sum(spec_verify_ct)``;
* ``ttft_ms`` / ``tpot_ms`` medians (TPOT = (e2e - TTFT) / (tokens - 1));
* ``greedy_outputs_equal_plain``: how many requests got token-for-token the plain output.

JSON goes to stdout, progress to stderr. Needs only the standard library, torch and aiohttp,
so it also runs on a GPU machine with nothing else installed::

    python benchmarks/reference_engine.py                                  # CPU, ref-tiny
    python benchmarks/reference_engine.py --model-path ref-gpu-comm --device cuda --tp-size 2 \\
        --concurrency 1 16 --configs plain 3,1,4 5,4,8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp

logger = logging.getLogger("benchmarks.reference_engine")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.waiting import wait_until  # noqa: E402  (the repository's one bounded poll loop)

DEFAULT_CONFIGS = ["plain", "2,1,3", "3,1,4", "4,1,5", "3,2,6", "5,4,8"]
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright.",
    "def quicksort(items):",
    "The history of the printing press begins",
    "List five uses for a paperclip:",
    "SELECT customer_id, SUM(amount) FROM orders",
    "Dear hiring manager, I am writing to apply",
    "In the year 2150, the first colony on Mars",
]


@dataclass
class Server:
    """One reference-engine process (own session, log file, free port)."""

    name: str
    flags: list[str]
    log_dir: Path
    port: int = 0
    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, common: list[str], env: dict[str, str]) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log_path = self.log_dir / f"{self.name}.log"
        argv = [sys.executable, "-m", "serving.reference", *common, "--port", str(self.port), *self.flags]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        logger.info("started %s: %s (log %s)", self.name, " ".join(argv[3:]), self.log_path)

    def wait_healthy(self, timeout_s: float) -> None:
        """Until /health_generate answers 200; an exit or the deadline raises with the log tail."""
        proc = self.proc
        assert proc is not None

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as resp:
                    return resp.status == 200
            except (OSError, urllib.error.HTTPError):
                return False

        try:
            wait_until(healthy, timeout_s=timeout_s, what=f"{self.name} to become healthy", poll_s=0.25,
                       detail=self.tail)
        except TimeoutError as exc:
            raise RuntimeError(str(exc)) from None

    def tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Round:
    outputs: dict[str, list[int]]
    output_tok_per_s: float
    completion_tokens: int
    verify_ct: int
    n_requests: int
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)


def spec_flags(config: str) -> list[str]:
    if config == "plain":
        return []
    steps, topk, draft = (int(x) for x in config.split(","))
    return ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft)]


def config_name(config: str) -> str:
    if config == "plain":
        return "plain"
    steps, topk, draft = config.split(",")
    return f"steps{steps}-topk{topk}-draft{draft}"


def flush(url: str) -> None:
    """``/flush_cache`` (idle server): resets the accept-length counters."""
    with urllib.request.urlopen(url + "/flush_cache", timeout=60) as resp:
        assert resp.status == 200


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


async def one_request(session: aiohttp.ClientSession, url: str, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    start = time.perf_counter()
    first: Optional[float] = None
    last: dict[str, Any] = {}
    async with session.post(url + "/generate", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("output_ids"):
                first = time.perf_counter()
            last = chunk
    end = time.perf_counter()
    meta = last["meta_info"]
    n = meta["completion_tokens"]
    ttft = (first or end) - start
    return {"prompt": prompt, "output_ids": last["output_ids"], "tokens": n, "verify_ct": meta.get("spec_verify_ct", 0), "ttft_s": ttft,
            "tpot_s": (end - start - ttft) / (n - 1) if n > 1 else 0.0}


async def measure(url: str, *, concurrency: int, requests: int, max_new_tokens: int) -> Round:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker() -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                results.append(await one_request(session, url, prompt, max_new_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    return Round(
        outputs={r["prompt"]: r["output_ids"] for r in results},
        output_tok_per_s=tokens / wall,
        completion_tokens=tokens,
        verify_ct=sum(r["verify_ct"] for r in results),
        n_requests=len(results),
        ttft_ms=[1000 * r["ttft_s"] for r in results],
        tpot_ms=[1000 * r["tpot_s"] for r in results],
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="ref-tiny")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                        help="'plain' and/or steps,topk,draft_tokens triples")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1])
    parser.add_argument("--requests", type=int, default=0, help="requests per round (default: max(8, 4 x concurrency))")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one discarded warm-up round)")
    parser.add_argument("--extra-flags", default="", help="more engine flags, one string")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
    if "plain" not in args.configs:
        args.configs.insert(0, "plain")

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="ref-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    common = ["--model-path", args.model_path, "--device", args.device, "--tp-size", str(args.tp_size),
              "--max-running-requests", str(max(64, max(args.concurrency))), *args.extra_flags.split()]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    servers = {c: Server(name=config_name(c), flags=spec_flags(c), log_dir=log_dir) for c in args.configs}
    results: dict[int, dict[str, list[Round]]] = {c: {k: [] for k in args.configs} for c in args.concurrency}
    accept: dict[int, dict[str, list[float]]] = {c: {k: [] for k in args.configs} for c in args.concurrency}
    try:
        # One at a time: on a small machine, parallel start-ups slow each other down.
        for server in servers.values():
            server.start(common, env)
            server.wait_healthy(timeout_s=900)
        for rnd in range(-1, args.rounds):  # round -1 warms every server up and is discarded
            for conc in args.concurrency:
                for config, server in servers.items():
                    n_req = args.requests or max(8, 4 * conc)
                    flush(server.url)
                    # warm the connection path; excluded from the figures
                    asyncio.run(measure(server.url, concurrency=1, requests=1, max_new_tokens=8))
                    flush(server.url)
                    r = asyncio.run(measure(server.url, concurrency=conc, requests=n_req,
                                            max_new_tokens=args.max_new_tokens))
                    logger.info("round %d conc %d %-22s %8.1f tok/s", rnd, conc, server.name, r.output_tok_per_s)
                    if rnd < 0:
                        continue
                    results[conc][config].append(r)
                    if config != "plain":
                        state = get_json(server.url + "/server_info")["internal_states"][0]
                        accept[conc][config].append(float(state.get("avg_spec_accept_length", 0.0)))
    finally:
        for server in servers.values():
            server.stop()

    import torch  # only for the record of what ran

    report: dict[str, Any] = {
        "benchmark": "reference_engine",
        "model_path": args.model_path,
        "device": args.device,
        "tp_size": args.tp_size,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" and torch.cuda.is_available() else None},
        "by_concurrency": [],
    }
    for conc in args.concurrency:
        rows = []
        for config in args.configs:
            rounds = results[conc][config]
            tps = statistics.median(r.output_tok_per_s for r in rounds)
            row: dict[str, Any] = {
                "config": config_name(config),
                "output_tok_per_s": round(tps, 1),
                "output_tok_per_s_rounds": [round(r.output_tok_per_s, 1) for r in rounds],
                "speedup_vs_plain": round(statistics.median(
                    r.output_tok_per_s / p.output_tok_per_s for r, p in zip(rounds, results[conc]["plain"])), 3),
                "ttft_ms": round(statistics.median(x for r in rounds for x in r.ttft_ms), 2),
                "tpot_ms": round(statistics.median(x for r in rounds for x in r.tpot_ms), 3),
            }
            if config != "plain":
                plain_out = results[conc]["plain"][0].outputs
                same = sum(plain_out.get(p) == ids for p, ids in rounds[0].outputs.items())
                row["greedy_outputs_equal_plain"] = f"{same}/{len(rounds[0].outputs)}"
                steps, topk, draft = (int(x) for x in config.split(","))
                verify = sum(r.verify_ct for r in rounds)
                emitted = sum(r.completion_tokens - r.n_requests for r in rounds)
                row.update(
                    speculative_num_steps=steps,
                    speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=draft,
                    accept_length=round(statistics.median(accept[conc][config]), 3),
                    accept_length_per_request_aggregate=round(emitted / verify, 3) if verify else None,
                )
            rows.append(row)
        best = max((r for r in rows if r["config"] != "plain"), key=lambda r: r["output_tok_per_s"], default=None)
        report["by_concurrency"].append({"concurrency": conc, "results": rows,
                                         "best_speculative": best["config"] if best else None,
                                         "best_speedup_vs_plain": best["speedup_vs_plain"] if best else None})
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
