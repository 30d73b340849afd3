"""Turn a sweep's ``trials.jsonl`` into a grid that ``benchmarks/search_efficiency.py`` replays.

A grid is made with the sweep itself: a spec whose ``budget.num_trials`` covers its whole space
(the searcher ends the sweep with FINISHED once every point is measured), then this converter.
Several sweeps of the same spec (``trials.jsonl`` of each) make a better grid: each
configuration's value is the median of its medians (one sweep run while the machine was busy
does not move it), and ``noise_cv`` is the pooled coefficient of
variation *between* sweeps — the noise a live sweep's single measurement of a configuration
carries, drift of a busy machine included. From one sweep, ``noise_cv`` falls back on the spread of
the repetitions within each trial (pooled CV / sqrt(repetitions)), which misses that drift.

Each point also carries, where the trials recorded them, the accepted-draft histogram (summed), the
cycle time and the accept length at the objective's level: what ``search_efficiency.py`` replays the
sweep's chain predictions from. Only ``ok`` trials measured in full give values; any other ending (failed, infeasible, stopped
early) is a failed point, as the searcher would have seen it.

``--simulate-nccl`` adds NCCL presets for a CPU grid, whose gloo all-reduce NCCL variables cannot
touch: every point of the space is crossed with the presets of ``SIMULATED_NCCL``, its value
multiplied by the preset's factor. The grid's name and description then say "simulated".

    python benchmarks/grid_from_sweep.py /tmp/grid-a/trials.jsonl /tmp/grid-b/trials.jsonl \\
        --spec benchmarks/data/reference-cpu-grid.yaml -o benchmarks/data/reference-cpu-grid.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_efficiency import GridError, plan_from_params  # noqa: E402  (the grid format's one reader of params)

from orchestrator.space import candidate_key  # noqa: E402
from orchestrator.spec import SweepSpec  # noqa: E402

__all__ = ["SIMULATED_NCCL", "dumps_grid", "grid_from_trials", "simulate_nccl", "space_of"]

SIMULATED_NCCL: list[tuple[dict[str, str], float]] = [
    ({}, 4.55 / 4.55),
    ({"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}, 4.55 / 4.71),
    ({"NCCL_ALGO": "Tree"}, 4.55 / 4.88),
    ({"NCCL_PROTO": "Simple"}, 4.55 / 5.04),
]
"""Simulated NCCL presets and their throughput factors, from a 2x H200 (NVLink) measurement of a
memory-bound TP=2 decode step (hidden 8192, 32 layers, batch 8): 4.55 ms with NCCL's defaults,
4.55-5.04 ms with the forced ALGO/PROTO settings tried. The forced presets are spread evenly over
that range (4.71, 4.88, 5.04 ms; which setting measured which time was not recorded) and act
independently of the speculative numbers: factor = 4.55 / step time. NCCL's defaults stay the
best, as measured there."""


def _records(paths: Iterable[Path]) -> list[list[dict[str, Any]]]:
    """The trial records of each sweep (one list per ``trials.jsonl``)."""
    sweeps = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        sweeps.append([json.loads(line) for line in lines if line.strip()])
    return sweeps


def _grid_params(params: dict[str, Any]) -> dict[str, Any]:
    """A record's params in the grid's names: the fixed ``env.*`` entries dropped, unset as absent."""
    return {k: v for k, v in params.items()
            if not k.startswith("env.") and v is not None and (v != "default" or k == "all_reduce")}


def _value(record: dict[str, Any]) -> float | None:
    """The objective's median of a trial measured in full, else ``None`` (a failed point)."""
    objective = record.get("objective") or {}
    full = record.get("measured_in_full", record.get("repetitions_done", 0) >= record.get("repetitions_planned", 1))
    if record.get("status") != "ok" or not full or not isinstance(objective.get("median"), (int, float)):
        return None
    return float(objective["median"])


