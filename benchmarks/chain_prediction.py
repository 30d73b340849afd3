"""Predicted vs measured: every top-k 1 chain of a space, predicted from two starts, then all measured.

``orchestrator.sweep.search.chain_prediction`` predicts a chain it did not start from the chains a
sweep measured: the accept length from the longest chain's accepted-draft histogram, the cycle time
from a line through the measured chains' cycle times, the throughput scaled from the nearest
measured chain, with a 95% interval on the log scale. This script starts one reference engine per
chain (steps 1..N, top-k 1, draft = steps + 1), all resident at once, and measures them in
interleaved rounds (every chain once per round, each round at every level), then predicts every
chain from the fewest starts the design needs (the longest chain, for its histogram and a cycle
point, and the shortest, for the second cycle point) and compares, per level:

* accept length: predicted vs measured (median over rounds), relative error;
* throughput: predicted vs measured (geometric mean over rounds) and whether the interval covers it;
* the held-out check a sweep makes: SGLang's default chain (3, 1, 4) predicted, then measured.

JSON goes to stdout, progress to stderr::

    python benchmarks/chain_prediction.py --rounds 5 > docs/measurements/chain-prediction-cpu/run1.json
    python benchmarks/chain_prediction.py --model-path ref-gpu-comm --device cuda --levels 1 8 --rounds 5

``--request-log FILE`` also measures every chain, in the same rounds, on a request log through the chat
API (its requests' own messages, caps and sampling: temperature > 0 where the log says so), predicts
from it the same way (``request_log.designs``: what holds under sampled traffic) and puts the two
traffics side by side (``request_log.side_by_side``: accept length, throughput, the fastest chain).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from reference_engine import Server, spec_flags  # noqa: E402

from orchestrator.bench.metrics import sum_histograms  # noqa: E402
from orchestrator.bench.runner import run_benchmark  # noqa: E402
from orchestrator.bench.settings import BenchSettings  # noqa: E402
from orchestrator.sweep.search.chain_prediction import MeasuredChain, log_correlation, predict_chains  # noqa: E402

logger = logging.getLogger("benchmarks.chain_prediction")


def _rel_se(values: list[float], *, log: bool) -> float:
    """Relative standard error of the mean (of logs where ``log``); 0 for a single value."""
    if len(values) < 2:
        return 0.0
    xs = [math.log(v) for v in values] if log else values
    sd = statistics.stdev(xs)
    return sd / math.sqrt(len(xs)) / (1.0 if log else statistics.fmean(values))


def measure(servers: dict[int, Server], *, levels: list[int], rounds: int,
            traffics: dict[str, dict[str, Any]], max_s: float | None = None) -> dict[str, dict]:
    """traffic -> steps -> level -> {"tok": [...], "accept": [...], "cycle": [...], "histograms": [...]},
    in rounds: every chain on every traffic once per round (the traffics of one chain back to back);
    no round after the third starts after ``max_s`` seconds (a round is whole: every chain measured as
    often; three rounds at least, so every chain has a spread of its own)."""
    started = time.monotonic()
    data: dict[str, dict[int, dict[int, dict[str, list[Any]]]]] = {
        name: {s: {c: {"tok": [], "accept": [], "cycle": [], "histograms": [], "steal": []} for c in levels}
               for s in servers} for name in traffics}
    benches = {name: BenchSettings(concurrency=levels, repetitions=1, **settings) for name, settings in traffics.items()}
    for number in range(rounds):
        if max_s is not None and number >= 3 and time.monotonic() - started > max_s:
            logger.info("stopping after %d rounds: --max-minutes reached", number)
            break
        order = list(servers) if number % 2 == 0 else list(reversed(servers))  # A B C, C B A: drift hits all alike
        for steps in order:
            for name, bench in benches.items():
                tic = time.monotonic()
                result = run_benchmark(base_url=servers[steps].url, settings=bench)
                for level in result.levels:
                    rep = level.repetitions[0]
                    cell = data[name][steps][level.concurrency]
                    cell["tok"].append(rep.output_tok_per_s)
                    cell["accept"].append(rep.accept_length)
                    cell["cycle"].append(rep.cycle_ms)
                    cell["histograms"].append(rep.accept_histogram)
                    cell["steal"].append(rep.host_cpu_steal)
                logger.info("round %d/%d steps %d %s: %s (%.0f s)", number + 1, rounds, steps, name,
                            {c: round(data[name][steps][c]["tok"][-1], 1) for c in levels}, time.monotonic() - tic)
    return data


MAX_STEAL = 0.05
"""A repetition measured while the hypervisor gave more than this share of the host's CPU to other guests
is set aside (its figure is the neighbours'), as the confirmation does (``confirmation.max_host_cpu_steal``)."""


def _quiet(cell: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The cell without its repetitions measured under CPU steal (all of them if every one was)."""
    keep = [i for i, steal in enumerate(cell.get("steal") or []) if steal is None or steal <= MAX_STEAL]
    if not keep or not cell.get("steal"):
        return cell
    return {name: [values[i] for i in keep] for name, values in cell.items()}


def chain_of(steps: int, cell: dict[str, list[Any]]) -> MeasuredChain:
    cell = _quiet(cell)
    return MeasuredChain(
        steps=steps, accept_length=statistics.median(cell["accept"]), cycle_ms=statistics.fmean(cell["cycle"]),
        cycle_rel_se=_rel_se(cell["cycle"], log=False), tok_per_s=math.exp(statistics.fmean(math.log(v) for v in cell["tok"])),
        tok_rel_se=_rel_se(cell["tok"], log=True), histogram=tuple(sum_histograms(cell["histograms"]) or ()) or None,
        tok_cycle_corr=log_correlation(cell["tok"], cell["cycle"]))


def compare(data: dict, *, levels: list[int], from_steps: list[int]) -> dict[str, Any]:
    """Per level: every chain not in ``from_steps`` predicted from those, beside its measurement."""
    out: dict[str, Any] = {}
    all_steps = sorted(data)
    for level in levels:
        measured = {s: chain_of(s, data[s][level]) for s in all_steps}
        predictions = predict_chains([measured[s] for s in from_steps], all_steps)
        rows = []
        for p in predictions:
            m = measured[p.steps]
            rows.append({
                "steps": p.steps, "predicted_accept_length": round(p.accept_length, 4),
                "measured_accept_length": round(m.accept_length, 4),
                "accept_error_rel": round(p.accept_length / m.accept_length - 1, 4),
                "predicted_tok_per_s": round(p.tok_per_s, 2), "interval": [round(p.low, 2), round(p.high, 2)],
                "half_width_rel": round(p.half_width_rel, 4), "measured_tok_per_s": round(m.tok_per_s, 2),
                "measured_rel_se": round(m.tok_rel_se, 4), "covered": p.low <= m.tok_per_s <= p.high,
                "tok_error_rel": round(p.tok_per_s / m.tok_per_s - 1, 4),
                "predicted_cycle_ms": round(p.cycle_ms, 3), "measured_cycle_ms": round(m.cycle_ms, 3),
            })
        out[str(level)] = {
            "from_steps": from_steps,
            "set_aside_for_steal": {str(s): len(data[s][level]["tok"]) - len(_quiet(data[s][level])["tok"])
                                    for s in all_steps},
            "measured": {str(s): {"accept_length": round(measured[s].accept_length, 4),
                                  "tok_per_s": round(measured[s].tok_per_s, 2), "cycle_ms": round(measured[s].cycle_ms, 3),
                                  "tok_rel_se": round(measured[s].tok_rel_se, 4),
                                  "cycle_rel_se": round(measured[s].cycle_rel_se, 4), "histogram": measured[s].histogram}
                         for s in all_steps},
            "predicted": rows,
            "accept_within_3pct": sum(abs(r["accept_error_rel"]) <= 0.03 for r in rows),
            "covered": sum(r["covered"] for r in rows),
            "chains_predicted": len(rows),
            "median_half_width_rel": round(statistics.median(r["half_width_rel"] for r in rows), 4) if rows else None,
        }
    return out


def side_by_side(data: dict[str, dict], *, levels: list[int]) -> dict[str, Any]:
    """Per level and chain: accept length and throughput on the built-in prompts and on the request
    log, measured in the same rounds, and which chain is fastest on each."""
    out: dict[str, Any] = {}
    for level in levels:
        rows = {}
        for steps in sorted(data["builtin"]):
            mine = {name: chain_of(steps, data[name][steps][level]) for name in ("builtin", "request_log")}
            rows[str(steps)] = {f"{name}_{field}": round(getattr(chain, attr), digits)
                                for name, chain in mine.items()
                                for field, attr, digits in (("accept_length", "accept_length", 4),
                                                            ("tok_per_s", "tok_per_s", 2), ("tok_rel_se", "tok_rel_se", 4))}
        out[str(level)] = {
            "chains": rows,
            "fastest_builtin": max(rows, key=lambda s: rows[s]["builtin_tok_per_s"]),
            "fastest_request_log": max(rows, key=lambda s: rows[s]["request_log_tok_per_s"]),
        }
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="ref-tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="Start no round after this many minutes of measuring, the first three rounds aside "
                             "(the rounds made are reported)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default=None, help="--dtype of every engine (default: the preset's)")
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--cuda-graph-max-bs-decode", type=int, default=None,
                        help="decode CUDA graphs up to this batch (GPU; default: the engine's)")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--request-log", default=None, metavar="JSONL",
                        help="Also measure every chain on this OpenAI-format request log through /v1/chat/completions "
                             "(each request's messages, output cap and sampling), beside the built-in prompts, in "
                             "the same rounds: e.g. experiments/traffic/chat-log.jsonl")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    common = ["--model-path", args.model_path, "--device", args.device, "--max-running-requests", str(max(args.levels))]
    for flag, value in (("--dtype", args.dtype), ("--context-length", args.context_length),
                        ("--cuda-graph-max-bs-decode", args.cuda_graph_max_bs_decode)):
        if value is not None:
            common += [flag, str(value)]
    settings = {"dataset": "builtin", "num_prompts": args.num_prompts, "output_len": args.output_len,
                "warmup_requests": 1, "min_repetition_s": 0, "warmup": {"tolerance": None}}
    traffics = {"builtin": settings}
    if args.request_log:
        traffics["request_log"] = {**settings, "dataset": "request_log", "dataset_path": args.request_log,
                                   "api": "chat"}
    steps_all = list(range(1, args.max_steps + 1))
    with tempfile.TemporaryDirectory(prefix="chain-prediction-") as tmp:
        servers = {s: Server(name=f"steps{s}", log_dir=Path(tmp),
                             flags=[*spec_flags(f"{s},1,{s + 1}"), "--speculative-draft-model-path",
                                    f"{args.model_path}-draft"]) for s in steps_all}
        try:
            for server in servers.values():
                server.start(common, dict(os.environ))
            for server in servers.values():
                server.wait_healthy(args.start_timeout)
            tic = time.monotonic()
            data = measure(servers, levels=args.levels, rounds=args.rounds, traffics=traffics,
                           max_s=args.max_minutes * 60 if args.max_minutes is not None else None)
            elapsed = time.monotonic() - tic
        finally:
            for server in servers.values():
                server.stop()
    designs = {"longest_and_shortest": [1, args.max_steps], "longest_and_default": [3, args.max_steps],
               "shortest_default_longest": [1, 3, args.max_steps]}
    def results(measured: dict) -> dict[str, Any]:
        return {
            "designs": {name: compare(measured, levels=args.levels, from_steps=sorted(set(steps)))
                        for name, steps in designs.items() if len(set(steps)) > 1},
            "rounds": {str(s): {str(c): {k: v for k, v in measured[s][c].items() if k != "histograms"}
                                for c in args.levels} for s in measured},
        }

    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {**vars(args), "bench": settings},
        "measure_s": round(elapsed, 1),
        "rounds_made": len(next(iter(next(iter(data["builtin"].values())).values()))["tok"]),
        **results(data["builtin"]),
    }
    if args.request_log:
        report["request_log"] = {**results(data["request_log"]), "side_by_side": side_by_side(data, levels=args.levels)}
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
