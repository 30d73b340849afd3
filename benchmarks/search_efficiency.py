"""What a sweep ends on, and in how many engine launches: a measured grid replayed through the
sweep's searcher and its confirmation, and through random search with the same confirmation.

A sweep of a 1T-parameter model costs 5-15 minutes per engine launch, and what the user gets is
the configuration the sweep *reports*. This script measures both without an engine: each seed
replays one sweep. The search is the sweep's own searcher (the same ``DefineByRunSpace`` built from a
``SweepSpec``, see ``orchestrator.space.define_by_run``, and the same ``SweepSearcher`` of
``orchestrator.sweep.search.searcher`` with its baselines, enumeration and de-duplication, driven exactly
as Ray Tune drives it — ``suggest(trial_id)``, then ``on_trial_complete(trial_id, final result)``)
for ``budget`` trials, with the engine replaced by a lookup in the grid; then the sweep's own
confirmation (``confirm.run_confirmation``) visits the contenders, each visit a fresh draw of
noise. Random search (uniform without replacement over the space, after the same two baselines)
gets the same budget and the same confirmation.

Per searcher, over seeds:

* ``final_within_target_rate``: share of seeds whose final pick (best.yaml) is within 2% of the
  grid's best by the grid's own values (for ``mode: min``: at most 2% above it);
* ``median_launches``: trials plus confirmation visits;
* ``median_trials_to_target`` / ``p90_trials_to_target``: the first n at which the best *observed*
  trial (noise, baselines and failed trials included) is truly within 2%; ``null`` where a searcher
  does not get there within the configurations of the space.

Noise: each looked-up value is multiplied by ``1 + noise_cv * z`` (z standard normal, floored at
0.01): for the search drawn once per (seed, configuration), so both searchers observe the same
value of a configuration; for a confirmation visit drawn per (seed, configuration, round).
``noise_cv`` comes from the grid (default 0) or ``--noise-cv``.

Grid format (JSON; see docs/search-efficiency.md)::

    {"name": str, "metric": str, "mode": "max"|"min", "noise_cv": float?, "space": {...}?,
     "points": [{"params": {...}, "value": number|null, "status": "ok"|"failed"?}]}

``params`` use the sweep's names (``speculative`` off/auto/explicit, ``num_steps``, ``eagle_topk``,
``num_draft_tokens``, ``all_reduce``, NCCL variable names; an absent or ``default`` variable is
unset). ``space`` keys: ``speculative`` (a list of ``[steps, topk, draft]`` triples, ``"auto"``
for SGLang's choice) or ``num_steps`` / ``eagle_topk`` / ``num_draft_tokens`` / ``include_auto``
(SGLang's rules applied); ``all_reduce``; ``nccl_env`` (a list of whole settings, ``{}`` = NCCL's
defaults) or one key per NCCL variable with its values. Without ``space`` it is read off the
points. SGLang's ``bench_speculative.py`` JSONL (``batch_size``, ``steps``, ``topk``,
``num_draft_tokens``, ``speed``, ...) is read as a grid too, one batch size at a time.

    python benchmarks/search_efficiency.py --grid benchmarks/data/reference-cpu-grid-quiet.json --seeds 20
    python benchmarks/search_efficiency.py --table benchmarks/data/results   # the tables of docs/search-efficiency.md
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

from orchestrator.spec_benchmark import OBJECTIVE_METRICS  # noqa: E402
from orchestrator.space import ALL_REDUCE_ARMS, BASELINE_PLAIN, Candidate, SpeculativeTriple, TrialPlan, canonical_arm, candidate_key  # noqa: E402
from orchestrator.space.define_by_run import DefineByRunSpace  # noqa: E402
from orchestrator.spec import SweepSpec  # noqa: E402
from orchestrator.sweep.confirmation.confirm import Confirmation, run_confirmation  # noqa: E402
from orchestrator.sweep.records.results import Objective, TrialRecord, best_record  # noqa: E402
from orchestrator.sweep.records.results import OBJECTIVE_KEY  # noqa: E402
from orchestrator.sweep.search.searcher import SweepSearcher  # noqa: E402
from serving.engine import nccl  # noqa: E402

__all__ = [
    "Grid",
    "GridError",
    "load_grid",
    "plan_from_params",
    "random_replay",
    "run_benchmark",
    "spectune_replay",
    "trials_to_target",
]

TARGET_FRACTION = 0.02
"""How close to the grid's best the reported configuration must be (2%)."""

