"""The night planned up front: a timeline against budget.time_limit_s, what to change, the chance to decide."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.night_plan import (
    UNDECIDED_MORNING, changes_to_fit, decision_chance, decision_lines, night_plan, plan_lines,
)
from orchestrator.sweep.records.results import TrialRecord
from helpers.timings import produced

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"
KIMI_SPECS = ["kimi-k2.5-eagle3-8x-h200.yaml", "kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml", "kimi-k2.5-eagle3-8gpu.yaml",
              "kimi-k2.5-eagle3-2x8-h100.yaml"]


def _spec(**sections) -> SweepSpec:
    data = {
        "name": "t",
        "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
        "search": {"speculative": {"num_steps": [1, 2, 3, 4], "eagle_topk": [1, 2], "num_draft_tokens": [4, 8]},
                   "all_reduce": ["default", "nccl"], "nccl_env": {"NCCL_ALGO": [None, "Ring", "Tree"]}},
        "benchmark": {"num_prompts": 32, "output_len": 100, "concurrency": [1, 8], "repetitions": 3,
                      "min_repetition_s": 0},
        "budget": {"num_trials": 20, "engine_start_estimate_s": 600, "tpot_estimate_ms": 10},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return SweepSpec.from_dict(data)


@pytest.mark.parametrize("name", KIMI_SPECS)
def test_the_shipped_kimi_specs_fit_one_night_with_every_setting_in_its_first_hours(name: str) -> None:
    plan = night_plan(SweepSpec.from_yaml(EXPERIMENTS / name))
    assert plan.limit_s == 8 * 3600 and plan.fits, plan_lines(plan)
    assert plan.total_s <= 8 * 3600  # search + confirmation at max_visits + every benchmark, at a 10-minute start
    assert plan.settings_first, "each spec searches all-reduce paths or NCCL settings"
    # every all-reduce path and NCCL setting started in the night's first third after the cold first start (the
    # H200 spec's six arms: 2h31m + 10m)
    assert max(hour for _, _, hour in plan.settings_first) - plan.cold_s <= plan.limit_s / 3, plan.settings_first


def test_the_benchmark_estimate_counts_requests_levels_and_repetitions() -> None:
    plan = night_plan(_spec())
    # probe 8 x 32 tokens; level 1: 4 warm-up + 3 x 32 requests of 100 tokens; level 8: 1 + 3 x 4 waves; at 10 ms
    expected = 8 * 32 * 0.01 + (4 + 3 * 32) * 100 * 0.01 + (1 + 3 * 4) * 100 * 0.01
    assert plan.bench_s == pytest.approx(expected)
    assert plan.start_s == 600 and plan.trial_s == pytest.approx(600 + expected)


def test_measured_trials_replace_the_estimates() -> None:
    records = [TrialRecord(trial_id=f"t{i}", number=i, kind="search", label="x", params={}, status="ok", node_id="n1",
                           started_at=f"2026-12-05T00:0{i}:00+00:00",
                           timings_s=produced(engine_start=300.0 + i, probe=10.0, bench=50.0)) for i in range(1, 4)]
    plan = night_plan(_spec(), records)
    assert plan.bench_s == 60.0 and "measured, median of 3 trials" in plan.bench_basis
    assert plan.start_s == pytest.approx(302.5)  # the warm starts' median (trial 1 was the node's cold start)


def test_the_timeline_follows_the_searchers_order_and_names_when_each_setting_starts() -> None:
    plan = night_plan(_spec())
    kinds = [step.what.split(":")[0] for step in plan.steps]
    assert kinds == ["baselines", "SGLang's chain and the longest chain (its histogram predicts the shorter ones)",
                     "every all-reduce path and NCCL setting at steps=3 topk=1 draft=4",
                     "the shortest chain (the cycle line's other end; SGLang's chain predicted from the two ends "
                     "checks the model)", "SGLang's other rules of thumb", "the search (Optuna TPE)", "confirmation"]
    assert [(label, number) for label, number, _ in plan.settings_first] == [
        ("nccl", 5), ("nccl NCCL_ALGO=Ring", 6), ("nccl NCCL_ALGO=Tree", 7)]
    # after the first trial, each later one waits for the cold first start's extra (assumed: as long as a warm one)
    assert plan.cold_s == plan.start_s and "assumed" in plan.cold_basis
    assert [hour for _, _, hour in plan.settings_first] == [pytest.approx(plan.trial_s * n + plan.cold_s)
                                                            for n in (4, 5, 6)]
    confirmation = plan.steps[-1]
    assert confirmation.at_s == pytest.approx(20 * plan.trial_s + plan.cold_s)


def test_a_plan_without_a_limit_says_nothing_bounds_it() -> None:
    lines = plan_lines(night_plan(_spec()))
    assert "no budget.time_limit_s: nothing bounds the night" in lines[-1]
    assert changes_to_fit(_spec()) == []


def test_a_plan_that_does_not_fit_says_what_to_change_and_each_change_is_re_planned() -> None:
    confirmation = {"top_k": 1, "no_speculation": False, "max_visits": 4}
    spec = _spec(budget={"time_limit_s": 4 * 3600}, confirmation=confirmation)
    plan = night_plan(spec)
    assert not plan.fits and "does NOT fit budget.time_limit_s (4h00m)" in plan_lines(plan)[-1]
    changes = changes_to_fit(spec)
    assert changes, "a plan over its limit must say what to change"
    assert all(c.endswith("(fits)") for c in changes), changes  # never a suggestion still over time
    # the number of trials it offers really fits when applied, and one more would not
    trials = int(next(re.match(r"budget.num_trials 20 -> (\d+):", c).group(1) for c in changes
                      if re.match(r"budget.num_trials 20 -> (\d+):", c)))
    assert night_plan(_spec(budget={"time_limit_s": 4 * 3600, "num_trials": trials}, confirmation=confirmation)).fits
    assert not night_plan(_spec(budget={"time_limit_s": 4 * 3600, "num_trials": trials + 1},
                                confirmation=confirmation)).fits


def test_where_no_single_change_fits_the_biggest_savers_are_offered_together() -> None:
    spec = _spec(budget={"time_limit_s": 4 * 3600})  # the default confirmation: 5 contenders x 16 visits
    changes = changes_to_fit(spec)
    assert len(changes) == 1 and changes[0].startswith("together: ") and changes[0].endswith("(fits)"), changes
    assert "confirmation.max_visits 16 -> " in changes[0]


def test_the_chance_to_decide_falls_with_the_spread_and_is_stated_in_words() -> None:
    spec = _spec(confirmation={"top_k": 1, "max_visits": 6, "margin": 0.03})
    quiet = decision_chance(spec, visit_cv=0.003, gain=0.0, margin=0.03)
    noisy = decision_chance(spec, visit_cv=0.03, gain=0.0, margin=0.03)
    assert quiet > 0.95 and noisy < 0.2
    assert decision_chance(spec, visit_cv=0.01, gain=0.06, margin=0.03) > decision_chance(
        spec, visit_cv=0.02, gain=0.06, margin=0.03)
    lines = decision_lines(spec, paths=200)
    assert lines[0].startswith("chance of a decided verdict by 6 visits (margin 3.0%, the spec's confirmation.margin")
    assert any("at a between-visit spread of 2.0% (assumed" in line for line in lines)
    assert lines[-1].strip() == UNDECIDED_MORNING
