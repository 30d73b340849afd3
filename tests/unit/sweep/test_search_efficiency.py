"""benchmarks/search_efficiency.py and grid_from_sweep.py: the grid format, the replay, the count of trials."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import optuna
import pytest

from orchestrator.spec import SweepSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[3]
BENCHMARKS = REPO / "benchmarks"


def _load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # grid_from_sweep imports search_efficiency as its neighbour
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


se = _load("search_efficiency")
gfs = _load("grid_from_sweep")


def _point(value, *, speculative="explicit", status="ok", **params) -> dict:
    return {"params": {"speculative": speculative, **params}, "value": value, "status": status}


CHAIN = {"eagle_topk": 1}


def _grid(**extra) -> dict:
    """Three chains, auto and no speculation; chain 3 is the best (120), 2 and auto are within 2%."""
    return {
        "name": "tiny", "metric": "output_tok_per_s", "mode": "max",
        "points": [
            _point(50.0, speculative="off"),
            _point(118.0, speculative="auto"),
            _point(90.0, num_steps=1, num_draft_tokens=2, **CHAIN),
            _point(119.0, num_steps=2, num_draft_tokens=3, **CHAIN),
            _point(120.0, num_steps=3, num_draft_tokens=4, **CHAIN),
        ],
        **extra,
    }


# --- the grid format ------------------------------------------------------------------------------


def test_space_is_read_off_the_points_with_sglang_rules() -> None:
    grid = se.grid_from_data(_grid())
    assert grid.size == 4  # auto + three chains (top-k 1 takes steps + 1)
    assert grid.best_value() == 120.0
    assert grid.within_target(117.6, 120.0) and not grid.within_target(117.5, 120.0)


def test_space_list_forms_are_exactly_those_points() -> None:
    data = _grid(space={"speculative": ["auto", [1, 1, 2], [3, 1, 4], [5, 4, 8]],
                        "nccl_env": [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}]})
    grid = se.grid_from_data(data)
    assert grid.size == 4 * 2
    assert grid.spec.search.nccl_presets == [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}]
    # (5, 4, 8) and every forced-NCCL point are missing from the grid: failed trials when tried
    assert grid.values.get(se.candidate_key(se.plan_from_params({"num_steps": 5, "eagle_topk": 4,
                                                                 "num_draft_tokens": 8}, "x"))) is None


def test_min_mode_target_is_two_percent_above_the_best() -> None:
    grid = se.grid_from_data({**_grid(), "mode": "min"})
    assert grid.best_value() == 50.0  # no speculation is reachable: it is the first baseline
    assert grid.within_target(51.0, 50.0) and not grid.within_target(51.1, 50.0)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"mode": "best"}, "mode='best'; use max or min"),
        ({"points": [{"params": {"num_steps": "three"}, "value": 1.0}]}, "points[0].params: num_steps, eagle_topk"),
        ({"points": [{"params": {"speculative": "maybe"}, "value": 1.0}]}, "speculative='maybe'"),
        ({"points": [{"params": {"steps": 3}, "value": 1.0}]}, "unknown key 'steps'"),
        ({"points": [_point(True, speculative="auto")]}, "value=True must be a finite number"),
        ({"space": {"speculative": [[3, 1, 5]]}}, "eagle_topk=1 is a chain"),
        ({"space": {"nccl_env": [{"NCCL_ALGO": "Ring"}]}}, "add {}"),
        ({"space": {"topk": [1]}}, "space.topk is not a dimension"),
        ({"colour": "red"}, "unknown key(s) ['colour']"),
    ],
)
def test_a_broken_grid_names_what_is_wrong(data: dict, words: str) -> None:
    with pytest.raises(se.GridError) as excinfo:
        se.grid_from_data({**_grid(), **data})
    assert words in str(excinfo.value)


def test_bench_speculative_jsonl_is_a_grid(tmp_path: Path) -> None:
    rows = [{"batch_size": 1, "steps": 3, "topk": 1, "num_draft_tokens": 4, "speed": 100.0, "accept_length": 2.9},
            {"batch_size": 8, "steps": 3, "topk": 1, "num_draft_tokens": 4, "speed": 120.0, "accept_length": 2.9},
            {"batch_size": 1, "steps": 5, "topk": 4, "num_draft_tokens": 8, "speed": 130.0, "accept_length": 3.4}]
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    grid = se.load_grid(path)  # the largest batch size: only (3, 1, 4) was measured at 8
    assert grid.size == 1 and grid.metric == "speed" and grid.best_value() == 120.0
    assert grid.name == "bench-bs8"
    small = se.load_grid(path, batch_size=1)
    assert small.size == 2 and small.best_value() == 130.0
    with pytest.raises(se.GridError, match=r"batch_size=4 was not measured; measured: \[1, 8\]"):
        se.load_grid(path, batch_size=4)


# --- counting trials --------------------------------------------------------------------------------


def test_trials_to_target_follows_the_reported_best_not_the_true_one() -> None:
    grid = se.grid_from_data(_grid())
    key = {v: k for k, v in grid.values.items()}
    # 3rd trial is the best config, but observed low (noise): the reported best is still the 90 one
    trials = [(key[50.0], 50.0), (key[90.0], 95.0), (key[120.0], 80.0), (key[119.0], 119.5)]
    assert se.trials_to_target(grid, trials) == 4
    assert se.trials_to_target(grid, trials[:3]) is None
    # a failed trial counts as a trial
    assert se.trials_to_target(grid, [(key[50.0], None), (key[118.0], 118.0)]) == 2


def test_noise_is_the_same_observation_of_one_configuration_for_every_searcher() -> None:
    grid = se.grid_from_data(_grid())
    first, second = se.noisy_lookup(grid, seed=3, noise_cv=0.1), se.noisy_lookup(grid, seed=3, noise_cv=0.1)
    key = next(iter(grid.values))
    assert first(key) == second(key) != grid.values[key]
    assert se.noisy_lookup(grid, seed=3, noise_cv=0.0)(key) == grid.values[key]


def test_both_searchers_start_with_the_two_baselines_and_count_them() -> None:
    grid = se.grid_from_data(_grid())
    observe = se.noisy_lookup(grid, seed=0, noise_cv=0.0)
    for name in ("spectune", "random"):
        trials = list(se.SEARCHERS[name](grid, seed=0, observe=observe, limit=grid.size))
        assert [v for _, v in trials[:2]] == [50.0, 118.0], name
        assert len({k for k, _ in trials}) == len(trials)  # never a configuration twice
    # auto (118) is within 2% of the best (120): two trials, whoever searches
    assert se.run_benchmark(grid, seeds=3)["searchers"]["random"]["median_trials_to_target"] == 2


def test_the_output_has_the_documented_shape() -> None:
    data = _grid()
    data["points"][1]["value"] = 100.0  # auto no longer within 2%: something must be searched
    out = se.run_benchmark(se.grid_from_data(data), seeds=4)
    assert {"grid", "grid_size", "seeds", "searchers"} <= set(out)
    assert out["grid"] == "tiny" and out["grid_size"] == 4 and out["seeds"] == 4
    for name in ("spectune", "random"):
        result = out["searchers"][name]
        assert {"median_trials_to_target", "p90_trials_to_target"} <= set(result)
        assert all(n is None or 3 <= n <= 4 for n in result["trials_to_target"])


def test_median_and_p90_count_never_reached_as_worst() -> None:
    assert se._median([3, None, 5]) == 5
    assert se._median([3, None, None]) is None
    assert se._percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == 9
    assert se._percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, None], 0.9) == 9
    assert se._percentile([1, 2, 3, 4, 5, 6, 7, 8, None, None], 0.9) is None


def test_cli_writes_the_json(tmp_path: Path) -> None:
    path, out = tmp_path / "g.json", tmp_path / "out.json"
    path.write_text(json.dumps(_grid()))
    assert se.main(["--grid", str(path), "--seeds", "2", "--json-out", str(out)]) == 0
    assert json.loads(out.read_text())["grid_size"] == 4
    path.write_text(json.dumps({**_grid(), "mode": "up"}))
    assert se.main(["--grid", str(path)]) == 2


def test_the_tables_come_from_the_json_files_with_their_commands(tmp_path: Path, capsys) -> None:
    """--table DIR prints the results table, then one ablation row per searcher, each naming the
    command that wrote its file (what the docs paste)."""
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps(_grid()))
    results = tmp_path / "results"
    results.mkdir()
    assert se.main(["--grid", str(grid), "--seeds", "2", "--json-out", str(results / "search-efficiency-g-n0.json"),
                    "--noise-cv", "0"]) == 0
    assert se.main(["--grid", str(grid), "--seeds", "2", "--no-confirmation", "--searcher", "spectune",
                    "--searcher", "spectune-sampled", "--json-out", str(results / "ablation-enumeration-g.json")]) == 0
    capsys.readouterr()
    assert se.main(["--table", str(results)]) == 0
    main_table, ablations = capsys.readouterr().out.strip().split("\n\n")
    assert len(main_table.splitlines()) == 3 and "--noise-cv 0" in main_table
    rows = ablations.splitlines()[2:]
    assert [row.split(" | ")[4] for row in rows] == ["spectune", "spectune-sampled"]
    assert all("| off |" in row and "--no-confirmation" in row for row in rows)



# --- what the user gets: the search, then the confirmation -------------------------------------------


def _key_of(grid, value: float) -> str:
    return next(k for k, v in grid.values.items() if v == value)


def test_a_confirmation_visit_is_a_fresh_draw_for_every_round() -> None:
    grid = se.grid_from_data({**_grid(), "noise_cv": 0.05})
    key = _key_of(grid, 120.0)
    visit = se.visit_lookup(grid, seed=1, noise_cv=0.05)
    values = [visit(key, r) for r in range(400)]
    searched = se.noisy_lookup(grid, seed=1, noise_cv=0.05)(key)
    assert len(set(values)) == 400 and searched not in values  # never the search's observation again
    logs = [math.log(v / 120.0) for v in values]
    assert 0.04 < statistics.stdev(logs) < 0.06  # the grid's noise, drawn per visit
    lag_1 = statistics.correlation(logs[:-1], logs[1:])
    assert abs(lag_1) < 0.15  # independent from round to round
    assert visit(key, 7) == se.visit_lookup(grid, seed=1, noise_cv=0.05)(key, 7)  # the same for every searcher
    assert visit(key, 7) != se.visit_lookup(grid, seed=2, noise_cv=0.05)(key, 7)


def test_the_replayed_confirmation_visits_with_those_draws() -> None:
    grid = se.grid_from_data({**_grid(), "noise_cv": 0.05})
    trials = list(se.spectune_replay(grid, seed=0, observe=se.noisy_lookup(grid, seed=0, noise_cv=0.05), limit=5))
    pick = se.final_pick(grid, trials, seed=0, noise_cv=0.05)
    visit = se.visit_lookup(grid, seed=0, noise_cv=0.05)
    confirmation = pick.confirmation
    assert confirmation is not None and pick.visits == len(confirmation.visits) >= 3 * 2
    number_to_key = {n: k for n, (k, _) in enumerate(trials, start=1)}
    for v in confirmation.visits:
        assert v["values"] == [visit(number_to_key[v["trial"]], v["round"])]
    assert pick.launches == len(trials) + pick.visits


def _trap(auto: float, best: float, **extra) -> dict:
    """No speculation 50, SGLang's auto ``auto``, three chains of which ``best`` is the best."""
    return {"name": "trap", "metric": "output_tok_per_s", "mode": "max", "points": [
        _point(50.0, speculative="off"), _point(auto, speculative="auto"),
        _point(80.0, num_steps=1, num_draft_tokens=2, **CHAIN), _point(best, num_steps=2, num_draft_tokens=3, **CHAIN),
        _point(85.0, num_steps=3, num_draft_tokens=4, **CHAIN)], **extra}


