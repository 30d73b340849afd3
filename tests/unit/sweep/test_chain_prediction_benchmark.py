"""benchmarks/chain_prediction.py: the within-round analysis, the steal filter that keeps rounds whole,
and a saved report analysed again."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BENCHMARKS = REPO / "benchmarks"
HISTOGRAM = [10, 20, 15, 12, 9, 8, 30]  # a 6-step chain's accepted-draft histogram


def _load():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("chain_prediction_bench", BENCHMARKS / "chain_prediction.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def _cells(*, drift: list[float], own: dict[int, list[float]], steal: dict[int, list[float]] | None = None) -> dict:
    """Chains 1-6: throughput = base(s) x the round's speed x the chain's own factor; cycle the inverse."""
    cells = {}
    for s in range(1, 7):
        base_tok, base_cycle = 1000.0 + 60.0 * s, 2.0 + 0.3 * s
        factors = [d * o for d, o in zip(drift, own.get(s, [1.0] * len(drift)))]
        cells[s] = {"tok": [base_tok * f for f in factors], "cycle": [base_cycle / f for f in factors],
                    "accept": [1.0 + s * 0.7] * len(drift),
                    "histograms": [HISTOGRAM[: s + 1] if s < 6 else HISTOGRAM] * len(drift),
                    "steal": (steal or {}).get(s, [0.0] * len(drift))}
    return cells


def test_a_speed_every_chain_shares_leaves_no_within_round_spread() -> None:
    """The machine slowing down for a whole round is in the raw spread (a sweep's starts are minutes apart)
    but cancels from a comparison made within the rounds: there the spread is each chain's own."""
    drift = [1.0, 0.7, 1.2, 0.9, 1.1, 0.8]
    cells = _cells(drift=drift, own={})
    within = bench.within_round_chains(cells)
    raw = {s: bench.chain_of(s, cells[s]) for s in cells}
    for s in cells:
        assert within[s].tok_per_s == raw[s].tok_per_s and within[s].cycle_ms == raw[s].cycle_ms
        assert raw[s].tok_rel_se > 0.05
        assert within[s].tok_rel_se < 1e-9 and within[s].cycle_rel_se < 1e-9


def test_a_chain_of_its_own_keeps_its_spread_within_rounds_and_lends_none_to_the_others() -> None:
    """Only chain 3 has noise of its own: it keeps all of it, and the others, whose residuals carry what
    chain 3 moved the round means by, get none (the plain k/(k-1) scaling would give them a fifth of it
    and chain 3 too little)."""
    drift = [1.0, 0.7, 1.2, 0.9, 1.1, 0.8]
    own = {3: [1.0, 1.05, 0.95, 1.04, 0.96, 1.0]}
    within = bench.within_round_chains(_cells(drift=drift, own=own))
    logs = [math.log(v) for v in own[3]]
    assert within[3].tok_rel_se == pytest.approx(statistics.stdev(logs) / math.sqrt(len(logs)), rel=1e-9)
    assert max(within[s].tok_rel_se for s in (1, 2, 4, 5, 6)) < 1e-6
    assert within[3].tok_cycle_corr is not None and within[3].tok_cycle_corr < -0.99


def test_a_round_under_steal_is_set_aside_for_every_chain() -> None:
    drift = [1.0, 0.7, 1.2, 0.9, 1.1, 0.8]
    steal = {4: [0.0, 0.0, 0.3, 0.0, 0.0, 0.0]}
    assert bench._aligned(_cells(drift=drift, own={}, steal=steal)) == [0, 1, 3, 4, 5]  # noqa: SLF001


def test_compare_reports_both_intervals_from_one_formula() -> None:
    drift = [1.0, 0.7, 1.2, 0.9, 1.1, 0.8, 1.05, 0.75]
    own = {s: [1.0 + 0.01 * ((i * s) % 3 - 1) for i in range(len(drift))] for s in range(1, 7)}
    data = {s: {1: cell} for s, cell in _cells(drift=drift, own=own).items()}
    level = bench.compare(data, levels=[1], from_steps=[1, 6])["1"]
    within, between = level["within_rounds"], level["between_starts"]
    assert [r["steps"] for r in within["predicted"]] == [2, 3, 4, 5]
    assert [r["predicted_tok_per_s"] for r in within["predicted"]] == [r["predicted_tok_per_s"] for r in between["predicted"]]
    assert within["median_half_width_rel"] < between["median_half_width_rel"]


def test_a_saved_report_analysed_again_gives_the_same_designs(tmp_path: Path) -> None:
    drift = [1.0, 0.7, 1.2, 0.9, 1.1]
    own = {s: [1.0 + 0.02 * ((i + s) % 2) for i in range(len(drift))] for s in range(1, 7)}
    data = {s: {1: cell, 4: cell} for s, cell in _cells(drift=drift, own=own).items()}
    report = {"settings": {"levels": [1, 4]}, "rounds_made": len(drift),
              **bench.results(data, levels=[1, 4], max_steps=6)}
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(report))
    again = bench.reanalyse(saved)
    assert again["reanalysed_from"] == str(saved)
    for name, design in report["designs"].items():
        for kind in ("within_rounds", "between_starts"):
            assert again["designs"][name]["summary"][kind] == design["summary"][kind]
            first = again["designs"][name]["1"][kind]["predicted"][0]
            assert math.isclose(first["half_width_rel"], design["1"][kind]["predicted"][0]["half_width_rel"])


