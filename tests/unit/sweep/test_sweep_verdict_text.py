"""The summary a person reads: the table's mark stands on best.yaml's trial in every path (the
confirmation chose the leader, SGLang's default or no speculation; the confirmation was off; none
could run; no valid best), search repetitions are never called visits, a wide interval reads
"undecided", and where the adaptive schedule and best.yaml disagree one line says which to launch."""

from __future__ import annotations

import json
import statistics

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.statistics import Ratio
from orchestrator.sweep.confirmation.confirm import Confirmation, Contender
from orchestrator.sweep.execution.finish import summary_report, summary_text
from orchestrator.sweep.output.per_load import NOISE_RESOLUTION, describe
from orchestrator.sweep.output.summary_report import BEST_MARK
from orchestrator.sweep.records.results import Objective, TrialRecord

LEVEL = 4
CHAIN = {"speculative": "explicit", "eagle_topk": 1}


def _spec(*, enabled: bool = True) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "objective": {"metric": "output_tok_per_s", "concurrency": LEVEL}, "benchmark": {"concurrency": [1, LEVEL]},
        "confirmation": {"enabled": enabled},
    })


def _trial(number: int, kind: str, label: str, params: dict, levels: dict[int, list[float]], *,
           status: str = "ok", resolved: dict | None = None) -> TrialRecord:
    values = levels[LEVEL]
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=label, params=params, status=status,  # type: ignore[arg-type]
        objective=Objective(metric="output_tok_per_s", concurrency=LEVEL, direction="max", values=values,
                            median=statistics.median(values)),
        level_values={str(c): v for c, v in levels.items()}, repetitions_done=len(values),
        repetitions_planned=len(values), measured_in_full=status == "ok", resolved_params=resolved,
    )


def demo_like() -> list[TrialRecord]:
    """The demo's shape: the search's best (trial 5, steps 5) leads SGLang's default (steps 3) by a
    search estimate at both levels; trial 3 is a tree configuration."""
    return [
        _trial(1, "baseline_plain", "no speculation", {"speculative": "off"},
               {LEVEL: [139.0, 140.0, 141.0], 1: [49.0, 50.0, 51.0]}),
        _trial(2, "baseline_auto", "SGLang auto (= steps 3 topk 1 draft 4)", {"speculative": "auto"},
               {LEVEL: [300.0, 342.0, 388.0], 1: [110.0, 128.0, 150.0]},
               resolved={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}),
        _trial(3, "search", "steps=5 topk=2 draft=8", {"speculative": "explicit", "num_steps": 5, "eagle_topk": 2,
                                                       "num_draft_tokens": 8},
               {LEVEL: [310.0, 332.0, 365.0], 1: [100.0, 101.0, 102.0]}),
        _trial(5, "search", "steps=5 topk=1 draft=6", {**CHAIN, "num_steps": 5, "num_draft_tokens": 6},
               {LEVEL: [383.0, 392.0, 398.0], 1: [120.0, 140.0, 160.0]}),
    ]


def _confirmation(records: list[TrialRecord], *, chosen: int, kind: str = "undecided") -> Confirmation:
    by_number = {r.number: r for r in records}
    contenders = [Contender("best", by_number[5]), Contender("runner_up", by_number[3]),
                  Contender("default", by_number[2]), Contender("no_speculation", by_number[1])]
    return Confirmation(contenders=contenders, margin=0.01, direction="max", leader=5, chosen=chosen, rounds=5,
                        vs_sglang_default={"kind": kind, "ratio": 1.08, "ci95_low": 1.0, "ci95_high": 1.17,
                                           "visits": 5},
                        lines=[f"verdict: trial 5 vs SGLang's default: {kind}"])


def _marked(text: str) -> list[str]:
    """The first cell (trial number) of every table row carrying the mark."""
    return [line.split()[0] for line in text.splitlines() if line.rstrip().endswith(BEST_MARK)]