def test_final_within_target_rate_on_grids_with_a_known_answer() -> None:
    # a clear winner (x1.10 over SGLang's default) at 2% noise: every seed's confirmation names it
    clear = se.run_benchmark(se.grid_from_data(_trap(100.0, 110.0, noise_cv=0.02)), seeds=4)
    for name in ("spectune", "random"):
        result = clear["searchers"][name]
        assert result["final_within_target_rate"] == 1.0 and result["verdicts"] == {"better": 4}, name
    # x1.03 at 10% noise with a 3-visit cap: never decided, best.yaml keeps SGLang's default, 3% short
    data = _trap(100.0, 103.0, noise_cv=0.10)
    grid = se.grid_from_data(data)
    capped = grid.spec.model_copy(update={"confirmation": grid.spec.confirmation.model_copy(
        update={"max_visits": 3})})
    trap = se.run_benchmark(grid, seeds=4, spec=capped)["searchers"]["spectune"]
    assert trap["final_within_target_rate"] == 0.0 and trap["verdicts"] == {"undecided": 4}
    # without the confirmation the sweep ends on its best observed trial (noise 0: the true best)
    plain = grid.spec.model_copy(update={"confirmation": grid.spec.confirmation.model_copy(
        update={"enabled": False})})
    quiet = se.run_benchmark(grid, seeds=2, noise_cv=0.0, spec=plain)["searchers"]["spectune"]
    assert quiet["final_within_target_rate"] == 1.0 and quiet["verdicts"] == {"not_confirmed": 2}
    assert quiet["median_confirmation_visits"] == 0


