"""The summary's figures in one pass (``orchestrator.sweep.output.figures``): each record's values read once
per level, typed results holding Ratio objects, and the words made from them, not recomputed."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import PrivateAttr

from orchestrator.statistics import Ratio
from orchestrator.sweep.output.figures import sweep_figures
from orchestrator.sweep.output.per_load import by_concurrency, crossover_dict, ratio_dict
from orchestrator.sweep.output.summary_report import build_report
from orchestrator.sweep.records.results import TrialRecord

from helpers.summary_cases import LEVEL, LEVELS, sweep


class CountingRecord(TrialRecord):
    """A trial record that counts how often each level's values are read."""

    _reads: Counter = PrivateAttr(default_factory=Counter)

    def values_at(self, concurrency: int) -> list[float]:
        self._reads[concurrency] += 1
        return super().values_at(concurrency)


def _counting(records: list[TrialRecord]) -> list[CountingRecord]:
    return [CountingRecord.model_validate(r.model_dump()) for r in records]


def test_each_records_values_are_read_once_per_level() -> None:
    records = _counting(sweep())
    figures = sweep_figures(records, objective_level=LEVEL, levels=LEVELS, nccl_variables=["NCCL_ALGO", "NCCL_PROTO"],
                            confirmed=records[1])
    assert figures.levels and figures.nccl_effects and figures.crossover is not None  # every figure was made
    for record in records:
        assert record._reads == Counter({level: 1 for level in LEVELS}), (record.number, record._reads)


def test_the_figures_are_ratios_and_the_report_only_words_them() -> None:
    records = sweep()
    figures = sweep_figures(records, objective_level=LEVEL, levels=LEVELS, nccl_variables=["NCCL_ALGO"])
    assert isinstance(figures.best_vs_sglang_default, Ratio) and figures.best is figures.searched is records[2]
    assert figures.plain is records[0] and figures.auto is records[1]
    assert figures.crossover.concurrency == 32 and figures.crossover.best_speculative is records[2]
    assert [(e.concurrency, e.best.number, e.best_chain.number) for e in figures.levels] == [(1, 6, 6), (8, 3, 3),
                                                                                              (32, 1, 3)]
    report = build_report(figures, metric="output_tok_per_s")
    assert report["over_sglang_default"] == ratio_dict(figures.best_vs_sglang_default)
    assert report["nccl_effects"][0]["ratio"] == ratio_dict(figures.nccl_effects[0].ratio)
    assert report["by_concurrency"] == by_concurrency(figures.levels)
    assert report["crossover"] == crossover_dict(figures.crossover)
    assert report["share_outside_benchmark"] == round(figures.share_outside_benchmark, 3)


def test_a_confirmed_search_best_is_still_called_the_confirmations_choice() -> None:
    """Without a ``best_why``, the line says where best.yaml's trial came from, even where the
    confirmation chose the search's best itself."""
    records = sweep()
    figures = sweep_figures(records, objective_level=LEVEL, levels=LEVELS, confirmed=records[2])
    assert figures.confirmed and figures.best is figures.searched
    report = build_report(figures, metric="output_tok_per_s")
    assert "best.yaml: trial 3 steps=5 topk=1 draft=6 (the confirmation's choice)" in report["lines"]
    unconfirmed = build_report(sweep_figures(records, objective_level=LEVEL, levels=LEVELS), metric="output_tok_per_s")
    assert "best.yaml: trial 3 steps=5 topk=1 draft=6 (the search's best)" in unconfirmed["lines"]


def test_a_direction_other_than_max_or_min_is_refused() -> None:
    with pytest.raises(ValueError, match=r"direction must be 'max' or 'min' \(objective.direction\), got 'up'"):
        sweep_figures(sweep(), direction="up")
