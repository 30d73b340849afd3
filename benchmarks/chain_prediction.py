"""Predicted vs measured: every top-k 1 chain of a space, predicted from two starts, then all measured.

``orchestrator.sweep.search.chain_prediction`` predicts a chain it did not start from the chains a
sweep measured: the accept length from the longest chain's accepted-draft histogram, the cycle time
from a line through the measured chains' cycle times, the throughput from a line of time per token
in decode time per token through the measured chains, with a 95% interval on the log scale. This script starts one reference engine per
chain (steps 1..N, top-k 1, draft = steps + 1), all resident at once, and measures them in
interleaved rounds (every chain once per round, each round at every level), then predicts every
chain from the fewest starts the design needs (the longest chain, for its histogram and a cycle
point, and the shortest, for the second cycle point) and from the sweep's opening (those two and
SGLang's chain, ``DefineByRunSpace.opening_stages``), and compares, per level:

* accept length: predicted vs measured (median over rounds), relative error;
* throughput: predicted vs measured (geometric mean over rounds) and whether the interval covers it,
  with two intervals from the one formula: ``between_starts`` from each chain's raw repetition spread
  (the interval a sweep prints: its trials are starts minutes apart, the machine's slow drift between
  them included) and ``within_rounds`` from the spread left once each round's common speed is taken out
  (the comparison made here: the prediction and the measurement come from the same rounds, so what
  slowed a whole round cancels); ``summary`` pools the levels;
* the held-out check a sweep makes: SGLang's default chain (3, 1, 4) predicted from the two ends, then
  measured (its row in ``longest_and_shortest``; ``design_roles`` names each design's part).

``--restart-every K`` starts every engine afresh before every K-th round: an engine's own speed offset
(CPU run 6: 5-7% between resident engines at concurrency 4) is the same in every round of one start, so
one start's rounds cannot show it and the intervals above would leave it out; with restarts each chain's
standard error comes from its starts' means (``per_start``), the offset included, and the means average
it over the starts. ``--settle-rounds N`` leaves each start's first N rounds out of the analysis (an engine
still warming up: on an H100 a start's first round was 20-50% slow; not on the CPU).

``--reanalyse REPORT`` starts nothing and analyses a saved report's rounds again with this version.

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
import dataclasses
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
from typing import Any, Callable, Optional

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
            traffics: dict[str, dict[str, Any]], max_s: float | None = None,
            restart_every: int = 0, restart: Optional[Callable[[], None]] = None) -> dict[str, dict]:
    """traffic -> steps -> level -> {"tok": [...], "accept": [...], "cycle": [...], "histograms": [...],
    "steal": [...], "start": [...]}, in rounds: every chain on every traffic once per round (the traffics of
    one chain back to back); no round after the third starts after ``max_s`` seconds (a round is whole:
    every chain measured as often; three rounds at least, so every chain has a spread of its own).

    With ``restart_every`` = k > 0, ``restart()`` starts every engine afresh before every k-th round (not
    before the first): ``start`` numbers the start each repetition was measured on, so the analysis sees
    an engine's own offset, which no spread within one start shows, as the spread it is."""
    started = time.monotonic()
    data: dict[str, dict[int, dict[int, dict[str, list[Any]]]]] = {
        name: {s: {c: {"tok": [], "accept": [], "cycle": [], "histograms": [], "steal": [], "start": []}
                   for c in levels} for s in servers} for name in traffics}
    benches = {name: BenchSettings(concurrency=levels, repetitions=1, **settings) for name, settings in traffics.items()}
    start = 0
    for number in range(rounds):
        if max_s is not None and number >= 3 and time.monotonic() - started > max_s:
            logger.info("stopping after %d rounds: --max-minutes reached", number)
            break
        if restart is not None and restart_every > 0 and number > 0 and number % restart_every == 0:
            tic = time.monotonic()
            restart()
            start += 1
            logger.info("round %d/%d: every engine started afresh (start %d, %.0f s)", number + 1, rounds,
                        start + 1, time.monotonic() - tic)
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
                    cell["start"].append(start)
                logger.info("round %d/%d steps %d %s: %s (%.0f s)", number + 1, rounds, steps, name,
                            {c: round(data[name][steps][c]["tok"][-1], 1) for c in levels}, time.monotonic() - tic)
    return data


MAX_STEAL = 0.05
"""A repetition measured while the hypervisor gave more than this share of the host's CPU to other guests
is set aside (its figure is the neighbours'), as the confirmation does (``confirmation.max_host_cpu_steal``)."""


