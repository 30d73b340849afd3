"""Extending a confirmation (``spectune sweep --resume DIR --max-visits N``): the stages' alpha and
boundaries, the overall error of main design + extension, the design recorded with the visits,
the refusals, and run_confirmation continuing from its recorded visits under the extended design."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli.sweep import extension_refusal
from orchestrator.sequential import (
    ALPHA,
    EXTENSION_RESERVE,
    MAX_LOOK,
    Stage,
    boundaries,
    critical_value,
    decisive_look,
    design_alpha,
    extend,
    judge,
    main_design,
    single_stage,
)
from orchestrator.sweep.confirmation.confirm import run_confirmation
from orchestrator.sweep.confirmation.extension import (
    describe_design,
    design_record,
    extension_problem,
    read_confirmation_lines,
    recorded_design,
)

from test_sweep_confirm import RECORDS, Double, _spec

UNDECIDED = {3: 106.0, 4: 100.0, 2: 100.0, 1: 50.0}
"""x1.06 at a 2% between-visit spread: three visits cannot decide a 1% margin, a few more can."""


# --- the stages --------------------------------------------------------------------------------


def test_the_main_design_holds_alpha_in_reserve_and_each_extension_spends_half_of_what_is_left() -> None:
    main = main_design(3, 8)
    once = extend(main, 12)
    twice = extend(once, 20)
    assert main == (Stage(3, 8, 0.02),) and design_alpha(main) == pytest.approx(ALPHA * (1 - EXTENSION_RESERVE))
    assert once[1] == Stage(9, 12, 0.0025) and twice[2] == Stage(13, 20, 0.00125)
    assert design_alpha(twice) == pytest.approx(0.02375) and design_alpha(twice) < ALPHA
    with pytest.raises(ValueError, match="an extension needs 8 < last"):
        extend(main, 8)
    with pytest.raises(ValueError, match=f"last <= {MAX_LOOK}"):
        extend(main, MAX_LOOK + 1)


def test_the_reserve_costs_the_never_extended_design_a_stricter_last_boundary() -> None:
    """What holding 0.5 points back costs a confirmation that is never extended: its last look's
    boundary, at 2.5% (first/last alone, the design before) and at 2.0% (the main design)."""
    rows = []
    for first, last, k in ((3, 3, 1), (3, 8, 1), (3, 8, 3), (3, 16, 1), (3, 16, 3)):
        before = critical_value(last, first=first, last=last, comparisons=k)
        after = critical_value(last, design=main_design(first, last), comparisons=k)
        rows.append((first, last, k, before, after))
        print(f"looks {first}-{last}, alpha/{k}: last boundary {before:.3f} (2.5%) -> {after:.3f} (2.0%), "
              f"+{after / before - 1:.1%}")
        assert before < after < before * 1.15
    # the 3-8 design's last look: 2.65 -> 2.79, 5% wider intervals
    assert rows[1][3] == pytest.approx(2.65, abs=0.03) and rows[1][4] == pytest.approx(2.79, abs=0.03)


def test_an_extensions_looks_use_its_own_boundaries_on_every_pair() -> None:
    design = extend(main_design(3, 3), 8)
    assert critical_value(3, design=design) == boundaries(3, 3, 0.02)[0]
    assert critical_value(6, design=design, comparisons=2) == boundaries(4, 8, 0.00125)[2]
    diffs = [math.log(r) for r in (1.05, 1.07, 1.06, 1.04, 1.06, 1.05, 1.07, 1.06)]
    look = judge(diffs, margin=0.01, design=design)
    assert look.pairs == 8 and look.critical == boundaries(4, 8, 0.0025)[-1], "all 8 pairs, the stage's last look"
    assert look.claim == "better"


def _t_statistics(paths: int, looks: int, seed: int) -> np.ndarray:
    """t statistics of ``n = 1..looks`` standard normal pairs: a true ratio on the claim's boundary."""
    d = np.random.default_rng(seed).standard_normal((paths, looks))
    n = np.arange(1, looks + 1)
    mean = np.cumsum(d, axis=1) / n
    var = np.maximum((np.cumsum(d * d, axis=1) - n * mean * mean) / np.maximum(n - 1, 1), 1e-300)
    return mean / np.sqrt(var / n)


