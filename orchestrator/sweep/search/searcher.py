"""The searcher: a Ray Tune ``Searcher`` over an Optuna study of its own, the baselines first.

:class:`SweepSearcher` serves the baselines before the sampler, stages the search, answers a
repeated proposal from its measurement, and tells Optuna FAIL, PRUNED or an SLO constraint rather
than a fake number. It uses Ray Tune's and Optuna's public API only (``Study.ask``, ``tell``,
``enqueue_trial``, ``add_trial``, ``Trial.set_constraint``): no private state of ``OptunaSearch`` or
Optuna. docs/design/sweep.md says why the search is staged.
"""

from __future__ import annotations

import logging
import math
import pickle
import warnings
from typing import Any, Callable, Optional

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from orchestrator.space import BASELINE_AUTO, Candidate, SpeculativeTriple, TrialPlan, candidate_key
from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.sweep.records.results import OBJECTIVE_KEY, OBJECTIVE_REPETITION_KEY

__all__ = ["SweepSearcher"]

logger = logging.getLogger(__name__)


class SweepSearcher(Searcher):
    """A Ray Tune searcher over :class:`DefineByRunSpace` and one Optuna study (``study``), with
    baselines first, a staged search and honest tells.

    Proposals, in order: the baselines; the opening (``DefineByRunSpace.opening``: SGLang's chain, the
    longest chain, whose histogram predicts every shorter one, one start per all-reduce path and NCCL
    setting at SGLang's chain so the night reaches every setting early, SGLang's other rules of thumb);
    the speculative stage (TPE on the speculative numbers,
    all-reduce and NCCL at their defaults, ``speculative_stage`` proposals); one-factor variants of
    the best; then alternately TPE pinned to the best's settings and TPE over everything. The two
    middle stages apply only where the space varies more than the speculative numbers; a space the
    budget mostly covers is enumerated instead (``ENUMERATE_COVERAGE``).

    A proposal is asked of the study (``Study.ask``); an exact point or a partial one (the pinned
    settings) is enqueued first (``Study.enqueue_trial``), so Optuna records every proposal as its
    own trial. Its whole state is in ``__dict__``, which :meth:`save` pickles, so ``Tuner.restore``
    brings it back.
    """

    ENUMERATE_COVERAGE = 0.5
    """Enumerate the space instead of sampling it when the trial budget covers at least this share of
    it (baselines counted)."""

    enumerating = False
    """Whether this search enumerates its space (set from the budget)."""
    _enumerated = 0

    MAX_DUPLICATE_PROPOSALS = 20
    """Proposals of already-measured points answered from memory before a fresh point is forced."""

    SPECULATIVE_STAGE_SHARE = 0.4
    """Share of the speculative points the speculative stage may propose (within the bounds below)."""
    SPECULATIVE_STAGE_BOUNDS = (6, 16)
    """Fewest and most proposals of the speculative stage (never more than there are points)."""

    def __init__(
        self,
        *,
        space: DefineByRunSpace,
        mode: str,
        seed: int,
        slo: bool,
        sampler: optuna.samplers.BaseSampler | None = None,
        budget: int | None = None,
        staged: bool = True,
        stop_reason: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(metric=OBJECTIVE_KEY, mode=mode)
        self.study = optuna.create_study(
            direction="maximize" if mode == "max" else "minimize", sampler=sampler or default_sampler(seed))
        self.search_space = space
        self._asked: dict[str, optuna.Trial] = {}  # trial id -> its Optuna trial, until told
        self.use_constraints = slo
        self._pending_baselines = list(space.baselines())
        self._baseline_trials: dict[str, TrialPlan] = {}
        self._measured: dict[str, tuple[TrialState, float | None, float | None]] = {}
        self._plans: dict[str, TrialPlan] = {}  # candidate key -> plan, for the one-factor stage
        self._in_flight: dict[str, str] = {}  # trial id -> candidate key
        opening = space.opening()  # SGLang's chain, the longest, every path and NCCL setting, the shortest, the rest
        settings = len(opening) - len(space.starting_points())
        self._queue: list[TrialPlan] = opening
        self._proposed = 0  # proposals after the baselines
        self.enumerating = budget is not None and budget >= self.ENUMERATE_COVERAGE * (
            len(space.baselines()) + space.size)
        staged = staged and space.has_nccl_dimensions and not self.enumerating
        self._variants_queued = not staged
        self.speculative_stage = self._speculative_stage_length() + settings if staged else 0
        self._exhausted = False
        self._enumerated = 0
        self._stop_reason = stop_reason  # the time budget (``execution.time_budget``): no trial it cannot fit

    def _speculative_stage_length(self) -> int:
        points = len(self.search_space.triples)
        low, high = self.SPECULATIVE_STAGE_BOUNDS
        return min(points, max(low, min(high, math.ceil(self.SPECULATIVE_STAGE_SHARE * points))))

    # --- proposing ------------------------------------------------------------------------

    def suggest(self, trial_id: str) -> Optional[dict]:
        if self._pending_baselines:
            plan = self._pending_baselines.pop(0)
            self._baseline_trials[trial_id] = plan
            self._in_flight[trial_id] = candidate_key(plan)
            self._plans[candidate_key(plan)] = plan
            return {"plan": plan.to_config()}
        reason = self._stop_reason() if self._stop_reason is not None else None
        if reason is not None:
            logger.warning("search finished early: %s", reason)
            self._exhausted = True
            return Searcher.FINISHED
        queued = self._next_queued()
        if queued is not None:
            return self._propose(trial_id, queued)
        if self.enumerating:
            plan = self._enumerated_plan()
            return self._finish() if plan is None else self._propose(trial_id, plan)
        pins = self._pins()
        for _ in range(self.MAX_DUPLICATE_PROPOSALS):
            plan = self._ask(trial_id, pins)  # pins: a partial trial, the sampler picks the rest
            key = candidate_key(plan)
            known = self._measured.get(key)
            if known is None and key not in self._in_flight.values():
                self._accept(trial_id, plan)
                return {"plan": plan.to_config()}
            # Already measured (or running): answer the sampler from memory, ask again.
            self._tell_known(trial_id, known)
        left = self._unmeasured()
        if not left:
            return self._finish()
        return self._propose(trial_id, self._farthest(left))

    def _finish(self) -> str:
        logger.info("every configuration of the space has been measured; the search is finished")
        self._exhausted = True
        return Searcher.FINISHED

    def _enumerated_plan(self) -> TrialPlan | None:
        """The next unmeasured point of an enumerated space: alternately the one nearest the best so
        far and the one farthest from everything measured; None when none is left."""
        left = self._unmeasured()
        if not left:
            return None
        self._enumerated += 1
        best = self._incumbent()
        if best is not None and self._enumerated % 2 == 1:
            distance = self.search_space.distance
            return min(left, key=lambda plan: distance(plan.candidate, best.candidate))
        return self._farthest(left)

    def _farthest(self, left: list[TrialPlan]) -> TrialPlan:
        """The point of ``left`` farthest from every configuration measured or running (first on ties)."""
        busy = self._busy()
        seen = [self._plans[key].candidate for key in busy if key in self._plans and self._plans[key].speculative]
        if not seen:
            return left[0]
        distance = self.search_space.distance
        return max(left, key=lambda plan: min(distance(plan.candidate, c) for c in seen))

    def _ask(self, trial_id: str, fixed: dict[str, Any]) -> TrialPlan:
        """Ask the study for a trial (``fixed``: its params enqueued first) and sample the space with it."""
        if fixed:
            self.study.enqueue_trial(fixed)
        ot_trial = self.study.ask()
        self._asked[trial_id] = ot_trial
        return self.search_space.sample(ot_trial)

    def _propose(self, trial_id: str, plan: TrialPlan) -> dict:
        """Propose exactly ``plan`` through the study (so Optuna records it as a trial)."""
        replayed = self.search_space.replay(plan)
        assert replayed is not None, plan
        asked = self._ask(trial_id, replayed[0])
        self._accept(trial_id, asked)
        return {"plan": asked.to_config()}

    def _accept(self, trial_id: str, plan: TrialPlan) -> None:
        key = candidate_key(plan)
        self._in_flight[trial_id] = key
        self._plans[key] = plan
        self._proposed += 1

    def _pins(self) -> dict[str, Any]:
        """What the sampler may not choose for the next proposal: in the speculative stage, the
        all-reduce path and NCCL at their defaults; after the one-factor variants, on every other
        proposal the best configuration's settings, until every speculative point was measured with them."""
        if self._proposed < self.speculative_stage:
            return self.search_space.pins()
        if not self._variants_queued or self._queue or self._proposed % 2:
            return {}
        best = self._incumbent()
        if best is None or self._measured_with(best.candidate) >= len(self.search_space.triples):
            return {}
        return self.search_space.pins(best.candidate)

    def _measured_with(self, candidate: Candidate) -> int:
        """How many points with ``candidate``'s all-reduce path and NCCL settings were measured."""
        def same(plan: TrialPlan | None) -> bool:
            return plan is not None and plan.candidate.all_reduce == candidate.all_reduce and (
                plan.candidate.nccl_env == candidate.nccl_env) and self.search_space.holds(plan)

        return sum(1 for key in self._measured if same(self._plans.get(key)))

    def _next_queued(self) -> TrialPlan | None:
        """The next planned proposal not yet measured: a starting point, or (once the speculative stage
        is over and something was measured) a one-factor variant of the best configuration."""
        if not self._variants_queued and self._proposed >= self.speculative_stage:
            best = self._incumbent()
            if best is not None:
                self._queue.extend(self.search_space.variants(best))
                self._variants_queued = True
        busy = self._busy()
        while self._queue:
            plan = self._queue.pop(0)
            if candidate_key(plan) not in busy:
                return plan
        return None

    def _incumbent(self) -> TrialPlan | None:
        """The best feasible configuration measured so far that is a point of the space, if any."""
        sign = 1.0 if self.mode == "max" else -1.0
        best: tuple[float, str] | None = None
        for key, (state, value, violation) in self._measured.items():
            plan = self._plans.get(key)
            if state != TrialState.COMPLETE or value is None or plan is None or not self.search_space.holds(plan):
                continue
            if self.use_constraints and violation is not None and violation > 0:
                continue
            if best is None or sign * value > best[0]:
                best = (sign * value, key)
        return None if best is None else TrialPlan("search", self._plans[best[1]].candidate)

    def _tell_known(self, trial_id: str, known: tuple[TrialState, float | None, float | None] | None) -> None:
        """Answer a repeated proposal: from its measurement, or (still running) as FAIL, which the
        constant liar already covers, so it is not counted twice."""
        self._tell(trial_id, *(known or (TrialState.FAIL, None, None)))

    def _tell(self, trial_id: str, state: TrialState, value: float | None, violation: float | None) -> None:
        """Tell the study how trial ``trial_id``'s Optuna trial ended (nothing if none was asked for it);
        COMPLETE without a value is told as FAIL."""
        ot_trial = self._asked.pop(trial_id, None)
        if ot_trial is None:
            return
        if state == TrialState.COMPLETE and value is not None:
            if self.use_constraints and violation is not None:
                ot_trial.set_constraint("slo", violation)
            self.study.tell(ot_trial, value)
        else:
            self.study.tell(ot_trial, state=TrialState.FAIL if state == TrialState.COMPLETE else state)

    def _busy(self) -> set[str]:
        """Keys of the configurations measured or running."""
        return set(self._measured) | set(self._in_flight.values())

    def _unmeasured(self) -> list[TrialPlan]:
        busy = self._busy()
        return [plan for plan in self.search_space.candidates() if candidate_key(plan) not in busy]

    # --- results ----------------------------------------------------------------------------

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """A repetition's result: its objective is the Optuna trial's intermediate value at that step."""
        ot_trial = self._asked.get(trial_id)
        value, step = result.get(OBJECTIVE_KEY), result.get(OBJECTIVE_REPETITION_KEY)
        if ot_trial is None or not isinstance(value, (int, float)) or step is None:
            return
        ot_trial.report(float(value), step=int(step))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        key = self._in_flight.pop(trial_id, None)
        result = result or {}
        state, value, violation = _outcome(result, error=error)
        if key is not None:
            self._measured[key] = (state, value, violation)
        plan = self._baseline_trials.pop(trial_id, None)
        if plan is not None:
            self._add_baseline(plan, state, value, violation)
            resolved = _resolved_plan(plan, result)
            if resolved is not None:
                # SGLang's auto choice *is* this explicit point: a later proposal of it is answered
                # from this measurement, and the sampler learns it as that point.
                key = candidate_key(resolved)
                self._measured[key] = (state, value, violation)
                self._plans[key] = resolved
                self._add_baseline(resolved, state, value, violation)
            return
        self._tell(trial_id, state, value, violation)

    def _add_baseline(self, plan: TrialPlan, state: TrialState, value: float | None, violation: float | None) -> None:
        """A baseline that is also a point of the space (SGLang's auto choice) informs the sampler."""
        replayed = self.search_space.replay(plan)
        if replayed is None or state != TrialState.COMPLETE or value is None:
            return
        params, distributions = replayed
        constraints = {"slo": violation} if self.use_constraints and violation is not None else None
        self.study.add_trial(optuna.trial.create_trial(
            params=params, distributions=distributions, value=value, constraints=constraints))

    # --- Ray Tune's searcher interface --------------------------------------------------------

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any) -> bool:
        """The objective and the space are the searcher's own (Tune's ``param_space`` is empty)."""
        return True

    def save(self, checkpoint_path: str) -> None:
        """Pickle the whole state (the study included) for ``Tuner.restore``."""
        with open(checkpoint_path, "wb") as out:
            pickle.dump(self.__dict__.copy(), out)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as saved:
            self.__dict__.update(pickle.load(saved))