def _summary(spec: SweepSpec, records: list[TrialRecord], confirmation: Confirmation | None) -> tuple[dict, str]:
    report = summary_report(spec, records, confirmation)
    json.dumps(report, default=str)  # summary.json holds it
    return report, summary_text(records, report, metric="output_tok_per_s", concurrency=LEVEL)


@pytest.mark.parametrize(("chosen", "why"), [
    (3, "the confirmation's choice"),
    # undecided, so SGLang's default: kept, not chosen (issue 44)
    (2, "a fallback, not a choice: the confirmation could not decide between trial 5 and SGLang's default after 5 "
        "visits each, so best.yaml keeps SGLang's default"),
    (1, "the confirmation's choice"),
], ids=["leader", "sglang_default", "no_speculation"])
def test_the_mark_stands_on_the_confirmations_choice_not_the_searchs_best(chosen: int, why: str) -> None:
    records = demo_like()
    report, text = _summary(_spec(), records, _confirmation(records, chosen=chosen))
    assert report["best_trial"] == chosen and _marked(text) == [str(chosen)], text
    label = next(r.label for r in records if r.number == chosen)
    assert f"best.yaml: trial {chosen} {label} ({why})" in report["lines"]
    assert report["best_why"] == why
    assert report["best_config"] == next(r.engine_config for r in records if r.number == chosen)


def test_with_the_confirmation_off_the_mark_and_best_yaml_are_the_searchs_best() -> None:
    report, text = _summary(_spec(enabled=False), demo_like(), None)
    assert report["best_trial"] == 5 and _marked(text) == ["5"], text
    assert ("best.yaml: trial 5 steps=5 topk=1 draft=6 (the search's best; the confirmation was off: "
            "confirmation.enabled is false)") in report["lines"]


def test_when_no_confirmation_could_run_the_summary_says_so() -> None:
    records = [r for r in demo_like() if r.kind != "baseline_auto"]  # nothing to judge against
    report, text = _summary(_spec(), records, None)
    assert report["best_trial"] == 5 and _marked(text) == ["5"], text
    assert any(line.startswith("best.yaml: trial 5") and "no confirmation could run" in line
               for line in report["lines"]), report["lines"]


def test_without_a_valid_best_nothing_is_marked() -> None:
    records = [r.model_copy(update={"status": "failed", "reason": "launch_failed"}) for r in demo_like()]
    report, text = _summary(_spec(enabled=False), records, None)
    assert report["best_trial"] is None and _marked(text) == []
    assert not any(line.startswith("best.yaml:") for line in report["lines"])


def test_search_ratios_count_repetitions_and_the_verdict_counts_visits() -> None:
    records = demo_like()
    report, text = _summary(_spec(), records, _confirmation(records, chosen=2))
    assert report["over_sglang_default"] is None  # best.yaml is SGLang's default
    search_ratios = [report["over_no_speculation"]] + [
        entry[key] for entry in report["by_concurrency"]
        for key in ("vs_sglang_default", "vs_no_speculation", "plain_vs_best_speculative") if entry[key]]
    assert len(search_ratios) == 7 and all("visits" not in r and r["repetitions"] == 3 for r in search_ratios), search_ratios
    assert report["verdict"]["vs_sglang_default"]["visits"] == 5  # the confirmation's fresh-engine visits
    per_load = [line for line in text.splitlines() if line.startswith("  at concurrency ")]
    assert len(per_load) == 2 and all("(median of 3 repetitions)" in line and "visits" not in line
                                      for line in per_load), per_load


