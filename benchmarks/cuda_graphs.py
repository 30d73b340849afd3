"""Eager vs CUDA-graph decode on the GPU reference engine, side by side in one run.

On one GPU (``ref-gpu-comm``, EAGLE3 with SGLang's default chain 3/1/4, tp 1, ``--context-length
1024``) this measures:

* **start time against the number of captured sizes**: engines started one at a time with no
  graphs and with 2, 8 and SGLang's default 23 sizes (``startup_time`` of ``/server_info`` and the
  capture's own seconds from the log);
* **eager vs graphs** at concurrency 1, 2 and 8: two engines resident at once (one with
  ``--disable-decode-cuda-graph``, one with SGLang's default sizes), measured in alternating
  repetitions (eager, graphs, graphs, eager, ...) so the host's drift hits both alike. Per mode and
  level: output tok/s (median), the CV over repetitions, GPU power and utilisation (``nvidia-smi``
  sampled every 200 ms, averaged over the repetition's window) and the greedy outputs' agreement;
* **whether throughput follows the host's CPU**: a separate process times a fixed pure-Python loop
  over and over; each repetition gets the mean loop time of its window, and the Pearson
  correlation of (tok/s / its level's median) with that loop time is reported per mode.

JSON goes to stdout, progress to stderr::

    python benchmarks/cuda_graphs.py --rounds 8 > docs/measurements/cuda-graphs-h200x1/eager-vs-graphs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from reference_engine import Server, get_json, measure  # noqa: E402

logger = logging.getLogger("benchmarks.cuda_graphs")

LEVELS = (1, 2, 8)
SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "ref-gpu-comm-draft",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
COMMON = ["--model-path", "ref-gpu-comm", "--device", "cuda", "--context-length", "1024", *SPEC]
START_SIZES = {"none": ["--disable-decode-cuda-graph"], "2": ["--cuda-graph-bs-decode", "1", "2"],
               "8": ["--cuda-graph-max-bs-decode", "8"], "23 (default)": []}


def cpu_loop(path: str, stop: Any) -> None:
    """Time a fixed pure-Python loop again and again; append 'monotonic_end seconds' lines."""
    with open(path, "w", buffering=1) as out:
        while not stop.is_set():
            tic = time.monotonic()
            total = 0
            for i in range(100_000):
                total += i * i
            toc = time.monotonic()
            out.write(f"{toc:.4f} {toc - tic:.6f}\n")


class GpuSampler:
    """``nvidia-smi`` power, utilisation and SM clock every 200 ms, stamped with time.monotonic()."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=power.draw,utilization.gpu,clocks.sm", "--format=csv,noheader,nounits",
             "-lms", "200"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                power, util, clock = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), power, util, clock))

    def window(self, start: float, end: float) -> dict[str, Optional[float]]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return {"power_w": None, "util_pct": None, "sm_clock_mhz": None}
        return {"power_w": statistics.fmean(s[1] for s in inside), "util_pct": statistics.fmean(s[2] for s in inside),
                "sm_clock_mhz": statistics.fmean(s[3] for s in inside)}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def loop_time(path: Path, start: float, end: float) -> Optional[float]:
    values = []
    for line in path.read_text().splitlines():
        stamp, seconds = (float(x) for x in line.split())
        if start <= stamp <= end:
            values.append(seconds)
    return statistics.fmean(values) if values else None


def pearson(xs: list[float], ys: list[float]) -> Optional[float]:
    if len(xs) < 4:
        return None
    return statistics.correlation(xs, ys)


def capture_seconds(log: str) -> float:
    return sum(float(m) for m in re.findall(r"Capture .* CUDA graph end\..*?elapsed=([\d.]+) s", log))