def _take(cell: dict[str, list[Any]], keep: list[int]) -> dict[str, list[Any]]:
    """The cell's rounds ``keep``: lists with one value per round are cut, the rest (a reanalysed report's one
    summed histogram) kept."""
    rounds = len(cell["tok"])
    return {name: [values[i] for i in keep] if len(values) == rounds else values for name, values in cell.items()}


def _starts(cell: dict[str, list[Any]]) -> Optional[list[Any]]:
    """Which engine start each of the cell's rounds was measured on; None where the cell does not say."""
    starts = cell.get("start") or []
    return starts if len(starts) == len(cell["tok"]) else None


def _quiet(cell: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The cell without its repetitions measured under CPU steal (all of them if every one was)."""
    keep = [i for i, steal in enumerate(cell.get("steal") or []) if steal is None or steal <= MAX_STEAL]
    if not keep or not cell.get("steal"):
        return cell
    return _take(cell, keep)


def per_start(values: list[float], starts: Optional[list[Any]]) -> list[float]:
    """Each engine start's mean of ``values``, in the order the starts came; the values themselves where
    they all come from one start or the cell does not say (its rounds then stand for independent
    measurements: an engine's own offset is in none of them, and no spread can show it)."""
    if not starts or len(starts) != len(values) or len(set(starts)) < 2:
        return list(values)
    groups: dict[Any, list[float]] = {}
    for value, start in zip(values, starts):
        groups.setdefault(start, []).append(value)
    return [statistics.fmean(group) for group in groups.values()]


def chain_of(steps: int, cell: dict[str, list[Any]]) -> MeasuredChain:
    """A chain's means over every kept repetition; its standard errors, and the throughput/cycle
    correlation, from the spread of its starts' means where it was measured on several starts
    (``per_start``: repetitions of one start share that start's offset), else of its repetitions."""
    cell = _quiet(cell)
    starts = _starts(cell)
    tok_means = [math.exp(v) for v in per_start([math.log(v) for v in cell["tok"]], starts)]
    cycle_means = per_start(cell["cycle"], starts)
    cycle_rel_se = _rel_se(cycle_means, log=False) * statistics.fmean(cycle_means) / statistics.fmean(cell["cycle"])
    return MeasuredChain(
        steps=steps, accept_length=statistics.median(cell["accept"]), cycle_ms=statistics.fmean(cell["cycle"]),
        cycle_rel_se=cycle_rel_se, tok_per_s=math.exp(statistics.fmean(math.log(v) for v in cell["tok"])),
        tok_rel_se=_rel_se(tok_means, log=True), histogram=tuple(sum_histograms(cell["histograms"]) or ()) or None,
        tok_cycle_corr=log_correlation(tok_means, cycle_means), dof=max(len(tok_means) - 1, 1))


def _aligned(cells: dict[int, dict[str, list[Any]]]) -> list[int]:
    """Rounds in which no chain's repetition was under CPU steal: the within-round analysis needs every
    chain in every round it keeps (all rounds if every one had steal somewhere)."""
    rounds = min(len(cell["tok"]) for cell in cells.values())
    keep = [i for i in range(rounds)
            if all((cell.get("steal") or [None] * rounds)[i] is None or cell["steal"][i] <= MAX_STEAL for cell in cells.values())]
    return keep or list(range(rounds))


def _residuals(columns: dict[int, list[float]]) -> dict[int, list[float]]:
    """Round x chain residuals of a two-way layout: each value less its round's mean and its chain's mean,
    plus the grand mean (what is left once the rounds' common speed is taken out)."""
    chains = list(columns)
    rounds = len(columns[chains[0]])
    round_mean = [statistics.fmean(columns[c][i] for c in chains) for i in range(rounds)]
    chain_mean = {c: statistics.fmean(columns[c]) for c in chains}
    grand = statistics.fmean(round_mean)
    return {c: [columns[c][i] - round_mean[i] - chain_mean[c] + grand for i in range(rounds)] for c in chains}


def within_round_chains(cells: dict[int, dict[str, list[Any]]]) -> dict[int, MeasuredChain]:
    """Every chain as measured (``chain_of``'s means), its standard errors those of a comparison within
    the rounds.

    All chains are measured in the same interleaved rounds, so a round in which the machine is slow is
    slow for every chain, and a prediction (built from measured chains) is compared with a measurement
    made in the same rounds: the rounds' common speed cancels from the comparison (the prediction's
    derivatives over the measured chains' log throughputs sum to one and over their log cycle times to
    zero). The spread that does not cancel is each chain's own, estimated from the round x chain
    two-way residuals (logs of throughput and of cycle time, rounds under CPU steal set aside whole) as
    k/(k-2) [S_j/(n-1) - sum_l S_l / ((n-1) k (k-1))], which stays unbiased when the chains' own noises
    differ (the plain k/(k-1) S_j/(n-1) gives a noisy chain too little and the quiet ones too much); the
    throughput/cycle correlation is the residuals'. Where the engines were started afresh between rounds
    (``start``), the layout is start x chain over each start's means, so an engine's own offset counts as
    the spread it is. ``chain_of`` keeps the raw spread: the between-starts interval a sweep prints, its
    trials measured at different times."""
    keep = _aligned(cells)
    first = _starts(next(iter(cells.values())))
    starts = [first[i] for i in keep] if first is not None else None
    tok_logs = {s: per_start([math.log(cell["tok"][i]) for i in keep], starts) for s, cell in cells.items()}
    cycle_logs = {s: per_start([math.log(cell["cycle"][i]) for i in keep], starts) for s, cell in cells.items()}
    n, k = len(next(iter(tok_logs.values()))), len(cells)
    tok_res, cycle_res = _residuals(tok_logs), _residuals(cycle_logs)

    def spreads(res: dict[int, list[float]]) -> dict[int, float]:
        """Each chain's standard error of its mean from the residuals (0 from fewer than two rounds or chains)."""
        if n < 2 or k < 2:
            return {s: 0.0 for s in res}
        squares = {s: sum(r * r for r in values) / (n - 1) for s, values in res.items()}
        if k == 2:  # the two chains' residuals mirror each other: only their pooled spread is known
            return {s: math.sqrt(squares[s] * 2 / n) for s in res}
        pooled = sum(squares.values()) / (k * (k - 1))
        return {s: math.sqrt(max(k / (k - 2) * (squares[s] - pooled), 0.0) / n) for s in res}

    tok_se, cycle_se = spreads(tok_res), spreads(cycle_res)
    return {s: dataclasses.replace(chain_of(s, cell), tok_rel_se=tok_se[s], cycle_rel_se=cycle_se[s],
                                   tok_cycle_corr=_correlation(tok_res[s], cycle_res[s]))
            for s, cell in cells.items()}


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    """Pearson correlation of residuals; None from fewer than three or without spread."""
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def _rows(measured: dict[int, MeasuredChain], *, from_steps: list[int]) -> dict[str, Any]:
    """Every chain not in ``from_steps`` predicted from those, beside its measurement."""
    predictions = predict_chains([measured[s] for s in from_steps], sorted(measured))
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
    return {
        "predicted": rows,
        "accept_within_3pct": sum(abs(r["accept_error_rel"]) <= 0.03 for r in rows),
        "covered": sum(r["covered"] for r in rows),
        "chains_predicted": len(rows),
        "median_half_width_rel": round(statistics.median(r["half_width_rel"] for r in rows), 4) if rows else None,
        "tok_rel_se": {str(s): round(c.tok_rel_se, 4) for s, c in measured.items()},
    }


def compare(data: dict, *, levels: list[int], from_steps: list[int]) -> dict[str, Any]:
    """Per level: every chain not in ``from_steps`` predicted from those, beside its measurement, with
    two intervals from one formula (``predict_chains``): ``between_starts`` from each chain's raw
    repetition spread (what a sweep prints: its trials are starts at different times) and
    ``within_rounds`` from the spread left once the rounds' common speed is taken out (the comparison this
    benchmark makes: every chain measured in the same rounds); ``summary`` pools the levels."""
    out: dict[str, Any] = {}
    all_steps = sorted(data)
    for level in levels:
        measured = {s: chain_of(s, data[s][level]) for s in all_steps}
        out[str(level)] = {
            "from_steps": from_steps,
            "set_aside_for_steal": {str(s): len(data[s][level]["tok"]) - len(_quiet(data[s][level])["tok"])
                                    for s in all_steps},
            "measured": {str(s): {"accept_length": round(measured[s].accept_length, 4),
                                  "tok_per_s": round(measured[s].tok_per_s, 2), "cycle_ms": round(measured[s].cycle_ms, 3),
                                  "tok_rel_se": round(measured[s].tok_rel_se, 4),
                                  "cycle_rel_se": round(measured[s].cycle_rel_se, 4), "histogram": measured[s].histogram}
                         for s in all_steps},
            "between_starts": _rows(measured, from_steps=from_steps),
            "within_rounds": _rows(within_round_chains({s: data[s][level] for s in all_steps}), from_steps=from_steps),
        }
    out["summary"] = {
        kind: {
            "covered": sum(out[str(c)][kind]["covered"] for c in levels),
            "chains_predicted": sum(out[str(c)][kind]["chains_predicted"] for c in levels),
            "accept_within_3pct": sum(out[str(c)][kind]["accept_within_3pct"] for c in levels),
            "median_half_width_rel": round(statistics.median(
                r["half_width_rel"] for c in levels for r in out[str(c)][kind]["predicted"]), 4)
            if any(out[str(c)][kind]["predicted"] for c in levels) else None,
        } for kind in ("within_rounds", "between_starts")}
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


def settled(data: dict, *, settle_rounds: int) -> dict:
    """``data`` (steps -> level -> cell) without each start's first ``settle_rounds`` rounds: an engine's
    first round after a start can still be warming up (one H100, run 8: 20-50% slower than the next round
    of the same start), which the harness's warm-up windows settle in a sweep and this benchmark's one
    warm-up request does not. Lists with one value per round are cut, the rest kept; a start with no
    round left (the last one, cut short by ``--max-minutes``) drops out.

    Raises:
        ValueError: no round is left at all.
    """
    if settle_rounds <= 0:
        return data
    out: dict = {}
    for steps, by_level in data.items():
        out[steps] = {}
        for level, cell in by_level.items():
            starts = _starts(cell) or [0] * len(cell["tok"])
            seen: dict[Any, int] = {}
            keep = []
            for i, start in enumerate(starts):
                seen[start] = seen.get(start, 0) + 1
                if seen[start] > settle_rounds:
                    keep.append(i)
            if not keep:
                raise ValueError(f"settle_rounds={settle_rounds} leaves steps {steps} at c{level} no round "
                                 f"(rounds per start: {sorted(seen.values())})")
            out[steps][level] = _take(cell, keep)
    return out


def start_engines(servers: list, flags: list[str], *, at_once: int, timeout_s: float) -> None:
    """Start ``servers`` with ``flags``, at most ``at_once`` at a time (0: all), each group healthy before the
    next starts: engines loading together on one GPU can run it out of memory."""
    group = at_once or len(servers)
    for first in range(0, len(servers), group):
        for server in servers[first:first + group]:
            server.start(flags, dict(os.environ))
        for server in servers[first:first + group]:
            server.wait_healthy(timeout_s)


DESIGN_ROLES = {
    "longest_and_shortest": "the fewest starts: the longest chain (its histogram) and the two ends of the cycle "
                            "line; its steps-3 row is the sweep's held-out check of SGLang's chain",
    "longest_and_default": "SGLang's chain and the longest: the sweep's opening before the shortest chain joined it",
    "shortest_default_longest": "the sweep's opening (SGLang's chain, the longest, the shortest): what a sweep "
                                "predicts its other chains from",
}
"""What each design of :func:`results` stands for."""


def results(data: dict, *, levels: list[int], max_steps: int, settle_rounds: int = 0) -> dict[str, Any]:
    """Every design's predictions against the measurements (each start's first ``settle_rounds`` rounds
    left out: ``settled``), and every round made (histograms aside)."""
    designs = {"longest_and_shortest": [1, max_steps], "longest_and_default": [3, max_steps],
               "shortest_default_longest": [1, 3, max_steps]}
    kept = settled(data, settle_rounds=settle_rounds)
    return {
        "settle_rounds": settle_rounds,
        "design_roles": DESIGN_ROLES,
        "designs": {name: compare(kept, levels=levels, from_steps=sorted(set(steps)))
                    for name, steps in designs.items() if len(set(steps)) > 1},
        "rounds": {str(s): {str(c): {k: v for k, v in data[s][c].items() if k != "histograms"} for c in levels}
                   for s in data},
    }


def reanalyse(path: Path, *, settle_rounds: Optional[int] = None) -> dict[str, Any]:
    """A saved report's rounds analysed again: each chain's cells rebuilt from ``rounds`` with the summed
    histogram its report kept (one entry: the accept length's prediction reads the histogram's shape);
    ``settle_rounds`` defaults to the report's own."""
    old = json.loads(path.read_text())
    if settle_rounds is None:
        settle_rounds = int(old.get("settle_rounds") or 0)
    levels = [int(c) for c in old["settings"]["levels"]]
    steps_all = sorted(int(s) for s in old["rounds"])
    kept = next(iter(old["designs"].values()))
    data = {s: {c: {**old["rounds"][str(s)][str(c)],
                    "histograms": [kept[str(c)]["measured"][str(s)].get("histogram")]} for c in levels}
            for s in steps_all}
    return {"reanalysed_from": str(path), "machine": old.get("machine"), "settings": old.get("settings"),
            "measure_s": old.get("measure_s"), "rounds_made": old.get("rounds_made"),
            "starts_made": old.get("starts_made", 1),
            **results(data, levels=levels, max_steps=max(steps_all), settle_rounds=settle_rounds)}


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
    parser.add_argument("--restart-every", type=int, default=0, metavar="K",
                        help="Start every engine afresh before every K-th round (default 0: one start for the whole "
                             "run): the chains' standard errors then come from their starts' means, an engine's own "
                             "offset included, which no spread within one start shows")
    parser.add_argument("--start-at-once", type=int, default=0, metavar="N",
                        help="Start at most N engines at a time, each group healthy before the next starts (default "
                             "0: all at once): on one GPU, engines loading at once can run it out of memory "
                             "(six ref-gpu-comm engines on an H100 did)")
    parser.add_argument("--request-log", default=None, metavar="JSONL",
                        help="Also measure every chain on this OpenAI-format request log through /v1/chat/completions "
                             "(each request's messages, output cap and sampling), beside the built-in prompts, in "
                             "the same rounds: e.g. experiments/traffic/chat-log.jsonl")
    parser.add_argument("--settle-rounds", type=int, default=None, metavar="N",
                        help="Leave each start's first N rounds out of the analysis (they stay in 'rounds'): an engine "
                             "still warming up after a start (default 0; with --reanalyse, the report's own)")
    parser.add_argument("--reanalyse", default=None, metavar="REPORT_JSON",
                        help="Start nothing: analyse the rounds a report of this script kept (its 'rounds' and each "
                             "chain's histogram) again, with this version's designs and intervals")
    args = parser.parse_args(argv)
    if args.start_at_once < 0:
        parser.error(f"--start-at-once must be 0 (all at once) or more, got {args.start_at_once}")
    if args.restart_every < 0:
        parser.error(f"--restart-every must be 0 (never) or a number of rounds, got {args.restart_every}")
    if args.settle_rounds is not None and args.settle_rounds < 0:
        parser.error(f"--settle-rounds must be 0 or more, got {args.settle_rounds}")
    if args.restart_every and args.settle_rounds and args.settle_rounds >= args.restart_every:
        parser.error(f"--settle-rounds {args.settle_rounds} would leave out every round of a start: each start "
                     f"has --restart-every {args.restart_every} rounds; use fewer settle rounds or restart less often")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.reanalyse:
        json.dump(reanalyse(Path(args.reanalyse), settle_rounds=args.settle_rounds), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    settle_rounds = args.settle_rounds or 0
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

        def start_all() -> None:
            start_engines(list(servers.values()), common, at_once=args.start_at_once, timeout_s=args.start_timeout)

        def restart_all() -> None:
            for server in servers.values():
                server.stop()
            start_all()

        try:
            start_all()
            tic = time.monotonic()
            data = measure(servers, levels=args.levels, rounds=args.rounds, traffics=traffics,
                           max_s=args.max_minutes * 60 if args.max_minutes is not None else None,
                           restart_every=args.restart_every, restart=restart_all)
            elapsed = time.monotonic() - tic
        finally:
            for server in servers.values():
                server.stop()
    first_cell = next(iter(next(iter(data["builtin"].values())).values()))
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {**vars(args), "bench": settings},
        "measure_s": round(elapsed, 1),
        "rounds_made": len(first_cell["tok"]),
        "starts_made": len(set(first_cell["start"])),
        **results(data["builtin"], levels=args.levels, max_steps=args.max_steps, settle_rounds=settle_rounds),
    }
    if args.request_log:
        report["request_log"] = {**results(data["request_log"], levels=args.levels, max_steps=args.max_steps,
                                           settle_rounds=settle_rounds),
                                 "side_by_side": side_by_side(data, levels=args.levels)}
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