def _pooled_cv(groups: list[list[float]]) -> float:
    """sqrt(mean of var/mean^2) over the groups of two or more values: one CV for the whole grid."""
    ratios = [statistics.variance(g) / statistics.fmean(g) ** 2 for g in groups if len(g) >= 2 and statistics.fmean(g)]
    return math.sqrt(statistics.fmean(ratios)) if ratios else 0.0


def _keep_chain_figures(into: dict[str, list[Any]], record: dict[str, Any], level: Any) -> None:
    """Collect what the chain prediction reads (``sweep.output.predicted_rows``) at the objective's level:
    the accepted-draft histogram, cycle_ms and the accept length, where the record has them."""
    if level is None:
        return
    histogram = (record.get("accept_histograms") or {}).get(str(level))
    metrics = record.get("metrics") or {}
    for name, value in (("histogram", histogram), ("cycle_ms", metrics.get(f"c{level}.cycle_ms")),
                        ("accept_length", metrics.get(f"c{level}.accept_length_requests"))):
        if value:
            into.setdefault(name, []).append(value)


def _chain_figures(kept: dict[str, list[Any]]) -> dict[str, Any]:
    """A point's chain figures: the summed histogram, the median cycle time and accept length."""
    out: dict[str, Any] = {}
    if kept.get("histogram"):
        width = max(len(h) for h in kept["histogram"])
        out["histogram"] = [sum(h[k] if k < len(h) else 0 for h in kept["histogram"]) for k in range(width)]
    for name in ("cycle_ms", "accept_length"):
        if kept.get(name):
            out[name] = round(statistics.median(kept[name]), 4)
    return out


def grid_from_trials(sweeps: list[list[dict[str, Any]]], *, name: str, space: dict[str, Any] | None) -> dict[str, Any]:
    """The grid of one or more sweeps' records (see the module docstring for values and noise)."""
    values: dict[str, list[float]] = {}
    params: dict[str, dict[str, Any]] = {}
    failed: set[str] = set()
    within: list[list[float]] = []
    chain: dict[str, dict[str, list[Any]]] = {}  # key -> histograms, cycle times, accept lengths (objective level)
    metric, mode = "output_tok_per_s", "max"
    for records in sweeps:
        for i, record in enumerate(records):
            grid_params = _grid_params(record["params"])
            key = candidate_key(plan_from_params(grid_params, f"trial {record.get('number', i)}"))
            params.setdefault(key, grid_params)
            value = _value(record)
            if value is None:
                failed.add(key)
                continue
            values.setdefault(key, []).append(value)
            objective = record["objective"]
            metric, mode = objective.get("metric", metric), objective.get("direction", mode)
            within.append(list(objective.get("values") or []))
            _keep_chain_figures(chain.setdefault(key, {}), record, objective.get("concurrency"))
    if len(sweeps) > 1:
        noise_cv = _pooled_cv(list(values.values()))
    else:
        reps = statistics.median([len(v) for v in within]) if within else 1
        noise_cv = _pooled_cv(within) / math.sqrt(reps)
    points = []
    for key, grid_params in params.items():
        measured = values.get(key)
        value = round(statistics.median(measured), 2) if measured else None
        points.append({"params": grid_params, "value": value, "status": "ok" if measured else "failed",
                       "measurements": len(measured or []), **_chain_figures(chain.get(key, {}))})
    grid: dict[str, Any] = {"name": name, "metric": metric, "mode": mode, "noise_cv": round(noise_cv, 4)}
    if space is not None:
        grid["space"] = space
    grid["points"] = points
    return grid