def test_an_engine_offset_across_restarts_counts_once_per_start_not_once_per_round() -> None:
    """Chain 3's engine ran 5% fast on its first start and 5% slow on its second, steady within each:
    four rounds per start are two measurements of its offset, not eight. Its standard error comes from
    the two starts' means, raw and within rounds; read as eight independent rounds it would be half that."""
    drift = [1.0, 0.7, 1.2, 0.9, 1.1, 0.8, 1.05, 0.75]
    own = {3: [1.05] * 4 + [0.95] * 4}
    cells = _cells(drift=drift, own=own)
    for cell in cells.values():
        cell["start"] = [0] * 4 + [1] * 4
    offsets = [math.log(1.05), math.log(0.95)]
    per_start_se = statistics.stdev(offsets) / math.sqrt(2)
    within = bench.within_round_chains(cells)
    assert within[3].tok_rel_se == pytest.approx(per_start_se, rel=1e-9)
    assert max(within[s].tok_rel_se for s in (1, 2, 4, 5, 6)) < 1e-6
    raw = bench.chain_of(3, cells[3])
    drift_logs = [math.log(d * o) for d, o in zip(drift, own[3])]
    assert raw.tok_rel_se == pytest.approx(statistics.stdev(bench.per_start(drift_logs, cells[3]["start"])) / math.sqrt(2))
    assert raw.tok_per_s == pytest.approx(math.exp(statistics.fmean(math.log(v) for v in cells[3]["tok"])))
    one_start = {s: {k: v for k, v in cell.items() if k != "start"} for s, cell in cells.items()}
    assert bench.within_round_chains(one_start)[3].tok_rel_se < per_start_se / 1.9


