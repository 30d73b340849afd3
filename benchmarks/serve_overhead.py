"""What serving through Ray Serve costs: the same load through the Serve endpoint and straight to
the engine behind it, side by side in one run, per ingress path, at concurrency 1 and 8.

For each ingress path (``haproxy``: HAProxy + direct ingress; ``proxy``: Serve's Python proxy) it
starts ``spectune serve CONFIG`` with its own local Ray, reads the engine's own URL from the audit
route, and then, per concurrency level, alternates blocks of streamed ``/v1/completions`` requests
between the two targets (engine, serve, serve, engine, ...) so that drift (a warming engine, a
neighbour on the machine) falls on both alike. Both targets get the same prompts, greedy, fixed
output length (``ignore_eos``), one warm-up block each first.

Per target and level: ``output_tok_per_s`` (tokens of all blocks / their summed wall time) and the
TTFT p50 over all requests; per level: ``throughput_ratio`` (serve / engine) and ``added_ttft_ms_p50``
(serve - engine) over all blocks, the median of the per-round figures (robust to a round that a
neighbour on the machine disturbed) and the per-round figures themselves. Goal (issue 11): ratio >= 0.97 and
added TTFT p50 <= 5 ms at both levels. Prints one JSON document.

Usage: python benchmarks/serve_overhead.py [--config FILE] [--ingress haproxy,proxy] [-c 1,8]
       [--requests 16] [--rounds 8] [--output-len 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.bench.datasets import load_builtin  # noqa: E402
from orchestrator.bench.loadgen import RequestRecord, Sampling, WorkItem, run_load  # noqa: E402
from orchestrator.bench.metrics import ok_records, output_tokens, ttft_ms  # noqa: E402
from serving.ports import free_port  # noqa: E402

GOAL = {"throughput_ratio_min": 0.97, "added_ttft_ms_p50_max": 5.0}
DEFAULT_CONFIG = """\
# the benchmark's engine: the CPU reference engine with a speculative chain, as a sweep's best.yaml
kind: reference
model_path: ref-tiny
tp_size: 1
speculative_algorithm: EAGLE3
speculative_draft_model_path: ref-tiny-draft
speculative_num_steps: 2
speculative_eagle_topk: 1
speculative_num_draft_tokens: 3
env: {NCCL_ALGO: Ring}
"""
_SCRIPT = Path(sys.executable).with_name("spectune")
# The console script where spectune is installed; the module itself where it only is on the path
# (a GPU node with the wheels unpacked under PYTHONPATH, say).
SPECTUNE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "orchestrator.cli"]


@contextlib.contextmanager
def served(config: Path, *, ingress: str, workdir: Path) -> Iterator[dict[str, str]]:
    """``spectune serve`` on a free port with its own Ray; yields the serve URL, engine URL and model."""
    port = free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="st-so-", dir="/tmp"))  # Unix socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
           "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(workdir / f"serve-{ingress}.log", "wb")
    proc = subprocess.Popen([*SPECTUNE, "serve", str(config), "--port", str(port), "--ingress", ingress],
                            stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO, start_new_session=True)
    try:
        assert proc.stdout is not None
        # The readiness line; Ray's own processes may print to the same stdout first (a raylet
        # warning about an earlier cluster's actors, say), so skip lines until it or the end.
        line = ""
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith("serving "):
                break
        if not line.startswith("serving "):
            raise RuntimeError(f"spectune serve did not come up ({ingress}); see {log.name}: {line!r}")
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(url + "/spectune/audit", timeout=30) as response:
            audit = json.loads(response.read())
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
            model = json.loads(response.read())["data"][0]["id"]
        yield {"serve": url, "engine": audit["engine"]["url"], "model": model}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


async def _block(session: aiohttp.ClientSession, url: str, model: str, items: list[WorkItem], *,
                 concurrency: int, output_len: int) -> tuple[list[RequestRecord], float]:
    result = await run_load(session=session, base_url=url, api="completions", items=items, concurrency=concurrency,
                            sampling=Sampling(max_new_tokens=output_len), timeout_s=300, stream=True, model=model)
    failed = [r for r in result.records if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests to {url} failed, e.g. {failed[0].error}")
    return result.records, result.duration_s


def _summary(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    tokens = output_tokens(records) or 0
    return {"requests": len(ok_records(records)), "output_tokens": tokens,
            "output_tok_per_s": round(tokens / duration_s, 2), "ttft_ms_p50": round(ttft_ms(records).median or 0, 2)}


async def measure(urls: dict[str, str], *, levels: list[int], requests: int, rounds: int,
                  output_len: int) -> dict[str, Any]:
    """Alternating blocks engine/serve per level; returns the level summaries."""
    prompts = load_builtin()
    items = [WorkItem(prompt_id=p.id, text=p.text) for p in (prompts * (1 + requests // len(prompts)))[:requests]]
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for level in levels:
            pooled: dict[str, tuple[list[RequestRecord], float]] = {"engine": ([], 0.0), "serve": ([], 0.0)}
            per_round = []
            for target in ("engine", "serve"):  # warm-up at this level, discarded
                await _block(session, urls[target], urls["model"], items[: max(level * 2, 4)], concurrency=level,
                             output_len=output_len)
            for index in range(rounds):
                order = ("engine", "serve") if index % 2 == 0 else ("serve", "engine")
                this_round = {}
                for target in order:
                    records, duration = await _block(session, urls[target], urls["model"], items, concurrency=level,
                                                     output_len=output_len)
                    pooled[target] = (pooled[target][0] + records, pooled[target][1] + duration)
                    this_round[target] = _summary(records, duration)
                per_round.append({
                    "throughput_ratio": round(this_round["serve"]["output_tok_per_s"]
                                              / this_round["engine"]["output_tok_per_s"], 4),
                    "added_ttft_ms_p50": round(this_round["serve"]["ttft_ms_p50"] - this_round["engine"]["ttft_ms_p50"], 2),
                })
            engine, serve = _summary(*pooled["engine"]), _summary(*pooled["serve"])
            ratio = serve["output_tok_per_s"] / engine["output_tok_per_s"]
            added = serve["ttft_ms_p50"] - engine["ttft_ms_p50"]
            out[f"concurrency_{level}"] = {
                "engine": engine, "serve": serve, "throughput_ratio": round(ratio, 4),
                "added_ttft_ms_p50": round(added, 2),
                "median_of_rounds": {
                    "throughput_ratio": round(statistics.median(r["throughput_ratio"] for r in per_round), 4),
                    "added_ttft_ms_p50": round(statistics.median(r["added_ttft_ms_p50"] for r in per_round), 2),
                },
                "per_round": per_round,
                "meets_goal": ratio >= GOAL["throughput_ratio_min"] and added <= GOAL["added_ttft_ms_p50_max"],
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="Engine config YAML (default: a tp-1 reference engine).")
    parser.add_argument("--ingress", default="haproxy,proxy", help="Ingress paths to measure (comma-separated).")
    parser.add_argument("-c", "--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=16, help="Requests per block.")
    parser.add_argument("--rounds", type=int, default=8, help="Blocks per target and level (alternating).")
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="spectune-serve-overhead-"))
    config = args.config
    if config is None:
        config = workdir / "engine.yaml"
        config.write_text(DEFAULT_CONFIG)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    report: dict[str, Any] = {
        "benchmark": "serve_overhead", "config": config.read_text(), "goal": GOAL,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {"requests_per_block": args.requests, "rounds": args.rounds, "output_len": args.output_len,
                     "api": "/v1/completions, streamed", "levels": levels},
        "ingress": {}, "logs": str(workdir),
    }
    for ingress in [i.strip() for i in args.ingress.split(",") if i.strip()]:
        began = time.monotonic()
        with served(config, ingress=ingress, workdir=workdir) as urls:
            result = asyncio.run(measure(urls, levels=levels, requests=args.requests, rounds=args.rounds,
                                         output_len=args.output_len))
        report["ingress"][ingress] = {**result, "wall_s": round(time.monotonic() - began, 1)}
    measured = {name: all(level["meets_goal"] for level in result.values() if isinstance(level, dict) and "meets_goal" in level)
                for name, result in report["ingress"].items()}
    report["meets_goal"] = measured
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