def start_times(log_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Each size list on its own engine, started alone and stopped before the next."""
    out: dict[str, Any] = {}
    for name, flags in START_SIZES.items():
        server = Server(f"start-{name.split()[0]}", flags, log_dir)
        tic = time.perf_counter()
        server.start(COMMON, env)
        try:
            server.wait_healthy(300)
            wall = time.perf_counter() - tic
            info = get_json(server.url + "/server_info")
            state = info["internal_states"][0]
            out[name] = {"sizes": len(state["decode_cuda_graph_bs"]), "startup_time_s": round(info["startup_time"], 2),
                         "wall_to_healthy_s": round(wall, 2),
                         "capture_s": round(capture_seconds(server.log_path.read_text(errors="replace")), 2),
                         "graph_memory_gb": state["memory_usage"]["graph"]}
            logger.info("start with %s sizes: %s", name, out[name])
        finally:
            server.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="alternating repetitions per mode and level")
    parser.add_argument("--requests-per-concurrency", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--skip-start-times", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_dir = Path(tempfile.mkdtemp(prefix="cuda-graphs-"))
    result: dict[str, Any] = {"host": platform.node(), "cpus": os.cpu_count(), "levels": list(LEVELS),
                              "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                              "requests_per_repetition": {c: args.requests_per_concurrency * c for c in LEVELS},
                              "engine": " ".join(COMMON)}
    if not args.skip_start_times:
        result["start_time_by_captured_sizes"] = start_times(log_dir, env)

    servers = {"eager": Server("eager", ["--disable-decode-cuda-graph", "--mem-fraction-static", "0.3"], log_dir),
               "graphs": Server("graphs", ["--mem-fraction-static", "0.5"], log_dir)}
    for server in servers.values():
        server.start(COMMON, env)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    loop_path = log_dir / "cpu-loop.txt"
    looper = ctx.Process(target=cpu_loop, args=(str(loop_path), stop), daemon=True)
    sampler = GpuSampler()
    reps: list[dict[str, Any]] = []
    try:
        for server in servers.values():
            server.wait_healthy(300)
        looper.start()
        for c in LEVELS:  # warm-up: one repetition per mode and level, not counted
            for server in servers.values():
                asyncio.run(measure(server.url, concurrency=c, requests=args.requests_per_concurrency * c,
                                    max_new_tokens=args.max_new_tokens))
        order = ["eager", "graphs"]
        for rnd in range(args.rounds):
            for c in LEVELS:
                for mode in order:
                    start = time.monotonic()
                    got = asyncio.run(measure(servers[mode].url, concurrency=c, requests=args.requests_per_concurrency * c,
                                              max_new_tokens=args.max_new_tokens))
                    end = time.monotonic()
                    reps.append({"round": rnd, "mode": mode, "concurrency": c, "tok_s": got.output_tok_per_s,
                                 "seconds": end - start, "outputs": got.outputs, **sampler.window(start, end),
                                 "cpu_loop_ms": None})
                    reps[-1]["_window"] = (start, end)
                order.reverse()
            logger.info("round %d of %d done", rnd + 1, args.rounds)
        infos = {mode: get_json(s.url + "/server_info")["internal_states"][0] for mode, s in servers.items()}
    finally:
        stop.set()
        looper.join(10)
        sampler.stop()
        for server in servers.values():
            server.stop()
    for rep in reps:
        loop = loop_time(loop_path, *rep.pop("_window"))
        rep["cpu_loop_ms"] = None if loop is None else 1000 * loop

    table: dict[str, Any] = {}
    for mode in servers:
        rows: dict[str, Any] = {}
        xs: list[float] = []
        ys: list[float] = []
        for c in LEVELS:
            mine = [r for r in reps if r["mode"] == mode and r["concurrency"] == c]
            tok = [r["tok_s"] for r in mine]
            median = statistics.median(tok)
            rows[f"c{c}"] = {
                "repetitions": len(tok), "tok_s_median": round(median, 1),
                "cv": round(statistics.stdev(tok) / statistics.fmean(tok), 4),
                "tok_s_min_max": [round(min(tok), 1), round(max(tok), 1)],
                "power_w": _mean([r["power_w"] for r in mine]), "util_pct": _mean([r["util_pct"] for r in mine]),
                "sm_clock_mhz": _mean([r["sm_clock_mhz"] for r in mine]),
                "cpu_loop_ms_p10_p90": _p10_p90([r["cpu_loop_ms"] for r in mine]),
                "corr_tok_s_vs_cpu_loop": _round(pearson([r["cpu_loop_ms"] for r in mine if r["cpu_loop_ms"]],
                                                         [r["tok_s"] for r in mine if r["cpu_loop_ms"]])),
            }
            for r in mine:
                if r["cpu_loop_ms"]:
                    xs.append(r["cpu_loop_ms"])
                    ys.append(r["tok_s"] / median)
        rows["corr_relative_tok_s_vs_cpu_loop_all_levels"] = _round(pearson(xs, ys))
        rows["cuda_graph_passes"] = infos[mode].get("cuda_graph_passes")
        rows["decode_cuda_graph_bs"] = infos[mode]["decode_cuda_graph_bs"]
        table[mode] = rows
    result["eager_vs_graphs"] = table
    result["graphs_over_eager_tok_s"] = {
        f"c{c}": round(table["graphs"][f"c{c}"]["tok_s_median"] / table["eager"][f"c{c}"]["tok_s_median"], 3)
        for c in LEVELS}
    same = total = 0
    for c in LEVELS:
        for rnd in range(args.rounds):
            pair = {r["mode"]: r["outputs"] for r in reps if r["round"] == rnd and r["concurrency"] == c}
            for prompt, ids in pair["eager"].items():
                total += 1
                same += pair["graphs"].get(prompt) == ids
    result["greedy_outputs_equal"] = f"{same} of {total}"
    print(json.dumps(result, indent=2))
    return 0


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 3)


def _mean(values: list[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return round(statistics.fmean(kept), 1) if kept else None


def _p10_p90(values: list[Optional[float]]) -> Optional[list[float]]:
    kept = sorted(v for v in values if v is not None)
    if len(kept) < 2:
        return None
    q = statistics.quantiles(kept, n=10)
    return [round(q[0], 2), round(q[-1], 2)]


if __name__ == "__main__":
    sys.exit(main())