def space_of(spec: SweepSpec) -> dict[str, Any]:
    """The spec's space in the grid's terms, in the spec's own form: dimensions stay dimensions (the
    searcher samples them as a live sweep does, steps then top-k then draft), listed triples and
    NCCL presets stay lists."""
    search = spec.search
    out: dict[str, Any] = {}
    speculative = search.speculative
    if speculative is not None and speculative.triples is not None:
        out["speculative"] = (["auto"] if speculative.include_auto else []) + [list(t) for t in speculative.triples]
    elif speculative is not None:
        numbers = spec.space().speculative
        out.update(num_steps=list(numbers.num_steps), eagle_topk=list(numbers.eagle_topk),
                   num_draft_tokens=list(numbers.num_draft_tokens), include_auto=numbers.include_auto)
    out["all_reduce"] = list(search.all_reduce)
    if search.nccl_presets is not None:
        out["nccl_env"] = [dict(p) for p in search.nccl_presets]
    out.update({name: list(values) for name, values in sorted(search.nccl_env.items())})
    return out


def simulate_nccl(grid: dict[str, Any], presets: list[tuple[dict[str, str], float]] = SIMULATED_NCCL) -> dict[str, Any]:
    """``grid`` crossed with simulated NCCL presets (see ``SIMULATED_NCCL``); baselines keep NCCL's defaults.

    Raises:
        GridError: the grid already has NCCL variables (nothing to simulate).
    """
    if any(k.startswith("NCCL_") for p in grid["points"] for k in p["params"]):
        raise GridError("the grid already holds NCCL variables; --simulate-nccl is for grids without them")
    points = []
    for point in grid["points"]:
        plain = point["params"].get("speculative") == "off"
        for env, factor in presets[:1] if plain else presets:
            value = round(point["value"] * factor, 2) if point["value"] is not None else None
            # the preset moves the cycle time (tok/s ~ 1 / cycle), not the acceptance
            cycle = {"cycle_ms": round(point["cycle_ms"] / factor, 4)} if point.get("cycle_ms") else {}
            points.append({**point, **cycle, "params": {**point["params"], **env}, "value": value,
                           **({"simulated_factor": round(factor, 4)} if env else {})})
    simulated = ("NCCL presets simulated: measured values x factors from 2x H200 decode-step times "
                 "(NCCL's defaults 4.55 ms, forced settings 4.55-5.04 ms; "
                 "benchmarks/grid_from_sweep.py SIMULATED_NCCL)")
    description = f"{grid['description']}; {simulated}" if grid.get("description") else simulated
    out = {**grid, "name": f"{grid['name']}+simulated-nccl", "description": description, "points": points}
    if "space" in grid:
        out["space"] = {**grid["space"], "nccl_env": [env for env, _ in presets]}
    return out


def dumps_grid(grid: dict[str, Any]) -> str:
    """The grid as JSON a person can read and diff: one line per key, per space dimension, per point."""
    lines = ["{"]
    items = list(grid.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "space":
            dims = [f'    {json.dumps(k)}: {json.dumps(v)}' for k, v in value.items()]
            lines.append(f'  "space": {{\n' + ",\n".join(dims) + f"\n  }}{comma}")
        elif key == "points":
            rows = [f"    {json.dumps(point)}" for point in value]
            lines.append('  "points": [\n' + ",\n".join(rows) + f"\n  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines + ["}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", type=Path, nargs="+", help="trials.jsonl of one or more sweeps of one spec.")
    parser.add_argument("--spec", type=Path, help="The sweep's spec: its space goes into the grid (exact lists).")
    parser.add_argument("--name", help="Grid name (default: the spec's name, else the first file's folder).")
    parser.add_argument("--description", help="A line on how the sweeps were run (kept in the grid).")
    parser.add_argument("--simulate-nccl", action="store_true", help="Cross with simulated NCCL presets.")
    parser.add_argument("-o", "--output", type=Path, help="Write here (default: stdout).")
    args = parser.parse_args(argv)
    spec = SweepSpec.from_yaml(args.spec) if args.spec else None
    name = args.name or (spec.name if spec else args.trials[0].parent.name)
    try:
        grid = grid_from_trials(_records(args.trials), name=name, space=space_of(spec) if spec else None)
        if args.description:
            grid = {"name": grid["name"], "description": args.description, **grid}
        if args.simulate_nccl:
            grid = simulate_nccl(grid)
    except (GridError, KeyError, ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = dumps_grid(grid)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
