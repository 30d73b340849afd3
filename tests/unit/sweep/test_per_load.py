"""Per-load results on a test double whose speculation wins at concurrency 1, ties at 8 and loses
decidedly at 32: the per-level bests, their ratios, the crossover line, and old records."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from orchestrator.sweep.output.figures import sweep_figures
from orchestrator.sweep.output.per_load import by_concurrency, crossover, per_load_lines
from orchestrator.sweep.output.summary_report import build_report
from orchestrator.sweep.records.results import Objective, TrialRecord, append_record, read_records

from helpers.flag_tokens import line_problems

OBJECTIVE_LEVEL = 8
OFF = {"speculative": "off", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None}
AUTO = {"speculative": "auto", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None}


def _trial(number: int, kind: str, label: str, params: dict, levels: dict[int, list[float]], *,
           resolved: dict | None = None) -> TrialRecord:
    values = levels[OBJECTIVE_LEVEL]
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=label, params=params, status="ok",  # type: ignore[arg-type]
        objective=Objective(metric="output_tok_per_s", concurrency=OBJECTIVE_LEVEL, direction="max", values=values,
                            median=statistics.median(values)),
        level_values={str(c): v for c, v in levels.items()}, repetitions_done=len(values),
        metrics={f"c{c}.output_tok_per_s": statistics.median(v) for c, v in levels.items()},
        repetitions_planned=len(values), measured_in_full=True, resolved_params=resolved,
    )


def speculation_loses_at_high_load(*, plain_at_32: list[float] | None = None) -> list[TrialRecord]:
    """No speculation, SGLang auto (= 3/1/4), a chain and a tree configuration at 1, 8, 32."""
    return [
        _trial(1, "baseline_plain", "no speculation", OFF,
               {1: [50.0, 51.0, 49.0], 8: [300.0, 310.0, 290.0], 32: plain_at_32 or [800.0, 805.0, 795.0]}),
        _trial(2, "baseline_auto", "SGLang auto (= steps 3 topk 1 draft 4)", AUTO,
               {1: [90.0, 91.0, 89.0], 8: [305.0, 295.0, 300.0], 32: [700.0, 705.0, 695.0]},
               resolved={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}),
        _trial(3, "search", "steps=5 topk=1 draft=6",
               {"speculative": "explicit", "num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6},
               {1: [110.0, 112.0, 108.0], 8: [302.0, 298.0, 306.0], 32: [720.0, 725.0, 715.0]}),
        _trial(4, "search", "steps=3 topk=2 draft=8",
               {"speculative": "explicit", "num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 8},
               {1: [100.0, 101.0, 99.0], 8: [290.0, 300.0, 310.0], 32: [690.0, 700.0, 710.0]}),
    ]


def test_the_best_at_each_level_with_its_ratios() -> None:
    levels = by_concurrency(sweep_figures(speculation_loses_at_high_load(), levels=[1, 8, 32]).levels)
    assert [(e["concurrency"], e["best_trial"]) for e in levels] == [(1, 3), (8, 3), (32, 1)]
    low, tie, high = levels
    assert low["value"] == 110.0 and low["best_params"]["num_steps"] == 5
    assert low["vs_sglang_default"]["ratio"] == pytest.approx(110 / 90, rel=1e-3)
    assert low["vs_sglang_default"]["ci95_low"] > 1.0
    assert low["vs_no_speculation"]["ratio"] == pytest.approx(110 / 50, rel=1e-2)
    assert 0 < low["vs_no_speculation"]["ci95_low"] < low["vs_no_speculation"]["ratio"] < low[
        "vs_no_speculation"]["ci95_high"]
    assert tie["vs_no_speculation"]["ci95_low"] < 1.0 < tie["vs_no_speculation"]["ci95_high"]
    assert high["best_kind"] == "baseline_plain" and high["vs_no_speculation"] is None
    assert high["vs_sglang_default"]["ratio"] == pytest.approx(800 / 700, rel=1e-3)
    assert high["best_speculative_trial"] == 3
    assert high["plain_vs_best_speculative"]["ratio"] == pytest.approx(800 / 720, rel=1e-3)


def test_the_crossover_line_when_speculation_loses_decidedly() -> None:
    figures = sweep_figures(speculation_loses_at_high_load(), objective_level=OBJECTIVE_LEVEL, levels=[1, 8, 32])
    report = build_report(figures, metric="output_tok_per_s")
    assert report["crossover"]["concurrency"] == 32
    lines = report["per_load_lines"]
    assert lines[0].startswith("per load:") and "search estimates, trials measured minutes apart" in lines[0]
    assert lines[1].startswith("  at concurrency 1: best steps=5 topk=1 draft=6 110 output_tok_per_s (median of 3 "
                               "repetitions); x1.22 [")
    assert "over SGLang's default, x2.20 [" in lines[1] and lines[1].endswith("over no speculation")
    assert "within the noise of no speculation" in lines[2]
    assert lines[3].startswith("  at concurrency 32: best no speculation 800 output_tok_per_s (median of 3 "
                               "repetitions); x1.14 [")
    assert "no speculation (" not in lines[3]  # no comparison of no speculation with itself
    assert lines[4].startswith("  from concurrency 32 on, no speculation is faster: x1.11 [")
    assert lines[4].endswith("over the best speculative configuration measured there (steps=5 topk=1 draft=6)")
    assert json.loads(json.dumps(report["by_concurrency"], default=str))[2]["concurrency"] == 32


def test_no_crossover_line_when_the_loss_is_not_decided() -> None:
    records = speculation_loses_at_high_load(plain_at_32=[800.0, 650.0, 950.0])
    levels = by_concurrency(sweep_figures(records, levels=[1, 8, 32]).levels)
    assert levels[2]["best_trial"] == 1  # the fastest median, but not decidedly so
    assert crossover(levels) is None
    assert not any("on, no speculation is faster" in line
                   for line in per_load_lines(levels, metric="output_tok_per_s", cross=None))


def test_a_later_level_where_speculation_wins_cancels_the_crossover() -> None:
    records = speculation_loses_at_high_load()
    records[2].level_values["64"] = [2000.0, 2010.0, 1990.0]
    records[0].level_values["64"] = [900.0, 905.0, 895.0]
    levels = by_concurrency(sweep_figures(records).levels)
    assert [e["concurrency"] for e in levels] == [1, 8, 32, 64]
    assert crossover(levels) is None


def test_old_records_without_level_values_still_load(tmp_path: Path) -> None:
    record = speculation_loses_at_high_load()[2]
    line = json.loads(record.model_dump_json())
    del line["level_values"]
    path = tmp_path / "trials.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    (old,) = read_records(path)
    assert old.level_values == {}
    assert old.values_at(OBJECTIVE_LEVEL) == [302.0, 298.0, 306.0] and old.values_at(1) == []
    append_record(path, record)
    assert read_records(path)[0].values_at(1) == [110.0, 112.0, 108.0]


def test_fewer_than_three_values_give_no_interval() -> None:
    records = speculation_loses_at_high_load()
    for record in records:
        record.level_values["1"] = record.level_values["1"][:2]
    (low,) = [e for e in by_concurrency(sweep_figures(records).levels) if e["concurrency"] == 1]
    assert low["vs_sglang_default"]["ci95_low"] is None
    line = per_load_lines([low], metric="output_tok_per_s", cross=None)[1]
    assert "(too few repetitions for an interval) over SGLang's default" in line


def test_the_throughput_by_concurrency_plot_is_drawn(tmp_path: Path) -> None:
    from orchestrator.sweep.output.plots import draw_plots

    made = draw_plots(speculation_loses_at_high_load(), out_dir=tmp_path, metric="output_tok_per_s",
                      concurrency=OBJECTIVE_LEVEL)
    assert tmp_path / "throughput_by_concurrency.png" in made


def test_the_adaptive_schedule_pins_the_best_chain_steps_and_0_where_speculation_loses(tmp_path: Path) -> None:
    from orchestrator.sweep.output.adaptive_schedule import adaptive_schedule, schedule_summary, write_adaptive_schedule

    records = speculation_loses_at_high_load()
    config = adaptive_schedule(sweep_figures(records, levels=[1, 8, 32]).levels)
    assert [k for k in config if k.isdigit()] == ["1", "8", "32"]
    assert {k: config[k]["candidate_steps"] for k in ("1", "8", "32")} == {"1": [5], "8": [5], "32": [0]}
    assert config["1"] == {"candidate_steps": [5], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0}
    assert {"ema_alpha", "update_interval", "warmup_batches"} <= set(config)
    summary = schedule_summary(sweep_figures(records, levels=[1, 8, 32]).levels)
    assert summary["flags"] == ("--speculative-adaptive --speculative-adaptive-config sglang_adaptive_spec.json "
                                "--speculative-eagle-topk 1 --speculative-num-steps 5")
    assert any("0.5.14" in note for note in summary["notes"])
    # the boundaries 1, 8, 32 are on SGLang's default decode CUDA-graph grid under speculation
    assert any("every boundary (1 8 32) is one of SGLang's default sizes" in n for n in summary["notes"])
    for text in (summary["flags"], *summary["notes"]):  # only exact SGLang 0.5.23 flags (exit 2 otherwise)
        assert line_problems(text) == [], text
    path = write_adaptive_schedule(tmp_path / "sglang_adaptive_spec.json", config)
    assert json.loads(path.read_text()) == config


def test_the_schedule_uses_the_auto_choice_as_it_ran_and_skips_trees() -> None:
    from orchestrator.sweep.output.adaptive_schedule import adaptive_schedule

    records = speculation_loses_at_high_load(plain_at_32=[800.0, 650.0, 950.0])
    records[3].level_values["1"] = [500.0, 501.0, 499.0]  # the tree config wins at 1: not expressible
    config = adaptive_schedule(sweep_figures([r for r in records if r.number != 3], levels=[1, 8, 32]).levels)
    assert {k: config[k]["candidate_steps"] for k in ("1", "8", "32")} == {"1": [3], "8": [3], "32": [3]}


def test_no_schedule_from_one_level_or_without_chain_configurations() -> None:
    from orchestrator.sweep.output.adaptive_schedule import adaptive_schedule

    records = speculation_loses_at_high_load()
    assert adaptive_schedule(sweep_figures(records, levels=[8]).levels) is None
    assert adaptive_schedule(sweep_figures([records[0], records[3]], levels=[1, 8, 32]).levels) is None