# --- making a grid from a sweep ---------------------------------------------------------------------


def _record(number: int, params: dict, values: list[float] | None, status: str = "ok") -> dict:
    objective = None if values is None else {
        "metric": "output_tok_per_s", "direction": "max", "values": values,
        "median": sorted(values)[len(values) // 2]}
    base = {"speculative": "explicit", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None,
            "all_reduce": "default"}
    return {"number": number, "params": {**base, **params}, "status": status, "objective": objective,
            "measured_in_full": status == "ok"}


def _sweep(scale: float) -> list[dict]:
    return [
        _record(1, {"speculative": "off"}, [50 * scale] * 3),
        _record(2, {"speculative": "auto"}, [100 * scale] * 3),
        _record(3, {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3, "NCCL_ALGO": "default"},
                [110 * scale] * 3),
        _record(4, {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "env.NCCL_DEBUG": "WARN"}, None,
                status="failed"),
    ]


def test_sweeps_become_one_grid_with_their_spread_as_noise() -> None:
    grid = gfs.grid_from_trials([_sweep(1.0), _sweep(1.2)], name="g", space=None)
    values = {json.dumps(p["params"], sort_keys=True): (p["value"], p["status"]) for p in grid["points"]}
    assert values[json.dumps({"speculative": "off", "all_reduce": "default"}, sort_keys=True)] == (55.0, "ok")
    # "default" NCCL values and the fixed env.* entries are not grid params; the failed trial is a failed point
    assert values[json.dumps({"speculative": "explicit", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3,
                              "all_reduce": "default"}, sort_keys=True)] == (121.0, "ok")
    assert (None, "failed") in values.values()
    # between-sweep CV of (x, 1.2x): stdev / mean = 0.1414 / 1.1 for every configuration
    assert grid["noise_cv"] == pytest.approx(0.1286, abs=1e-4)
    replayed = se.grid_from_data(grid)
    assert replayed.best_value() == 121.0


def test_one_sweep_takes_its_noise_from_the_repetitions() -> None:
    records = [_record(1, {"speculative": "auto"}, [90.0, 100.0, 110.0])]
    grid = gfs.grid_from_trials([records], name="g", space=None)
    assert grid["noise_cv"] == pytest.approx(0.1 / 3 ** 0.5, abs=1e-4)


def test_simulated_nccl_presets_multiply_every_point_of_the_space() -> None:
    spec = SweepSpec.from_yaml(BENCHMARKS / "data" / "reference-cpu-grid.yaml")
    grid = gfs.grid_from_trials([_sweep(1.0)], name="g", space=gfs.space_of(spec))
    simulated = gfs.simulate_nccl(grid)
    assert simulated["name"] == "g+simulated-nccl" and "simulated" in simulated["description"]
    assert simulated["space"]["nccl_env"] == [env for env, _ in gfs.SIMULATED_NCCL]
    replayed = se.grid_from_data(simulated)
    assert replayed.size == len(spec.space()) * len(gfs.SIMULATED_NCCL)
    chain = [p for p in simulated["points"] if p["params"].get("num_steps") == 2]
    assert [p["value"] for p in chain] == [round(110.0 * f, 2) for _, f in gfs.SIMULATED_NCCL]
    with pytest.raises(se.GridError, match="already holds NCCL"):
        gfs.simulate_nccl(simulated)


def test_the_grid_spec_measures_its_whole_space_in_one_sweep() -> None:
    spec = SweepSpec.from_yaml(BENCHMARKS / "data" / "reference-cpu-grid.yaml")
    assert spec.budget.num_trials >= len(spec.space()) + 1  # every point and the no-speculation baseline
    assert not spec.search.early_stopping.enabled  # every point measured in full


def test_the_shipped_grids_load_and_match_their_spec() -> None:
    spec = SweepSpec.from_yaml(BENCHMARKS / "data" / "reference-cpu-grid.yaml")
    for path in sorted((BENCHMARKS / "data").glob("*.json")):
        grid = se.load_grid(path)
        assert grid.best_value() > 0, path.name
        if path.name.startswith("reference-cpu-grid"):  # the CPU grids measure that spec's space
            factor = len(grid.spec.search.nccl_presets or [{}])
            assert grid.size == len(spec.space()) * factor, path.name
        else:  # every configuration of a composed grid's space has its value
            assert all(grid.values.get(key) is not None for key in grid.reachable_keys()), path.name



# --- the chain gate in the replay -------------------------------------------------------------------


def _chain_grid() -> dict:
    """Chains of 1-8 steps whose figures follow the prediction's premises (each draft accepted with
    chance 0.8 after the ones before it; a cycle costs 5 ms + 1 ms a step; the best chain is 3-4
    steps), and top-k 2 trees 7-10% below the chain of their steps."""
    def chain(steps: int) -> tuple[float, list[int], float, float]:
        counts = [round(100_000 * 0.8 ** k * 0.2) for k in range(steps)]
        histogram = counts + [100_000 - sum(counts)]
        accept = 1 + sum(k * n for k, n in enumerate(histogram)) / 100_000
        return accept / (5.0 + steps) * 8000, histogram, 5.0 + steps, accept

    points = [_point(700.0, speculative="off"), _point(chain(3)[0], speculative="auto")]
    for steps in range(1, 9):
        value, histogram, cycle, accept = chain(steps)
        points.append({**_point(round(value, 2), num_steps=steps, eagle_topk=1, num_draft_tokens=steps + 1),
                       "histogram": histogram, "cycle_ms": cycle, "accept_length": round(accept, 4)})
        for draft, factor in ((6, 0.93), (8, 0.9)):
            if steps > 1:
                points.append(_point(round(value * factor, 2), num_steps=steps, eagle_topk=2, num_draft_tokens=draft))
    return {"name": "chains", "metric": "output_tok_per_s", "mode": "max", "noise_cv": 0.01,
            "space": {"num_steps": list(range(1, 9)), "eagle_topk": [1, 2], "num_draft_tokens": [6, 8],
                      "include_auto": True}, "points": points}


def test_a_chain_grid_keeps_each_chains_histogram_cycle_time_and_accept_length() -> None:
    """What the chain model reads from a grid (the gate's simulation test reads the shipped chain grid)."""
    grid = se.grid_from_data(_chain_grid())
    assert len(grid.chains) == 8  # every chain point carries its histogram, cycle time and accept length
    assert all({"histogram", "cycle_ms", "accept_length"} <= set(figures) for figures in grid.chains.values())