@pytest.mark.parametrize(("first", "last", "extensions"), [(3, 3, (8,)), (3, 6, (10, 14))])
def test_false_claims_over_the_main_design_and_its_extensions_stay_within_alpha(first, last, extensions) -> None:
    """The union bound, checked: at a true ratio on the boundary, a crossing at any look of the main
    design or of the extensions (each t statistic on every pair so far) happens at most ALPHA of the
    time, give or take 3 standard errors of 40,000 seeded paths (another seed than the boundaries')."""
    paths = 40_000
    design = main_design(first, last)
    for n in extensions:
        design = extend(design, n)
    t_stats = _t_statistics(paths, design[-1].last, seed=7)
    crossed = np.zeros(paths, dtype=bool)
    for n in range(first, design[-1].last + 1):
        crossed |= t_stats[:, n - 1] >= critical_value(n, design=design)
    rate = crossed.mean()
    print(f"looks {first}-{last} extended to {extensions}: false claims {rate:.2%} (stages spend "
          f"{design_alpha(design):.3%})")
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / paths)


def test_the_proposed_extension_is_the_first_that_decides_by_its_own_boundaries() -> None:
    design = main_design(3, 3)
    n = decisive_look(log_mean=math.log(1.06), log_sd=0.04, margin=0.01, design=design)
    assert n is not None and n > 3
    distance = math.log(1.06)  # better: the interval above 1 (further from the mean than the equivalence side)
    assert critical_value(n, design=extend(design, n)) * 0.04 / math.sqrt(n) < distance
    assert critical_value(n - 1, design=extend(design, n - 1)) * 0.04 / math.sqrt(n - 1) >= distance
    assert decisive_look(log_mean=-math.log(1.01), log_sd=0.02, margin=0.01, design=design) is None, "on the margin"
    assert decisive_look(log_mean=math.log(1.02), log_sd=0.5, margin=0.01, design=design) is None, "past 100"


# --- the record and the refusals ----------------------------------------------------------------


def test_the_last_valid_design_line_wins_and_visits_and_bad_lines_are_not_designs() -> None:
    once = extend(main_design(3, 3), 8)
    twice = extend(once, 12)
    lines = [{"trial": 3, "round": 0}, design_record(once, margin=0.05, extended_from=3),
             design_record(twice, margin=0.05, extended_from=8), {"design": {"stages": [[1, 2, 0.5]]}}]
    found = recorded_design(lines)
    assert found is not None and found.stages == twice and found.margin == 0.05 and found.last == 12
    assert recorded_design([{"trial": 3, "round": 0}]) is None
    assert json.loads(json.dumps(lines[2]))["design"]["stages"] == [[3, 3, 0.02], [4, 8, 0.0025], [9, 12, 0.00125]]


def test_a_torn_last_line_is_skipped_when_the_results_directory_is_read(tmp_path: Path) -> None:
    record = design_record(extend(main_design(3, 3), 8), margin=0.01, extended_from=3)
    (tmp_path / "confirmation.jsonl").write_text(json.dumps({"trial": 3, "round": 0}) + "\n" + json.dumps(record)
                                                 + "\n" + '{"trial": 4, "ro')
    assert read_confirmation_lines(tmp_path) == [{"trial": 3, "round": 0}, record]
    assert read_confirmation_lines(tmp_path / "nowhere") == []


@pytest.mark.parametrize(("max_visits", "words"), [
    (3, "--max-visits 3: the confirmation in DIR already looks up to 3 visits per contender "
        "(confirmation.max_visits 3); give a number above 3 (at most 100)"),
    (2, "give a number above 3"),
    (101, "--max-visits 101: at most 100 visits per contender"),
])
def test_an_extension_must_go_past_the_last_look_and_not_past_100(max_visits: int, words: str) -> None:
    assert words in extension_problem(_spec(max_visits=3), [], max_visits, results_dir="DIR")
    assert extension_problem(_spec(max_visits=3), [], 4, results_dir="DIR") is None


def test_a_second_extension_must_go_past_the_first() -> None:
    lines = [design_record(extend(main_design(3, 3), 8), margin=0.01, extended_from=3)]
    problem = extension_problem(_spec(max_visits=3), lines, 6, results_dir="DIR")
    assert problem is not None and "already looks up to 8 visits" in problem
    assert "(extended from 3 to 8 before)" in problem
    assert extension_problem(_spec(max_visits=3), lines, 9, results_dir="DIR") is None


def test_no_extension_without_a_confirmation() -> None:
    assert "confirmation.enabled: false" in extension_problem(_spec(enabled=False), [], 8, results_dir="DIR")