def test_restart_every_starts_every_engine_afresh_and_numbers_the_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure() calls restart() before rounds 3 and 5 of 6 with --restart-every 2 and tags each
    repetition with its start; the benchmark itself is stubbed (this is about the rounds' bookkeeping)."""
    class _Rep:
        output_tok_per_s, accept_length, cycle_ms, accept_histogram, host_cpu_steal = 100.0, 2.0, 3.0, [1, 2], 0.0

    class _Level:
        def __init__(self, concurrency: int) -> None:
            self.concurrency, self.repetitions = concurrency, [_Rep()]

    class _Result:
        levels = [_Level(1)]

    class _Server:
        url = "http://127.0.0.1:1"

    restarts: list[int] = []
    monkeypatch.setattr(bench, "run_benchmark", lambda **_: _Result())
    data = bench.measure({1: _Server(), 2: _Server()}, levels=[1], rounds=6, traffics={"builtin": {}},
                         restart_every=2, restart=lambda: restarts.append(1))
    assert len(restarts) == 2
    assert data["builtin"][1][1]["start"] == [0, 0, 1, 1, 2, 2] == data["builtin"][2][1]["start"]


def test_each_starts_first_rounds_can_be_left_out_as_warm_up() -> None:
    """--settle-rounds 1: the first round of every start (an engine still warming up) leaves the analysis,
    the other rounds and the summed histogram stay; a start with no round left drops out, and nothing
    left at all is an error that says so."""
    drift = [0.6, 1.0, 0.6, 1.0, 0.6]
    cells = _cells(drift=drift, own={})
    for cell in cells.values():
        cell["start"] = [0, 0, 1, 1, 2]
        cell["histograms"] = [HISTOGRAM]
    kept = bench.settled({s: {1: cell} for s, cell in cells.items()}, settle_rounds=1)
    assert kept[1][1]["start"] == [0, 1]
    assert kept[1][1]["tok"] == [cells[1]["tok"][1], cells[1]["tok"][3]]
    assert kept[1][1]["histograms"] == [HISTOGRAM]
    assert bench.settled({1: {1: cells[1]}}, settle_rounds=0)[1][1] is cells[1]
    with pytest.raises(ValueError, match="settle_rounds=2 leaves steps 1 at c1 no round"):
        bench.settled({1: {1: cells[1]}}, settle_rounds=2)


@pytest.mark.parametrize("argv, says", [
    (["--restart-every", "-1"], "--restart-every must be 0 (never) or a number of rounds, got -1"),
    (["--settle-rounds", "-2"], "--settle-rounds must be 0 or more, got -2"),
    (["--restart-every", "2", "--settle-rounds", "2"], "--settle-rounds 2 would leave out every round of a start"),
    (["--start-at-once", "-1"], "--start-at-once must be 0 (all at once) or more, got -1"),
])
def test_bad_restart_and_settle_settings_are_refused_before_any_engine_starts(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_the_design_called_the_sweeps_opening_is_the_chains_a_sweep_opens_with() -> None:
    """The benchmark's figures for the sweep's opening stand for the sweep only while they name the chains
    its searcher really starts first (SGLang's chain, the longest and the shortest)."""
    from orchestrator.space.define_by_run import DefineByRunSpace
    from orchestrator.spec import SweepSpec

    spec = SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "search": {"speculative": {"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1]}},
    })
    opened = [plan.candidate.speculative.num_steps for part, plans in DefineByRunSpace(spec).opening_stages()
              for plan in plans if part in ("chains", "shortest")]
    data = {s: {4: cell} for s, cell in _cells(drift=[1.0, 0.9, 1.1], own={}).items()}
    report = bench.results(data, levels=[4], max_steps=6)
    opening = [name for name, role in report["design_roles"].items() if role.startswith("the sweep's opening")]
    assert opening == ["shortest_default_longest"] and set(report["design_roles"]) == set(report["designs"])
    assert report["designs"]["shortest_default_longest"]["4"]["from_steps"] == sorted(opened) == [1, 3, 6]


def test_engines_start_in_groups_each_healthy_before_the_next_group_starts() -> None:
    events: list[str] = []

    class _Server:
        def __init__(self, name: str) -> None:
            self.name = name

        def start(self, flags: list[str], env: dict) -> None:
            events.append(f"start {self.name}")

        def wait_healthy(self, timeout_s: float) -> None:
            events.append(f"healthy {self.name}")

    servers = [_Server(str(i)) for i in range(1, 6)]
    bench.start_engines(servers, [], at_once=2, timeout_s=1.0)
    assert events == ["start 1", "start 2", "healthy 1", "healthy 2", "start 3", "start 4", "healthy 3",
                      "healthy 4", "start 5", "healthy 5"]
    events.clear()
    bench.start_engines(servers[:3], [], at_once=0, timeout_s=1.0)  # all at once
    assert events == ["start 1", "start 2", "start 3", "healthy 1", "healthy 2", "healthy 3"]