NOISE_FLOOR = 0.01
"""The smallest noise factor: a noisy throughput is never zero or negative."""

DEFAULT_WORDS = ("default", "unset", "")
SPECULATIVE_WORDS = ("off", "auto", "explicit")
TRIPLE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")
KNOWN_PARAMS = ("speculative", *TRIPLE_KEYS, "all_reduce")


class GridError(ValueError):
    """A grid file that cannot be replayed; the message names the point or key and what is allowed."""


# --- the grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A measured grid, ready to replay.

    Attributes:
        name: The grid's name (the output's ``grid``).
        metric: What the values are (e.g. ``output_tok_per_s``).
        mode: ``max`` or ``min``.
        noise_cv: The multiplicative noise to replay with by default.
        spec: A sweep spec whose space is the grid's space (what the searcher searches).
        values: candidate key -> measured value, ``None`` for a failed point.
    """

    name: str
    metric: str
    mode: str
    noise_cv: float
    spec: SweepSpec
    values: dict[str, float | None] = field(default_factory=dict)
    chains: dict[str, dict[str, Any]] = field(default_factory=dict)
    """candidate key -> the point's accepted-draft ``histogram``, ``cycle_ms`` and ``accept_length`` at
    the objective's level, where the grid carries them (what the chain model predicts from: tests/unit/sweep/
    test_worth_a_start_simulation.py reads them)."""

    @property
    def space(self) -> DefineByRunSpace:
        return DefineByRunSpace(self.spec)

    @property
    def size(self) -> int:
        """Configurations in the space (what ``spectune validate`` would count)."""
        return len(self.spec.space())

    def reachable_keys(self) -> list[str]:
        """Every configuration a searcher can try: the baselines and the points of the space."""
        space = self.space
        keys = [candidate_key(plan) for plan in space.baselines()]
        keys += [candidate_key(plan) for plan in space.candidates()]
        return list(dict.fromkeys(keys))

    def plans(self) -> dict[str, TrialPlan]:
        """Every reachable configuration's plan by key (the baselines with their kinds)."""
        space = self.space
        out: dict[str, TrialPlan] = {}
        for plan in [*space.baselines(), *space.candidates()]:
            out.setdefault(candidate_key(plan), plan)
        return out

    def best_value(self) -> float:
        """The grid's best by its own values, among the configurations a searcher can reach."""
        known = [v for k in self.reachable_keys() if (v := self.values.get(k)) is not None]
        if not known:
            raise GridError(f"grid {self.name!r}: no configuration of its space has a value")
        return max(known) if self.mode == "max" else min(known)

    def within_target(self, value: float, best: float) -> bool:
        """Whether ``value`` is within ``TARGET_FRACTION`` of ``best`` (the right side for the mode)."""
        if self.mode == "max":
            return value >= best - TARGET_FRACTION * abs(best)
        return value <= best + TARGET_FRACTION * abs(best)


def load_grid(path: Path, *, batch_size: int | None = None) -> Grid:
    """Read a grid JSON file, or SGLang's ``bench_speculative.py`` JSONL, into a :class:`Grid`.

    Args:
        path: The file.
        batch_size: For ``bench_speculative.py`` JSONL: which batch size's speeds (default: the largest).

    Raises:
        GridError: the file is neither, or a point or the space breaks the format (named).
    """
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _grid_from_bench_speculative(text, name=path.stem, batch_size=batch_size)
    if isinstance(data, dict) and "points" not in data and "speed" in data:  # a one-line JSONL
        data = _grid_from_bench_speculative(text, name=path.stem, batch_size=batch_size)
    if not isinstance(data, dict):
        raise GridError(f"{path}: expected a JSON object with 'points', or bench_speculative.py JSONL")
    return grid_from_data(data, source=str(path))