def test_the_flags_need_resume_and_minutes_must_be_positive() -> None:
    assert "--max-visits 8 extends the confirmation of a sweep that has run: give --resume RESULTS_DIR too" in \
        extension_refusal(resume=None, max_visits=8, max_minutes=None)
    assert "--max-minutes 30 bounds a resumed confirmation: give --resume RESULTS_DIR too" in \
        extension_refusal(resume=None, max_visits=None, max_minutes=30)
    assert "--max-minutes 0: give a positive number" in extension_refusal(resume=None, max_visits=None, max_minutes=0)
    assert extension_refusal(resume=None, max_visits=None, max_minutes=None) is None


def test_the_cli_refuses_before_starting_anything(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\nengine: {kind: reference, model_path: ref-tiny, draft_model_path: ref-tiny-draft}\n"
                    "confirmation: {max_visits: 3}\n")
    result = CliRunner().invoke(app, ["sweep", str(spec), "--max-visits", "8"])
    assert result.exit_code == 2 and "--max-visits 8 extends the confirmation" in result.output
    result = CliRunner().invoke(app, ["sweep", "--resume", str(tmp_path), "--max-visits", "3"])
    assert result.exit_code == 2
    assert "cannot extend the confirmation" in result.output and "already looks up to 3 visits" in result.output


# --- run_confirmation, extended ----------------------------------------------------------------


def _first_run(**settings):
    saved: list[dict] = []
    result = run_confirmation(_spec(max_visits=3, **settings), RECORDS, visit=Double(UNDECIDED, cv=0.02, seed=3),
                              say=lambda _: None, on_visit=saved.append, results_dir="/results/t")
    return result, saved


def test_an_undecided_verdict_says_how_to_continue_and_what_it_costs_in_one_sentence() -> None:
    result, _ = _first_run()
    assert result.vs_sglang_default["kind"] == "undecided" and result.rounds == 3
    plan = result.continuation
    assert plan is not None and plan["max_visits"] > 3 and plan["rounds"] == plan["max_visits"] - 3
    line = result.lines[0]
    assert (f"continue with: spectune sweep --resume /results/t --max-visits {plan['max_visits']} (about "
            f"{plan['rounds']} more rounds of 4 visits, ~") in line
    assert "at the visit estimate; the fewest that could decide at the measured spread)" in line
    assert line.count(". ") == 0, "one sentence"
    assert result.to_dict()["continuation"] == plan


def test_an_extension_continues_from_the_recorded_visits_and_says_it_was_extended() -> None:
    first, saved = _first_run()
    target = first.continuation["max_visits"]
    again = Double(UNDECIDED, cv=0.02, seed=4)
    lines: list[str] = []
    result = run_confirmation(_spec(max_visits=3), RECORDS, visit=again, say=lines.append, done=list(saved),
                              on_visit=saved.append, extend_to=target, results_dir="/results/t")
    assert result.visits[:12] == first.visits, "the first three rounds are not visited again"
    assert again.order and min(v["round"] for v in result.visits[12:]) == 3
    assert len(again.order) == len(result.visits) - 12
    design_lines = [i for i, entry in enumerate(saved) if "design" in entry]
    assert design_lines == [12], "the stage is recorded once, before its first visit"
    assert saved[12]["design"]["stages"] == [[3, 3, 0.02], [4, target, 0.0025]]
    assert result.design == (Stage(3, 3, 0.02), Stage(4, target, 0.0025)) and result.max_visits == target
    expected = (f"extended from 3 to {target} visits; one-sided alpha 0.025 per claim = 0.020 main design (looks 3-3) "
                f"+ 0.0025 extension 1 (looks 4-{target}) + 0.0025 held for later extensions")
    assert any(expected in line for line in result.lines) and any(expected in line for line in lines)
    assert result.to_dict()["extension"].startswith(expected)
    verdict = result.vs_sglang_default
    assert verdict["kind"] != "undecided" or "continue with" in result.lines[0] or "no extension" in result.lines[0]


