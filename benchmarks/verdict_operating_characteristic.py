"""The verdict's operating characteristic, from the product's own decision code.

Each simulated confirmation is ``orchestrator.sweep.confirmation.confirm.run_confirmation`` itself, on records
of a search with one search contender or three equally fast ones, SGLang's default and no
speculation, and a visit function that draws each visit's value as ``true speed x exp(N(0, cv))``
with a round-level drift shared by every visit of the round (it cancels in the pairs; it is there
to show that it does). For every true ratio (search contenders / SGLang's default) and
between-visit CV it prints P(better) (the interval above 1), P(better and clears the margin),
P(equivalent), P(worse), P(undecided), the mean visits per contender and the mean engine starts,
as JSON; ``--table`` prints the markdown table of docs/confirmation.md from that JSON.

    python benchmarks/verdict_operating_characteristic.py --runs 1000 > out.json
    python benchmarks/verdict_operating_characteristic.py --table out.json

The Kimi specs' night design (experiments/kimi-*.yaml: top_k 1, max_visits 6, margin 0.03,
no_speculation false) at the project's measured GPU between-visit spreads:

    python benchmarks/verdict_operating_characteristic.py --margin 0.03 --max-visits 6 \
        --no-speculation false --contenders 1 --ratios 1.0 1.03 --cvs 0.008 0.01 --runs 2000

Monte Carlo error: a rate p from R runs has a standard error sqrt(p (1 - p) / R) (0.49 points at
p = 2.5%, R = 1000); the JSON carries it per cell.

``--economy`` instead compares, on a simulated node whose start costs ``--start-s`` and repetition
``--repetition-s`` with between-visit CV ``--between-cv`` and within-visit CV ``--within-cv``,
the engine starts to a verdict with today's default (``repetitions_per_visit: auto``, the visit
economy) against one repetition per visit (the rule before it).

``--extension`` instead measures the false-claim rate of a design extended past its last look
(``spectune sweep --resume DIR --max-visits N``; ``orchestrator.sequential.extend``) at a true
ratio on the boundary, from simulated t statistics (``--paths`` per design, seeded): the main
design alone, main + one extension to each fixed ``N``, main + the extension the undecided verdict
itself proposes (``confirm._continuation``: ``sequential.decisive_look`` at the measured spread
and a mean one standard error toward a decision: ``N`` chosen from the data), and an upper bound
on any choice of ``N`` (a path counts if the extension to *any* of the listed ``N`` would cross,
as if ``N`` were chosen knowing the future). Each must stay within
``ALPHA`` = 2.5% (the union bound's guarantee is for ``N`` fixed before the extension's visits).

    python benchmarks/verdict_operating_characteristic.py --extension --paths 200000 > ext.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.spec import SweepSpec  # noqa: E402
from orchestrator.sweep.confirmation.confirm import run_confirmation  # noqa: E402
from orchestrator.sweep.confirmation.margin import confirmation_margin  # noqa: E402
from orchestrator.sweep.records.results import Objective, TrialRecord  # noqa: E402

RATIOS = (0.97, 0.99, 1.0, 1.01, 1.03, 1.05, 1.08, 1.15)
CVS = (0.02, 0.05, 0.10, 0.16)
DEFAULT_SPEED = 100.0


def spec(*, margin: float | None = None, repetitions: Any = 1, max_visits: int = 16, min_visits: int = 3,
         top_k: int = 3, no_speculation: bool = True) -> SweepSpec:
    confirmation: dict[str, Any] = {"top_k": top_k, "min_visits": min_visits, "max_visits": max_visits,
                                    "repetitions_per_visit": repetitions, "no_speculation": no_speculation}
    if margin is not None:
        confirmation["margin"] = margin
    return SweepSpec.from_dict({
        "name": "oc", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "objective": {"metric": "output_tok_per_s", "concurrency": 4}, "benchmark": {"concurrency": [4]},
        "confirmation": confirmation,
    })


def _record(number: int, kind: str, values: list[float], *, start_s: float, rep_s: float) -> TrialRecord:
    params = {"speculative": {"baseline_plain": "off", "baseline_auto": "auto"}.get(kind, "explicit"),
              "num_steps": None if kind != "search" else number, "eagle_topk": None if kind != "search" else 1,
              "num_draft_tokens": None if kind != "search" else number + 1, "all_reduce": "default"}
    median = sorted(values)[len(values) // 2]
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=f"config {number}", params=params, status="ok",
        objective=Objective(metric="output_tok_per_s", concurrency=4, direction="max", values=values, median=median),
        repetitions_done=len(values), repetitions_planned=len(values), measured_in_full=True,
        level_values={"4": values}, timings_s={"engine_start": start_s, "bench": rep_s * len(values)},
    )


def simulate(*, ratio: float, between_cv: float, contenders: int, seed: int, settings: SweepSpec,
             within_cv: float = 0.0, start_s: float = 10.0, rep_s: float = 4.0, drift_cv: float = 0.02) -> dict:
    """One confirmation: its verdict, visits per contender and engine starts."""
    rng = random.Random(seed)
    speeds = {1: DEFAULT_SPEED / 2, 2: DEFAULT_SPEED}
    for i in range(contenders):
        speeds[3 + i] = DEFAULT_SPEED * ratio

    def draw(number: int, n: int) -> list[float]:
        return [speeds[number] * rng.lognormvariate(0.0, within_cv) if within_cv else speeds[number]
                for _ in range(n)]

    records = [_record(1, "baseline_plain", draw(1, 3), start_s=start_s, rep_s=rep_s),
               _record(2, "baseline_auto", draw(2, 3), start_s=start_s, rep_s=rep_s)]
    records += [_record(3 + i, "search", draw(3 + i, 3), start_s=start_s, rep_s=rep_s) for i in range(contenders)]
    drift: dict[int, float] = {}
    starts = [0]

    def visit(record: TrialRecord, round_number: int, *, repetitions: int = 1) -> dict:
        starts[0] += 1
        shared = drift.setdefault(round_number, rng.lognormvariate(0.0, drift_cv))
        level = speeds[record.number] * shared * rng.lognormvariate(0.0, between_cv)
        values = [level * (rng.lognormvariate(0.0, within_cv) if within_cv else 1.0) for _ in range(repetitions)]
        return {"values": values, "status": "ok", "reason": None, "message": "",
                "timings": {"engine_start": start_s, "bench": rep_s * repetitions}}

    result = run_confirmation(settings, records, visit=visit, say=lambda _line: None, advise=False)
    assert result is not None
    verdict = result.vs_sglang_default or {"kind": "undecided", "visits": 0}
    return {"kind": verdict["kind"], "clears_margin": bool(verdict.get("clears_margin")),
            "visits": max((v["round"] for v in result.visits), default=-1) + 1,
            "starts": starts[0], "repetitions": sum(len(v["values"]) for v in result.visits),
            "seconds": starts[0] * start_s + sum(len(v["values"]) for v in result.visits) * rep_s}


def _cell(args: tuple) -> dict:
    ratio, cv, contenders, runs, seed, margin, max_visits, no_speculation = args
    settings = spec(margin=margin, top_k=contenders, max_visits=max_visits, no_speculation=no_speculation)
    counts = {"better": 0, "clears_margin": 0, "equivalent": 0, "worse": 0, "undecided": 0}
    visits = starts = 0
    for r in range(runs):
        out = simulate(ratio=ratio, between_cv=cv, contenders=contenders, seed=seed * 1_000_003 + r, settings=settings)
        counts[out["kind"]] += 1
        counts["clears_margin"] += out["clears_margin"]
        visits += out["visits"]
        starts += out["starts"]
    cell: dict[str, Any] = {"true_ratio": ratio, "between_visit_cv": cv, "search_contenders": contenders,
                            "runs": runs, "mean_visits": round(visits / runs, 2), "mean_starts": round(starts / runs, 2)}
    for kind, count in counts.items():
        p = count / runs
        cell[f"p_{kind}"] = round(p, 4)
        cell[f"se_{kind}"] = round(math.sqrt(max(p * (1 - p), 1.0 / runs) / runs), 4)
    return cell


def operating_characteristic(*, runs: int, seed: int, margin: float | None, ratios=RATIOS, cvs=CVS,
                             contenders=(1, 3), workers: int = 2, max_visits: int = 16,
                             no_speculation: bool = True) -> dict:
    jobs = [(ratio, cv, k, runs, seed + i, margin, max_visits, no_speculation) for i, (ratio, cv, k) in
            enumerate((r, c, k) for k in contenders for c in cvs for r in ratios)]
    started = time.monotonic()
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            cells = list(pool.map(_cell, jobs))
    else:
        cells = [_cell(job) for job in jobs]
    settings = spec(margin=margin, max_visits=max_visits, no_speculation=no_speculation)
    return {
        "command": "python benchmarks/verdict_operating_characteristic.py " + " ".join(sys.argv[1:]),
        "decision": "orchestrator.sweep.confirmation.confirm.run_confirmation (orchestrator/sequential.py: Lan-DeMets "
                    "O'Brien-Fleming spending, one-sided 2.5% per claim (2.0% in the main design, 0.5% held for "
                    "extensions), the leader Bonferroni-corrected over the search contenders; better: the interval "
                    "above 1, clears_margin: also above 1 + margin; TOST for equivalent)",
        "noise": "simulated: log-normal between-visit noise at the stated CV, a shared round drift of 2%",
        "margin": confirmation_margin(settings), "min_visits": settings.confirmation.min_visits,
        "max_visits": settings.confirmation.max_visits, "no_speculation": settings.confirmation.no_speculation,
        "repetitions_per_visit": 1, "round_drift_cv": 0.02,
        "seed": seed, "wall_s": round(time.monotonic() - started, 1), "cells": cells,
    }


def economy(*, runs: int, seed: int, start_s: float, rep_s: float, between_cv: float, within_cv: float,
            ratio: float, margin: float | None, max_visits: int) -> dict:
    out: dict[str, Any] = {
        "command": "python benchmarks/verdict_operating_characteristic.py " + " ".join(sys.argv[1:]),
        "node": {"start_s": start_s, "repetition_s": rep_s, "between_visit_cv": between_cv, "within_visit_cv": within_cv,
                 "true_ratio": ratio}, "runs": runs,
    }
    for name, repetitions in (("one_repetition_per_visit", 1), ("visit_economy_auto", "auto")):
        settings = spec(margin=margin, repetitions=repetitions, max_visits=max_visits, top_k=1)
        results = [simulate(ratio=ratio, between_cv=between_cv, contenders=1, seed=seed + r, settings=settings,
                            within_cv=within_cv, start_s=start_s, rep_s=rep_s) for r in range(runs)]
        decided = [r for r in results if r["kind"] != "undecided"]
        out[name] = {
            "p_decided": round(len(decided) / runs, 3),
            "p_better": round(sum(r["kind"] == "better" for r in results) / runs, 3),
            "mean_starts": round(sum(r["starts"] for r in results) / runs, 2),
            "mean_starts_when_decided": round(sum(r["starts"] for r in decided) / len(decided), 2) if decided else None,
            "mean_hours": round(sum(r["seconds"] for r in results) / runs / 3600, 2),
        }
    return out


def _t_paths(paths: int, looks: int, seed: int) -> tuple[Any, Any, Any]:
    """Per path and look ``n = 1..looks``: the mean, the sd and the t statistic of ``n`` standard
    normal pairs (a true ratio on the boundary: the statistic's null distribution)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d = rng.standard_normal((paths, looks))
    n = np.arange(1, looks + 1, dtype=np.float64)
    sums, squares = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
    mean = sums / n
    var = np.maximum((squares - n * mean * mean) / np.maximum(n - 1.0, 1.0), 1e-300)
    return mean, np.sqrt(var), mean / np.sqrt(var / n)


def _crosses(t_stats: Any, design: tuple, *, start: int, stop: int, comparisons: int) -> Any:
    """Whether each path's t statistic reaches the design's boundary at a look in ``start..stop``."""
    import numpy as np

    from orchestrator.sequential import critical_value

    critical = np.array([critical_value(n, design=design, comparisons=comparisons) for n in range(start, stop + 1)])
    return (t_stats[:, start - 1:stop] >= critical).any(axis=1)


def extension_error(*, paths: int, seed: int, first: int, last: int, extensions: tuple[int, ...], comparisons: int,
                    proposed_paths: int = 20_000) -> dict:
    """One main design ``first..last`` and its extensions: the false-claim rates (one claim, at a true
    ratio on its boundary) described in the module docstring. The proposed ``N`` depends only on how
    far the measured mean is from the boundary, in sds (the margin's own size cancels)."""
    import numpy as np

    from orchestrator.sequential import MAX_LOOK, decisive_look, extend, main_design

    main = main_design(first, last)
    top = max(max(extensions), MAX_LOOK)
    mean, sd, t_stats = _t_paths(paths, top, seed)
    main_cross = _crosses(t_stats, main, start=first, stop=last, comparisons=comparisons)
    out: dict[str, Any] = {"main_design": [first, last], "comparisons": comparisons, "paths": paths,
                           "p_main": round(float(main_cross.mean()), 5), "fixed_n": {}}
    cross_by_n = {}
    for n in extensions:
        cross_by_n[n] = _crosses(t_stats, extend(main, n), start=last + 1, stop=n, comparisons=comparisons)
        out["fixed_n"][str(n)] = round(float((main_cross | cross_by_n[n]).mean()), 5)
    any_n = np.zeros(paths, dtype=bool)
    for cross in cross_by_n.values():
        any_n |= cross
    out["any_listed_n_upper_bound"] = round(float((main_cross | any_n).mean()), 5)
    sample = min(paths, proposed_paths)
    bound = 1.0  # log(1 + margin), in units of the pairs' sd; the true mean sits on it
    crossed = main_cross[:sample].copy()
    proposed: list[int] = []
    for i in np.flatnonzero(~crossed):
        # the verdict's own proposal (confirm._continuation): the fewest visits a ratio one standard
        # error from the measured one, toward a decision, would need, by the extension's boundaries
        # the worse claim's mirror (its decision distance depends only on the distance to its boundary)
        measured, spread = -abs(bound + float(mean[i, last - 1])), float(sd[i, last - 1])
        se = spread / math.sqrt(last)
        targets = [decisive_look(log_mean=m, log_sd=spread, margin=math.exp(bound) - 1.0, design=main,
                                 comparisons=comparisons) for m in (measured - se, min(measured + se, 0.0))]
        known = [n for n in targets if n is not None]
        n = min(known) if known else None
        if n is None or n <= last:
            continue
        proposed.append(n)
        crossed[i] = bool(_crosses(t_stats[i:i + 1], extend(main, n), start=last + 1, stop=n,
                                   comparisons=comparisons)[0])
    rate = float(crossed.mean())
    out["proposed_n"] = {"p_false": round(rate, 5), "paths": sample,
                         "extended": len(proposed), "median_n": int(np.median(proposed)) if proposed else None,
                         "se": round(math.sqrt(max(rate * (1 - rate), 1.0 / sample) / sample), 5)}
    out["se_at_alpha"] = round(math.sqrt(0.025 * 0.975 / paths), 5)
    return out


def extension(*, paths: int, seed: int) -> dict:
    from orchestrator.sequential import ALPHA, EXTENSION_RESERVE

    started = time.monotonic()
    designs = [extension_error(paths=paths, seed=seed + i, first=first, last=last, extensions=extensions,
                               comparisons=k)
               for i, (first, last, extensions, k) in enumerate([
                   (3, 3, (4, 5, 6, 8, 12, 16), 1), (3, 8, (9, 10, 12, 16, 24, 32), 1),
                   (3, 8, (9, 12, 16, 24), 3), (3, 16, (17, 20, 24, 32, 48), 1)])]
    return {"command": "python benchmarks/verdict_operating_characteristic.py " + " ".join(sys.argv[1:]),
            "alpha": ALPHA, "extension_reserve": EXTENSION_RESERVE, "seed": seed,
            "wall_s": round(time.monotonic() - started, 1), "designs": designs}


def table(data: dict) -> str:
    rows = ["| contenders | between-visit CV | true ratio | P(better) | of which clear the margin | P(equivalent) | "
            "P(worse) | P(undecided) | mean visits |", "|---|---|---|---|---|---|---|---|---|"]
    for c in data["cells"]:
        rows.append(f"| {c['search_contenders']} | {c['between_visit_cv']:.1%} | x{c['true_ratio']:.2f} | "
                    f"{c['p_better']:.3f} | {c.get('p_clears_margin', 0.0):.3f} | {c['p_equivalent']:.3f} | "
                    f"{c['p_worse']:.3f} | {c['p_undecided']:.3f} | {c['mean_visits']:.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="Simulated confirmations per cell.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--margin", type=float, default=None, help="confirmation.margin (default: the spec's).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--table", metavar="JSON", help="Print the markdown table of a result file.")
    parser.add_argument("--economy", action="store_true", help="Engine starts to a verdict: economy vs one repetition.")
    parser.add_argument("--start-s", type=float, default=300.0)
    parser.add_argument("--repetition-s", type=float, default=30.0)
    parser.add_argument("--between-cv", type=float, default=0.01)
    parser.add_argument("--within-cv", type=float, default=0.05)
    parser.add_argument("--ratio", type=float, default=1.05)
    parser.add_argument("--max-visits", type=int, default=16, help="confirmation.max_visits (default 16).")
    parser.add_argument("--no-speculation", choices=("true", "false"), default="true",
                        help="confirmation.no_speculation (default true). The Kimi specs' night design: "
                             "--margin 0.03 --max-visits 6 --no-speculation false.")
    parser.add_argument("--ratios", nargs="+", type=float, default=None, help=f"True ratios (default {RATIOS}).")
    parser.add_argument("--cvs", nargs="+", type=float, default=None, help=f"Between-visit CVs (default {CVS}).")
    parser.add_argument("--contenders", nargs="+", type=int, default=None, help="Search contenders (default 1 3).")
    parser.add_argument("--cell", nargs=3, type=float, metavar=("RATIO", "CV", "CONTENDERS"),
                        help="Only this cell (true ratio, between-visit CV, search contenders), e.g. to re-measure "
                             "the worst cell of a table with --runs 20000.")
    parser.add_argument("--extension", action="store_true",
                        help="False claims of extended designs (main + one extension, fixed and proposed N).")
    parser.add_argument("--paths", type=int, default=200_000, help="Simulated t-statistic paths (--extension).")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    if args.extension:
        print(json.dumps(extension(paths=args.paths, seed=args.seed), indent=2))
        return 0
    if args.economy:
        result = economy(runs=args.runs, seed=args.seed, start_s=args.start_s, rep_s=args.repetition_s,
                         between_cv=args.between_cv, within_cv=args.within_cv, ratio=args.ratio, margin=args.margin,
                         max_visits=args.max_visits)
    else:
        cell = {} if args.cell is None else {"ratios": (args.cell[0],), "cvs": (args.cell[1],),
                                             "contenders": (int(args.cell[2]),)}
        for name in ("ratios", "cvs", "contenders"):
            if getattr(args, name) is not None and args.cell is None:
                cell[name] = tuple(getattr(args, name))
        result = operating_characteristic(runs=args.runs, seed=args.seed, margin=args.margin, workers=args.workers,
                                          max_visits=args.max_visits, no_speculation=args.no_speculation == "true",
                                          **cell)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