def grid_from_data(data: dict[str, Any], *, source: str = "<grid>") -> Grid:
    """A :class:`Grid` from the parsed JSON object (see the module docstring for the format)."""
    unknown = sorted(set(data) - {"name", "metric", "mode", "noise_cv", "space", "points", "description"})
    if unknown:
        raise GridError(f"{source}: unknown key(s) {unknown}; allowed: name, metric, mode, noise_cv, space, points")
    mode = data.get("mode", "max")
    if mode not in ("max", "min"):
        raise GridError(f"{source}: mode={mode!r}; use max or min")
    noise_cv = data.get("noise_cv", 0.0) or 0.0
    if not isinstance(noise_cv, (int, float)) or noise_cv < 0:
        raise GridError(f"{source}: noise_cv={noise_cv!r} must be a number >= 0")
    points = data.get("points")
    if not isinstance(points, list) or not points:
        raise GridError(f"{source}: 'points' must be a non-empty list")
    parsed = [_point(p, i) for i, p in enumerate(points)]
    name = str(data.get("name") or Path(source).stem)
    search = _search_section(data["space"], source) if data.get("space") else _search_from_points(parsed)
    spec = _replay_spec(name, search, source, mode)
    values: dict[str, float | None] = {}
    chains: dict[str, dict[str, Any]] = {}
    for (plan, value), point in zip(parsed, points):
        values[candidate_key(plan)] = value
        figures = {k: point[k] for k in ("histogram", "cycle_ms", "accept_length") if point.get(k)}
        if len(figures) == 3:
            chains[candidate_key(plan)] = figures
    return Grid(name=name, metric=str(data.get("metric", "value")), mode=mode, noise_cv=float(noise_cv),
                spec=spec, values=values, chains=chains)


def _point(point: Any, index: int) -> tuple[TrialPlan, float | None]:
    """One grid point as the plan the sweep would have run, and its value (``None``: failed)."""
    where = f"points[{index}]"
    if not isinstance(point, dict) or not isinstance(point.get("params"), dict):
        raise GridError(f"{where}: expected {{'params': {{...}}, 'value': number|null}}")
    status = point.get("status", "ok")
    if status not in ("ok", "failed"):
        raise GridError(f"{where}: status={status!r}; use ok or failed")
    value = point.get("value")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is not None and not (number and math.isfinite(value)):
        raise GridError(f"{where}: value={value!r} must be a finite number or null")
    return plan_from_params(point["params"], where), (None if status == "failed" or value is None else float(value))