def _resolved_plan(plan: TrialPlan, result: dict) -> TrialPlan | None:
    """The explicit point SGLang's auto choice resolved to (``resolved_*`` of the auto baseline's final
    report), with the baseline's all-reduce path and NCCL settings; None for other trials."""
    numbers = [result.get(f"resolved_{name}") for name in ("num_steps", "eagle_topk", "num_draft_tokens")]
    if plan.kind != BASELINE_AUTO or not all(isinstance(v, int) for v in numbers):
        return None
    return TrialPlan("search", Candidate(SpeculativeTriple(*numbers), plan.candidate.all_reduce,
                                         dict(plan.candidate.nccl_env)))


def default_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """The sweep's TPE: multivariate with groups (a conditional space), constant liar for trials in
    flight, few random start-up trials (the baselines and rule-of-thumb points spread the first ones)."""
    with warnings.catch_warnings():  # `group` is marked experimental; it is what conditional spaces need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=5
        )


def _outcome(result: dict, *, error: bool) -> tuple[TrialState, float | None, float | None]:
    """(Optuna state, value, SLO violation) of a finished trial's last result.

    * an error, or a final report with status ``failed``: FAIL;
    * no final report (ASHA stopped it after a repetition): PRUNED;
    * otherwise COMPLETE with the objective (an SLO violation is a constraint, not a value).
    """
    value = result.get(OBJECTIVE_KEY)
    violation = result.get("slo_violation")
    if error or result.get("status") == "failed":
        return TrialState.FAIL, None, None
    if not result.get("final"):
        return TrialState.PRUNED, None, None
    if not isinstance(value, (int, float)):
        return TrialState.FAIL, None, None
    return TrialState.COMPLETE, float(value), (float(violation) if isinstance(violation, (int, float)) else None)