@pytest.mark.parametrize(("low", "high", "words"), [
    (0.63, 5.00, "undecided against SGLang's default (x0.63 to x5.00)"),
    (0.91, 1.29, "undecided against SGLang's default (x0.91 to x1.29)"),  # the demo's concurrency 1
    (1 / (1 + NOISE_RESOLUTION), 1 + NOISE_RESOLUTION, "within the noise of SGLang's default (x1.00 [0.91, 1.10])"),
    (0.97, 1.04, "within the noise of SGLang's default (x1.00 [0.97, 1.04])"),
    (0.95, 1.101, "undecided against SGLang's default (x0.95 to x1.10)"),
    (1.01, 5.0, "x1.00 [1.01, 5.00] over SGLang's default"),  # above 1: a gain, however wide
])
def test_within_the_noise_only_where_the_interval_could_have_told(low: float, high: float, words: str) -> None:
    assert describe(Ratio(ratio=1.0, ci95_low=low, ci95_high=high), "SGLang's default") == words


def test_a_wide_per_load_interval_reads_undecided() -> None:
    report, _ = _summary(_spec(enabled=False), demo_like(), None)
    low = report["per_load_lines"][1]
    assert low.startswith("  at concurrency 1: best steps=5 topk=1 draft=6 140 ") and "within the noise" not in low
    assert "undecided against SGLang's default (x" in low, low


def test_where_the_schedule_and_best_yaml_disagree_one_line_says_which_to_launch() -> None:
    records = demo_like()
    report, text = _summary(_spec(), records, _confirmation(records, chosen=2))
    assert [row["steps"] for row in report["adaptive_schedule"]["levels"]] == [5, 5]
    launch = report["launch"]
    assert launch["best_yaml_trial"] == 2 and launch["best_yaml_steps"] == 3 and launch["disagree_at"] == [1, 4]
    expected = ("  which to launch: for traffic at concurrency 4, best.yaml (trial 2 SGLang auto (= steps 3 topk 1 "
                "draft 4); a fallback, not a choice: the confirmation could not decide between trial 5 and SGLang's default after 5 visits each, so best.yaml keeps SGLang's default); sglang_adaptive_spec.json's steps 5 there "
                "are a search estimate the confirmation did not bear out, so launch it only for traffic that swings "
                "across concurrency 1-4")
    assert report["per_load_lines"][-1] == expected and text.count("which to launch") == 1
    assert expected in text.splitlines()


def test_a_schedule_that_agrees_at_the_confirmed_level_is_for_swinging_traffic() -> None:
    records = demo_like()
    records.append(_trial(6, "search", "steps=2 topk=1 draft=3", {**CHAIN, "num_steps": 2, "num_draft_tokens": 3},
                          {LEVEL: [300.0, 301.0, 302.0], 1: [200.0, 201.0, 202.0]}))
    report, _ = _summary(_spec(), records, _confirmation(records, chosen=5, kind="better"))
    assert report["launch"]["disagree_at"] == [1]
    assert report["per_load_lines"][-1] == (
        "  which to launch: for traffic at concurrency 4, best.yaml (trial 5 steps=5 topk=1 draft=6; the "
        "confirmation's choice: better than SGLang's default; not shown to clear the 1% margin); for traffic that swings across concurrency 1-4, sglang_adaptive_spec.json (steps 2 at 1: "
        "search estimates; the confirmation measured concurrency 4 only)")


def test_no_launch_line_where_the_schedule_is_best_yamls_steps_everywhere() -> None:
    records = demo_like()
    report, text = _summary(_spec(), records, _confirmation(records, chosen=5, kind="better"))
    assert report["launch"] is None and "which to launch" not in text


def test_without_a_confirmation_the_launch_line_says_both_are_search_estimates() -> None:
    records = demo_like()
    records[2].level_values[str(LEVEL)] = records[2].objective.values = [500.0, 501.0, 502.0]  # a tree wins
    records[2].objective.median = 501.0
    report, _ = _summary(_spec(enabled=False), records, None)
    assert report["best_trial"] == 3 and report["launch"]["best_yaml_steps"] is None
    assert report["per_load_lines"][-1].startswith(
        "  which to launch: for traffic at concurrency 4, best.yaml (trial 3 steps=5 topk=2 draft=8; the search's "
        "best there, no confirmation ran); sglang_adaptive_spec.json's steps 5 there are the best chain "
        "configuration's, from the same search estimates")