def plan_from_params(params: dict[str, Any], where: str) -> TrialPlan:
    """The sweep's ``TrialPlan`` for grid params in the sweep's names (see the module docstring)."""
    numbers = {k: params.get(k) for k in TRIPLE_KEYS}
    mode = params.get("speculative") or ("explicit" if numbers["num_steps"] is not None else "auto")
    if mode not in SPECULATIVE_WORDS:
        raise GridError(f"{where}.params.speculative={mode!r}; use one of {', '.join(SPECULATIVE_WORDS)}")
    triple = SpeculativeTriple(None, None, None)
    if mode == "explicit":
        bad = [k for k, v in numbers.items() if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise GridError(f"{where}.params: {', '.join(bad)} must be integers for an explicit configuration")
        triple = SpeculativeTriple(numbers["num_steps"], numbers["eagle_topk"], numbers["num_draft_tokens"])
    all_reduce = canonical_arm(params.get("all_reduce") or "default")  # grids written before 'default' say 'custom'
    if all_reduce not in ALL_REDUCE_ARMS:
        raise GridError(f"{where}.params.all_reduce={all_reduce!r}; use one of {', '.join(ALL_REDUCE_ARMS)}")
    env: dict[str, str] = {}
    for name, value in params.items():
        if name in KNOWN_PARAMS:
            continue
        if not name.startswith("NCCL_"):
            raise GridError(f"{where}.params: unknown key {name!r}; allowed: {', '.join(KNOWN_PARAMS)}, NCCL_*")
        if value is not None and str(value).strip().lower() not in DEFAULT_WORDS:
            env[name] = nccl.normalise_value(name, str(value))
    kind = BASELINE_PLAIN if mode == "off" else "search"
    return TrialPlan(kind, Candidate(triple, all_reduce, env))


def _search_section(space: Any, source: str) -> dict[str, Any]:
    """The grid's ``space`` as a sweep spec's ``search`` section (list forms: triples, nccl_presets)."""
    if not isinstance(space, dict):
        raise GridError(f"{source}: 'space' must be an object of dimension -> values")
    search: dict[str, Any] = {}
    speculative: dict[str, Any] = {}
    for key, values in space.items():
        if key == "speculative":
            listed = values if isinstance(values, list) else []
            speculative["triples"] = [t for t in listed if t != "auto"]
            speculative["include_auto"] = "auto" in listed
        elif key in (*TRIPLE_KEYS, "include_auto"):
            speculative[key] = values
        elif key == "all_reduce":
            search["all_reduce"] = values
        elif key == "nccl_env":
            search["nccl_presets"] = values
        elif key.startswith("NCCL_"):
            search.setdefault("nccl_env", {})[key] = values
        else:
            raise GridError(f"{source}: space.{key} is not a dimension; allowed: speculative, "
                            f"{', '.join(TRIPLE_KEYS)}, include_auto, all_reduce, nccl_env, NCCL_*")
    if speculative:
        search["speculative"] = speculative
    return search


def _search_from_points(points: Iterable[tuple[TrialPlan, float | None]]) -> dict[str, Any]:
    """A ``search`` section read off the points: every value seen per dimension, SGLang's rules
    then decide which combinations are points (as for a spec written by hand)."""
    plans = [plan for plan, _ in points]
    explicit = [p.candidate.speculative for p in plans if p.speculative and not p.candidate.speculative.is_auto]
    search: dict[str, Any] = {"all_reduce": sorted({p.candidate.all_reduce for p in plans})}
    if explicit:
        drafts = sorted({t.num_draft_tokens for t in explicit if t.eagle_topk != 1})
        search["speculative"] = {
            "num_steps": sorted({t.num_steps for t in explicit}),
            "eagle_topk": sorted({t.eagle_topk for t in explicit}),
            **({"num_draft_tokens": drafts} if drafts else {}),
            "include_auto": any(p.speculative and p.candidate.speculative.is_auto for p in plans),
        }
    names = sorted({name for p in plans for name in p.candidate.nccl_env})
    if names:
        search["nccl_env"] = {
            name: [None, *sorted({p.candidate.nccl_env[name] for p in plans if name in p.candidate.nccl_env})]
            for name in names
        }
    return search


def _replay_spec(name: str, search: dict[str, Any], source: str, mode: str = "max") -> SweepSpec:
    """A sweep spec (SGLang engine, 2 ranks so NCCL dimensions are allowed) whose space is the grid's.

    Nothing is launched from it; dangerous NCCL values a published grid holds are allowed, since
    replaying them is harmless.
    """
    from orchestrator.errors import SpecError

    allowed = sorted({f"{n}={v}" for n, v in _nccl_values(search) if nccl.danger_of(n, v)})
    metric = next(m for m, direction in OBJECTIVE_METRICS.items() if direction == mode)
    data = {
        "name": "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:100] or "grid",
        "engine": {"kind": "sglang", "model_path": "grid", "draft_model_path": "grid-draft",
                   "speculative_algorithm": "EAGLE3", "tp_size": 2},
        "search": {**search, "allow_dangerous": allowed},
        "objective": {"metric": metric},
        "budget": {"num_trials": 10_000},
    }
    try:
        return SweepSpec.from_dict(data, source=source)
    except SpecError as exc:
        raise GridError(f"{source}: the grid's space is not a valid sweep space: {exc}") from None


def _nccl_values(search: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name, values in (search.get("nccl_env") or {}).items():
        for value in values or ():
            if value is not None:
                yield name, nccl.normalise_value(name, str(value))
    for preset in search.get("nccl_presets") or ():
        for name, value in (preset or {}).items():
            if value is not None:
                yield name, nccl.normalise_value(name, str(value))


def _grid_from_bench_speculative(text: str, *, name: str, batch_size: int | None = None) -> dict[str, Any]:
    """SGLang's ``scripts/playground/bench_speculative.py`` JSONL as a grid (metric ``speed``, max).

    Each line holds ``batch_size``, ``steps``, ``topk``, ``num_draft_tokens`` and ``speed`` (output
    tokens/s). One batch size is one workload: the grid takes ``batch_size`` (default: the largest
    measured). The space is exactly the measured triples; SGLang's script measures no baseline, so
    both baselines count as failed trials.
    """
    rows: list[tuple[int, tuple[int, int, int], float]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            triple = (int(row["steps"]), int(row["topk"]), int(row["num_draft_tokens"]))
            rows.append((int(row.get("batch_size", 1)), triple, float(row["speed"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise GridError(f"line {number}: not a bench_speculative.py record with steps, topk, "
                            f"num_draft_tokens, speed ({exc})") from None
    if not rows:
        raise GridError("no bench_speculative.py records found")
    sizes = sorted({size for size, _, _ in rows})
    chosen = sizes[-1] if batch_size is None else batch_size
    if chosen not in sizes:
        raise GridError(f"batch_size={chosen} was not measured; measured: {sizes}")
    speeds: dict[tuple[int, int, int], list[float]] = {}
    for size, triple, speed in rows:
        if size == chosen:
            speeds.setdefault(triple, []).append(speed)
    points = [{"params": dict(zip(TRIPLE_KEYS, t)), "value": statistics.median(v)} for t, v in speeds.items()]
    return {"name": f"{name}-bs{chosen}", "metric": "speed", "mode": "max",
            "space": {"speculative": [list(t) for t in speeds]}, "points": points}


# --- replaying --------------------------------------------------------------------------------


class Observer(Protocol):
    """How a replay turns a configuration into the value a searcher observes."""

    def __call__(self, key: str) -> float | None: ...


def _noisy(grid: Grid, key: str, *, noise_cv: float, draw: str) -> float | None:
    """The grid's value of ``key`` times ``1 + noise_cv * z``, z standard normal seeded by ``draw``."""
    value = grid.values.get(key)
    if value is None or noise_cv == 0:
        return value
    z = random.Random(draw).gauss(0.0, 1.0)
    return value * max(NOISE_FLOOR, 1.0 + noise_cv * z)


def noisy_lookup(grid: Grid, *, seed: int, noise_cv: float) -> Observer:
    """The search's observation of a configuration: z drawn once per (seed, key)."""
    return lambda key: _noisy(grid, key, noise_cv=noise_cv, draw=f"{seed}:{key}")


def visit_lookup(grid: Grid, *, seed: int, noise_cv: float) -> Callable[[str, int], float | None]:
    """A confirmation visit's value: a fresh engine, so a fresh draw of noise for every
    (seed, configuration, round), independent of the search's observation of it. Every searcher's
    confirmation sees the same draw for the same configuration and round."""
    return lambda key, round_number: _noisy(grid, key, noise_cv=noise_cv, draw=f"{seed}:{key}:visit:{round_number}")


def spectune_replay(grid: Grid, *, seed: int, observe: Observer, limit: int, budget: int | None = None,
                    staged: bool = True) -> Iterator[tuple[str, float | None]]:
    """The sweep's searcher, driven as Ray Tune drives it: yields (configuration key, observed value).

    ``budget`` is the sweep's ``budget.num_trials`` as the driver passes it (it decides whether the
    searcher enumerates a small space); ``staged=False`` is the ablation without the NCCL stages.
    """
    searcher = SweepSearcher(space=grid.space, mode=grid.mode, seed=seed, slo=False, budget=budget, staged=staged)
    for number in range(limit):
        trial_id = f"replay_{number:05d}"
        config = searcher.suggest(trial_id)
        if not isinstance(config, dict):  # Searcher.FINISHED: every point measured
            return
        key = candidate_key(TrialPlan.from_config(config))
        value = observe(key)
        result = {"final": True, "status": "ok", OBJECTIVE_KEY: value} if value is not None else {
            "final": True, "status": "failed", "reason": "not_in_grid"}
        searcher.on_trial_complete(trial_id, result)
        yield key, value


def random_replay(grid: Grid, *, seed: int, observe: Observer, limit: int,
                  budget: int | None = None) -> Iterator[tuple[str, float | None]]:
    """Random search: the same two baselines, then the space's points uniformly without replacement."""
    del budget  # random search does not plan
    space = grid.space
    keys = [candidate_key(plan) for plan in space.baselines()]
    rest = [k for k in (candidate_key(plan) for plan in space.candidates()) if k not in keys]
    random.Random(seed).shuffle(rest)
    for key in (keys + rest)[:limit]:
        yield key, observe(key)


def _unstaged(grid: Grid, **kwargs: Any) -> Iterator[tuple[str, float | None]]:
    return spectune_replay(grid, staged=False, **kwargs)


def _sampled(grid: Grid, **kwargs: Any) -> Iterator[tuple[str, float | None]]:
    return spectune_replay(grid, **{**kwargs, "budget": None})


Replay = Callable[..., Iterator[tuple[str, float | None]]]
SEARCHERS: dict[str, Replay] = {"spectune": spectune_replay, "random": random_replay}
ABLATIONS: dict[str, Replay] = {"spectune-unstaged": _unstaged, "spectune-sampled": _sampled}
"""The sweep's searcher without one of its parts: the NCCL stages (TPE over everything from the
start), the enumeration of small spaces (TPE even where the budget covers the space). (The chain gate's
``spectune-predicted`` is gone with the gate: docs/search-efficiency.md, "The chain gate, before and after".)"""


def trials_to_target(grid: Grid, trials: Iterable[tuple[str, float | None]]) -> int | None:
    """The first n at which the best observed configuration is within the target by the grid's
    values (every trial counted), or ``None`` if the trials end first."""
    best_true = grid.best_value()
    reported: tuple[float, str] | None = None
    better = (lambda a, b: a > b) if grid.mode == "max" else (lambda a, b: a < b)
    for n, (key, observed) in enumerate(trials, start=1):
        if observed is not None and (reported is None or better(observed, reported[0])):
            reported = (observed, key)
        if reported is not None:
            true = grid.values.get(reported[1])
            if true is not None and grid.within_target(true, best_true):
                return n
    return None


def _percentile(values: list[int | None], q: float) -> float | None:
    """Nearest-rank percentile with ``None`` (never reached) as +infinity; ``None`` if it lands there."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def _median(values: list[int | None]) -> float | None:
    """The median with ``None`` as +infinity (``None`` if the middle is unreached)."""
    finite = [math.inf if v is None else float(v) for v in values]
    middle = statistics.median(finite)
    return None if math.isinf(middle) else middle


def default_budget(grid: Grid) -> int:
    """The replay's ``budget.num_trials``: 30% of the configurations a sweep can reach (baselines
    included), at least 10 and at most 40 — what a user of a large model affords — never more
    than there are configurations."""
    reachable = len(grid.reachable_keys())
    return min(reachable, max(10, min(40, math.ceil(0.3 * reachable))))


@dataclass(frozen=True)
class FinalPick:
    """How one replayed sweep ended: the configuration best.yaml would hold, and what it cost."""

    key: str | None
    within_target: bool
    trials: int
    visits: int
    verdict: str
    confirmation: Confirmation | None = None

    @property
    def launches(self) -> int:
        return self.trials + self.visits


def replay_records(grid: Grid, trials: list[tuple[str, float | None]]) -> tuple[list[TrialRecord], dict[int, str]]:
    """The search's trials as the sweep records them (one repetition each: its observed value), and
    trial number -> configuration key."""
    plans = grid.plans()
    metric = grid.spec.objective.metric
    records: list[TrialRecord] = []
    keys: dict[int, str] = {}
    for number, (key, value) in enumerate(trials, start=1):
        plan = plans[key]
        ok = value is not None and value > 0
        objective = Objective(metric=metric, concurrency=1, direction=grid.mode, values=[value], median=value) if ok \
            else None
        records.append(TrialRecord(
            trial_id=f"replay_{number:05d}", number=number, kind=plan.kind, label=plan.label(),
            params={**plan.params(), **plan.candidate.nccl_env}, status="ok" if ok else "failed",
            reason=None if ok else "bench_failed", objective=objective, repetitions_done=1 if ok else 0,
            repetitions_planned=1, measured_in_full=ok,
        ))
        keys[number] = key
    return records, keys


def final_pick(grid: Grid, trials: list[tuple[str, float | None]], *, seed: int, noise_cv: float,
               spec: SweepSpec | None = None) -> FinalPick:
    """The search's trials, then the sweep's own confirmation (``confirm.run_confirmation``, the
    spec's ``confirmation`` settings), each visit a fresh draw of noise for its configuration and
    round: the configuration best.yaml would hold, and whether it is truly within the target."""
    spec = spec or grid.spec
    records, keys = replay_records(grid, trials)
    observe_visit = visit_lookup(grid, seed=seed, noise_cv=noise_cv)
    visits = 0

    def visit(record: TrialRecord, round_number: int, *, repetitions: int = 1) -> dict[str, Any]:
        nonlocal visits
        visits += 1
        value = observe_visit(keys[record.number], round_number)
        if value is None:
            return {"status": "failed", "reason": "bench_failed", "values": [], "message": "not in the grid"}
        return {"status": "ok", "values": [value]}

    confirmation: Confirmation | None = None
    if spec.confirmation.enabled:
        confirmation = run_confirmation(spec, records, visit=visit, say=lambda _line: None, advise=False)
    if confirmation is not None and confirmation.chosen is not None:
        chosen: int | None = confirmation.chosen
        verdict = (confirmation.vs_sglang_default or {}).get("kind") or "no_search_trial"
    else:  # what the sweep's report then names: its best complete trial
        best = best_record(records)
        chosen = best.number if best is not None else None
        verdict = "not_confirmed"
    key = keys.get(chosen) if chosen is not None else None
    true = grid.values.get(key) if key is not None else None
    within = true is not None and grid.within_target(true, grid.best_value())
    return FinalPick(key=key, within_target=within, trials=len(trials), visits=visits, verdict=verdict,
                     confirmation=confirmation)


def _trials_until_known(grid: Grid, replay: Iterator[tuple[str, float | None]], *, budget: int
                        ) -> list[tuple[str, float | None]]:
    """The replay's trials until both figures are known: the sweep's ``budget`` trials ran and the
    target was reached (the searcher is not asked further: TPE over a large space is slow)."""
    trials: list[tuple[str, float | None]] = []
    for trial in replay:
        trials.append(trial)
        if len(trials) >= budget and trials_to_target(grid, trials) is not None:
            break
    return trials


def run_benchmark(grid: Grid, *, seeds: int, noise_cv: float | None = None,
                  searchers: Iterable[str] = tuple(SEARCHERS), budget: int | None = None,
                  spec: SweepSpec | None = None) -> dict[str, Any]:
    """Every searcher over ``seeds`` seeds; the JSON the script prints.

    Per seed, the searcher runs until the space is measured (for trials-to-target); the first
    ``budget`` trials are then the sweep, followed by the confirmation (for the final pick).
    """
    cv = grid.noise_cv if noise_cv is None else noise_cv
    budget = budget or default_budget(grid)
    spec = spec or grid.spec
    replays = {**SEARCHERS, **ABLATIONS}
    settings = spec.confirmation
    out: dict[str, Any] = {
        "grid": grid.name, "grid_size": grid.size, "seeds": seeds, "noise_cv": cv, "budget": budget,
        "target": f"within {TARGET_FRACTION:.0%} of the grid's best ({grid.best_value():g} {grid.metric}, {grid.mode})",
        "confirmation": settings.model_dump() if settings.enabled else None, "searchers": {}}
    for name in searchers:
        needed: list[int | None] = []
        picks: list[FinalPick] = []
        for seed in range(seeds):
            observe = noisy_lookup(grid, seed=seed, noise_cv=cv)
            trials = _trials_until_known(grid, replays[name](
                grid, seed=seed, observe=observe, budget=budget, limit=max(len(grid.reachable_keys()), budget)),
                budget=budget)
            needed.append(trials_to_target(grid, trials))
            picks.append(final_pick(grid, trials[:budget], seed=seed, noise_cv=cv, spec=spec))
        verdicts = Counter(pick.verdict for pick in picks)
        out["searchers"][name] = {
            "median_trials_to_target": _median(needed),
            "p90_trials_to_target": _percentile(needed, 0.9),
            "reached": sum(n is not None for n in needed),
            "final_within_target_rate": round(sum(p.within_target for p in picks) / len(picks), 3),
            "best_observed_within_target_rate": round(
                sum(n is not None and n <= budget for n in needed) / len(needed), 3),
            "median_launches": statistics.median(p.launches for p in picks),
            "median_confirmation_visits": statistics.median(p.visits for p in picks),
            "verdicts": dict(sorted(verdicts.items())),
            "trials_to_target": needed,
        }
    return out


def _cell(result: dict[str, Any]) -> str:
    """``median / p90`` trials to target, ``null`` where not reached."""
    return f"{_fmt(result['median_trials_to_target'])} / {_fmt(result['p90_trials_to_target'])}"


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def table(paths: Iterable[Path]) -> str:
    """The "Results" table of docs/search-efficiency.md from result JSON files (each with its ``command``)."""
    rows = ["| grid | size | budget | noise_cv | trials to 2% (median / p90): spectune | random | goal 15% | "
            "final within 2%: spectune | random | launches (median): spectune | random | command |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    results = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    # by grid, then noise (the grid's own noise, a row of its own, after the fixed levels)
    results.sort(key=lambda d: (d["grid"], "--noise-cv" not in d.get("command", ""), d["noise_cv"]))
    for data in results:
        if "budget" not in data:
            continue  # a result of the replay before it had the confirmation
        ours, rand = data["searchers"].get("spectune"), data["searchers"].get("random")
        if not ours or not rand:
            continue
        goal = min(40.0, 0.15 * data["grid_size"])
        median = ours["median_trials_to_target"]
        met = median is not None and median <= goal and (rand["median_trials_to_target"] is None
                                                         or median <= rand["median_trials_to_target"])
        rows.append(
            f"| `{data['grid']}` | {data['grid_size']} | {data['budget']} | {data['noise_cv']:g} | {_cell(ours)} | "
            f"{_cell(rand)} | {'met' if met else 'not met'} ({goal:.3g}) | {ours['final_within_target_rate']:g} | "
            f"{rand['final_within_target_rate']:g} | {_fmt(ours['median_launches'])} | "
            f"{_fmt(rand['median_launches'])} | `{data.get('command', '')}` |")
    return "\n".join(rows)


def ablation_table(paths: Iterable[Path]) -> str:
    """What each part of the search buys: one row per searcher of each ablation file
    (``ablation-*.json``: the same replays with one part left out), with the command that made it."""
    rows = ["| replay | noise_cv | budget | confirmation | searcher | trials to 2% (median / p90) | "
            "best observed within 2% | final within 2% | launches (median) | command |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(paths):
        data = json.loads(path.read_text(encoding="utf-8"))
        settings = data.get("confirmation")
        confirmation = (f"top {settings['top_k']}, {settings['min_visits']}-{settings['max_visits']} visits"
                        if settings else "off")
        for name, result in data["searchers"].items():
            rows.append(
                f"| `{path.stem.removeprefix('ablation-')}` | {data['noise_cv']:g} | {data['budget']} | {confirmation} | "
                f"{name} | {_cell(result)} | {result['best_observed_within_target_rate']:g} | "
                f"{result['final_within_target_rate']:g} | {_fmt(result['median_launches'])} | "
                f"`{data.get('command', '')}` |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--grid", type=Path, help="Grid JSON, or bench_speculative.py JSONL.")
    source.add_argument("--table", type=Path, metavar="DIR",
                        help="Print the tables of docs/search-efficiency.md from the result JSON files in DIR "
                             "(search-efficiency-*.json, then ablation-*.json).")
    parser.add_argument("--seeds", type=int, default=20, help="Seeds per searcher (default 20).")
    parser.add_argument("--noise-cv", type=float, default=None, help="Override the grid's noise_cv.")
    parser.add_argument("--searcher", action="append", choices=[*SEARCHERS, *ABLATIONS],
                        help="Only these searchers (repeatable; the ablations leave out one part of spectune's).")
    parser.add_argument("--budget", type=int, default=None,
                        help="The replayed sweep's budget.num_trials (default: 30%% of the configurations, 10-40).")
    parser.add_argument("--top-k", type=int, default=None, help="confirmation.top_k (default: the spec default).")
    parser.add_argument("--max-visits", type=int, default=None, help="confirmation.max_visits (default: the spec's).")
    parser.add_argument("--min-visits", type=int, default=None, help="confirmation.min_visits (default: the spec's).")
    parser.add_argument("--margin", type=float, default=None, help="confirmation.margin (default: the spec's).")
    parser.add_argument("--no-speculation", choices=("true", "false"), default=None,
                        help="confirmation.no_speculation: whether no speculation is a contender (default: the "
                             "spec's). The Kimi specs' night design: --top-k 1 --max-visits 6 --no-speculation "
                             "false --margin 0.03.")
    parser.add_argument("--no-confirmation", action="store_true",
                        help="End each replayed sweep on its best observed trial (confirmation.enabled: false).")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="bench_speculative.py JSONL: the batch size to replay (default: the largest).")
    parser.add_argument("--json-out", type=Path, default=None, help="Also write the JSON here.")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(args.table.glob("search-efficiency-*.json")))
        ablations = list(args.table.glob("ablation-*.json"))
        if ablations:
            print()
            print(ablation_table(ablations))
        return 0
    logging.getLogger("optuna").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
    try:
        grid = load_grid(args.grid, batch_size=args.batch_size)
    except (GridError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("top_k", args.top_k), ("max_visits", args.max_visits),
                                   ("min_visits", args.min_visits), ("margin", args.margin)) if v is not None}
    if args.no_speculation is not None:
        overrides["no_speculation"] = args.no_speculation == "true"
    if args.no_confirmation:
        overrides["enabled"] = False
    try:
        confirmation = type(grid.spec.confirmation).model_validate(
            {**grid.spec.confirmation.model_dump(), **overrides})
    except ValueError as exc:
        print(f"error: confirmation settings: {exc}", file=sys.stderr)
        return 2
    spec = grid.spec.model_copy(update={"confirmation": confirmation})
    result = run_benchmark(grid, seeds=args.seeds, noise_cv=args.noise_cv, searchers=args.searcher or tuple(SEARCHERS),
                           budget=args.budget, spec=spec)
    shown = list(sys.argv[1:] if argv is None else argv)
    if "--json-out" in shown:  # where the file went is not how it was made
        index = shown.index("--json-out")
        del shown[index:index + 2]
    result["command"] = " ".join(["python benchmarks/search_efficiency.py", *shown])
    text = json.dumps(result, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