def test_a_second_extension_knows_the_first_and_spends_half_as_much() -> None:
    first, saved = _first_run()
    slower = {3: 102.5, 4: 100.0, 2: 100.0, 1: 50.0}  # x1.025 at 2%: six visits cannot decide it
    once = run_confirmation(_spec(max_visits=3), RECORDS, visit=Double(slower, cv=0.02, seed=5), say=lambda _: None,
                            done=list(saved), on_visit=saved.append, extend_to=6)
    assert once.vs_sglang_default["kind"] == "undecided" and "more than --max-visits (6)" in once.lines[0]
    with pytest.raises(ValueError, match="already looks up to 6 visits"):
        run_confirmation(_spec(max_visits=3), RECORDS, visit=Double(slower), say=lambda _: None, done=list(saved),
                         extend_to=5)
    target = once.continuation["max_visits"]
    assert target > 6 and f"--max-visits {target}" in once.lines[0]
    twice = run_confirmation(_spec(max_visits=3), RECORDS, visit=Double(slower, cv=0.02, seed=6), say=lambda _: None,
                             done=list(saved), on_visit=saved.append, extend_to=target)
    assert [s.to_list() for s in twice.design] == [[3, 3, 0.02], [4, 6, 0.0025], [7, target, 0.00125]]
    assert (f"+ 0.00125 extension 2 (looks 7-{target}) + 0.00125 held for later extensions"
            in twice.to_dict()["extension"])
    assert sum(1 for entry in saved if "design" in entry) == 2


def test_a_plain_resume_of_an_interrupted_extension_finishes_it_under_the_recorded_design() -> None:
    first, saved = _first_run()
    killed = []
    run_confirmation(_spec(max_visits=3), RECORDS, visit=Double(UNDECIDED, cv=0.02, seed=4), say=lambda _: None,
                     done=list(saved), on_visit=killed.append, extend_to=10)
    interrupted = saved + killed[:4]  # the design line and three visits of round 4
    result = run_confirmation(_spec(max_visits=3), RECORDS, visit=Double(UNDECIDED, cv=0.02, seed=8),
                              say=lambda _: None, done=interrupted)
    assert result.design[-1] == Stage(4, 10, 0.0025) and result.max_visits == 10
    assert result.visits[:15] == [v for v in interrupted if "design" not in v]


def test_extending_a_decided_confirmation_makes_no_visit_and_records_nothing() -> None:
    saved: list[dict] = []
    decided = run_confirmation(_spec(max_visits=3), RECORDS, visit=Double({3: 130.0, 4: 100.0, 2: 100.0, 1: 50.0}),
                               say=lambda _: None, on_visit=saved.append)
    assert decided.vs_sglang_default["kind"] == "better"
    lines: list[str] = []
    again = Double({3: 130.0, 4: 100.0, 2: 100.0, 1: 50.0})
    result = run_confirmation(_spec(max_visits=3), RECORDS, visit=again, say=lines.append, done=list(saved),
                              on_visit=saved.append, extend_to=8)
    assert not again.order and not any("design" in entry for entry in saved)
    assert result.vs_sglang_default["kind"] == "better" and len(result.design) == 1
    assert "--max-visits 8 made no visit" in lines[-1]
    assert not describe_design(result.design)


def test_max_minutes_given_on_the_command_line_bounds_the_rounds_and_is_named() -> None:
    first, saved = _first_run()
    now = [0.0]

    def visit(record, round_number, *, repetitions=1):
        now[0] += 60.0
        return Double(UNDECIDED, cv=0.02, seed=round_number)(record, round_number)

    result = run_confirmation(_spec(max_visits=3), RECORDS, visit=visit, say=lambda _: None, done=list(saved),
                              extend_to=20, given_minutes=5.0, clock=lambda: now[0])
    assert result.rounds == 4 and result.time_limit == (5.0, "--max-minutes")
    assert result.infeasible is not None and result.infeasible.startswith("--max-minutes (5) leaves")


def test_a_round_stopped_for_time_is_continued_by_a_plain_resume_with_more_minutes() -> None:
    now = [0.0]
    double = Double(UNDECIDED, cv=0.02, seed=3)

    def visit(record, round_number, *, repetitions=1):
        now[0] += 10.0
        return double(record, round_number)

    result = run_confirmation(_spec(max_visits=12, max_minutes=2.0), RECORDS, visit=visit, say=lambda _: None,
                              clock=lambda: now[0], results_dir="/r")
    assert result.vs_sglang_default["kind"] == "undecided" and result.rounds == 3
    assert "confirmation.max_minutes (2) leaves" in result.lines[0]
    assert result.continuation is not None and result.continuation["max_visits"] is None
    assert "continue with: spectune sweep --resume /r --max-minutes " in result.lines[0]
