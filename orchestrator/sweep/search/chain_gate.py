"""Which proposed chains need no engine start: one start answers for many (issue 42's gate).

The searcher asks :meth:`ChainGate.skip` before it starts a top-k 1 chain: from the chains measured so
far (``output.predicted_rows``), a chain whose 95% interval at the objective's level lies wholly below
the best measured value there cannot win, and is not started (the searcher tells Optuna PRUNED and
never proposes it again). A chain whose interval reaches the best is started, and its prediction made
before the start is checked against what it measured (:meth:`ChainGate.learn`): a measurement outside the
interval switches the gate off for the rest of the sweep (every later chain is measured, not
predicted) and says so. A miss of an extrapolation (the opening's shortest chain, predicted from longer
ones) only says so: once that chain is measured nothing is extrapolated, and the leave-one-out checks
among three or more measured chains (``unchecked_miss``) keep a group whose model misses from being
skipped. Trees, baselines and the opening are never gated.

Predictions stay out of the records: the gate holds them only to decide and to check.
Picklable (Ray Tune pickles the searcher that holds it): the spec and the records it was told.
"""

from __future__ import annotations

from typing import Any

from orchestrator.space import TrialPlan
from orchestrator.spec import SweepSpec
from orchestrator.statistics import geometric_mean
from orchestrator.sweep.output.predicted_rows import PredictedRow, predict_rows
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["ChainGate"]


class ChainGate:
    """Predictions that decide whether a proposed chain is worth a start (see the module).

    Args:
        spec: The sweep (its space, objective level and metric).
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.records: list[TrialRecord] = []
        self.expected: dict[str, PredictedRow] = {}  # trial id -> its prediction made before its start
        self.missed: str | None = None  # the check that switched the gate off, in words
        self._rows: list[PredictedRow] | None = None  # the predictions from ``records`` (None: not made yet)

    def learn(self, trial_id: str, result: dict[str, Any], *, error: bool = False) -> tuple[str, bool] | None:
        """Keep trial ``trial_id``'s record (its final report carries it as JSON) and, where a prediction
        was made for it before its start (:meth:`expect`), check that against what it measured: the line
        to log and whether the measurement fell inside (a miss switches the gate off). None: no check.

        A trial that ended without its final report (ASHA stopped it after a repetition; ``error``: its
        worker failed) left its last report's record, still ``running``: it is kept as the sweep records
        it (early-stopped, or failed), so an early-stopped chain's repetitions count as they do at the end."""
        row = self.expected.pop(trial_id, None)
        text = result.get("record")
        if not isinstance(text, str):
            return None
        record = TrialRecord.model_validate_json(text)
        if record.status == "running":
            record = record.model_copy(update={"status": "failed" if error else "early_stopped",
                                               "reason": "error" if error else "early_stopped"})
        self.records.append(record)
        self._rows = None
        return self._check(row, record) if row is not None else None

    def _row(self, plan: TrialPlan) -> PredictedRow | None:
        """The prediction for ``plan`` at the objective's level, if it is a chain the gate can predict."""
        triple = plan.candidate.speculative
        if not plan.speculative or triple.is_auto or triple.eagle_topk != 1:
            return None
        if self._rows is None:  # once per finished trial, not per proposal
            self._rows = predict_rows(self.spec, self.records).rows
        level = self.spec.objective_concurrency
        for row in self._rows:
            if (row.concurrency == level and row.num_steps == triple.num_steps
                    and row.all_reduce == plan.candidate.all_reduce and row.nccl_env == dict(plan.candidate.nccl_env)):
                return row
        return None

    def skip(self, plan: TrialPlan) -> PredictedRow | None:
        """The prediction that makes ``plan`` not worth a start (its interval below the best measured), or
        None: start it (not a chain, nothing to predict from, the interval reaches the best, or the gate is off)."""
        if self.missed is not None or self.spec.objective.direction != "max":
            return None
        row = self._row(plan)
        if row is None or row.reaches_best or row.unchecked_miss:
            return None
        return row

    def expect(self, trial_id: str, plan: TrialPlan) -> None:
        """Remember the prediction for a chain about to be started, to check it against its measurement."""
        row = self._row(plan)
        if row is not None:
            self.expected[trial_id] = row

    def _check(self, row: PredictedRow, record: TrialRecord) -> tuple[str, bool] | None:
        """A started chain's measurement against the prediction made before its start."""
        measured = geometric_mean(record.values_at(row.concurrency))
        if record.status != "ok" or measured is None:
            return None
        inside = row.low <= measured <= row.high
        line = (f"prediction check, trial {record.number} {row.label}: predicted {row.tok_per_s:.4g} tok/s "
                f"[{row.low:.4g}, {row.high:.4g}] at concurrency {row.concurrency}, measured {measured:.4g}: "
                + ("inside" if inside else "OUTSIDE"))
        if not inside and row.extrapolated:  # the opening's shortest chain: nothing below it is predicted now
            line += ("; an extrapolation below every measured chain, which this measurement ends: the gate stays "
                     "on, held by the checks among the measured chains")
        elif not inside:
            self.missed = line
            line += "; from now on every chain is measured, not predicted"
        return line, inside
