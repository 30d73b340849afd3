"""The searcher: a define-by-run Optuna space with SGLang's speculative rules, the two baselines
first, and what each trial's end means to the sampler.

The space is conditional and exact: top-k 1 is a chain (the draft-token count follows the
steps, it is not sampled), larger top-k sample only draft-token counts the tree can hold. So the
sampler can never propose a configuration SGLang would reject or silently rewrite. Where the
valid choices of a dimension depend on an earlier choice, the parameter gets a name of its own
for that context (``num_draft_tokens_s3_k2``): Optuna's categorical distributions must keep one
set of choices per name, and TPE's ``group`` mode models such conditional parameters as they are.

:class:`SweepSearch` is Ray Tune's ``OptunaSearch`` with four additions: the baselines (no
speculation, then SGLang's own choice, both with NCCL's defaults) are served before the sampler is
asked; a proposal equal to a configuration already measured is answered from that measurement
and the sampler asked again (small discrete spaces repeat themselves); a failed trial is told as
FAIL and a trial ASHA stopped as PRUNED, never as a fake number; an SLO violation is an Optuna
constraint (infeasible), not a worse value.
"""

from __future__ import annotations

import json
import logging
import random
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from orchestrator.space import Candidate, SpeculativeTriple
from orchestrator.spec import SweepSpec

__all__ = [
    "BASELINE_AUTO",
    "BASELINE_PLAIN",
    "DEFAULT_WORD",
    "SweepSpace",
    "SweepSearch",
    "TrialPlan",
    "candidate_key",
]

logger = logging.getLogger(__name__)

DEFAULT_WORD = "default"
"""How an unset NCCL variable (NCCL's own choice) appears among the sampler's choices and params."""

BASELINE_PLAIN = "baseline_plain"
BASELINE_AUTO = "baseline_auto"

OBJECTIVE_KEY = "objective"
"""The metric name every trial reports to Ray Tune, ASHA and Optuna (the spec's objective)."""


@dataclass(frozen=True)
class TrialPlan:
    """What one trial runs: a baseline or a point of the space.

    Attributes:
        kind: ``baseline_plain`` (speculation off), ``baseline_auto`` (SGLang's own numbers) or ``search``.
        candidate: The point (for ``baseline_plain`` its speculative part is ignored).
    """

    kind: str
    candidate: Candidate

    @property
    def speculative(self) -> bool:
        return self.kind != BASELINE_PLAIN

    def params(self) -> dict[str, Any]:
        """The configuration in the sweep's names: what MLflow, trials.jsonl and the summary show."""
        triple = self.candidate.speculative
        out: dict[str, Any] = {
            "speculative": "off" if not self.speculative else ("auto" if triple.is_auto else "explicit"),
            "num_steps": triple.num_steps if self.speculative else None,
            "eagle_topk": triple.eagle_topk if self.speculative else None,
            "num_draft_tokens": triple.num_draft_tokens if self.speculative else None,
            "all_reduce": self.candidate.all_reduce,
        }
        return out

    def label(self) -> str:
        """``steps=3 topk=1 draft=4 NCCL_ALGO=Ring``, ``no speculation``, ``SGLang auto``."""
        if not self.speculative:
            head = "no speculation"
        elif self.candidate.speculative.is_auto:
            head = "SGLang auto"
        else:
            head = self.candidate.speculative.label()
        parts = [head]
        if self.candidate.all_reduce != "custom":
            parts.append(f"all_reduce={self.candidate.all_reduce}")
        parts += [f"{k}={v}" for k, v in sorted(self.candidate.nccl_env.items())]
        return " ".join(parts)

    def to_config(self) -> dict[str, Any]:
        """Plain data for Ray Tune's config (crosses process boundaries)."""
        triple = self.candidate.speculative
        return {
            "kind": self.kind,
            "num_steps": triple.num_steps,
            "eagle_topk": triple.eagle_topk,
            "num_draft_tokens": triple.num_draft_tokens,
            "all_reduce": self.candidate.all_reduce,
            "nccl_env": dict(self.candidate.nccl_env),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "TrialPlan":
        plan = config["plan"] if "plan" in config else config
        return cls(
            kind=plan["kind"],
            candidate=Candidate(
                SpeculativeTriple(plan["num_steps"], plan["eagle_topk"], plan["num_draft_tokens"]),
                plan["all_reduce"],
                dict(plan["nccl_env"]),
            ),
        )


def candidate_key(plan: TrialPlan) -> str:
    """One string per distinct configuration (baselines included), for de-duplication."""
    data = plan.to_config()
    if plan.kind == BASELINE_PLAIN:
        data.update(num_steps=None, eagle_topk=None, num_draft_tokens=None)
    data["speculative"] = plan.speculative
    data.pop("kind")
    return json.dumps(data, sort_keys=True)


class _Replay:
    """Stands in for an Optuna trial to replay one known candidate through the space code,
    recording the parameter names and distributions that candidate would have been sampled with."""

    def __init__(self, wanted: dict[str, Any]) -> None:
        self.wanted = wanted
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, CategoricalDistribution] = {}

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        dimension = name.split("__")[0]
        value = self.wanted[dimension]
        if value not in choices:
            raise ValueError(f"{dimension}={value!r} is not among the choices {choices}")
        self.params[name] = value
        self.distributions[name] = CategoricalDistribution(choices)
        return value


class SweepSpace:
    """The sweep's space as an Optuna define-by-run function over ``SweepSpec.space()``: the very
    object ``spectune validate`` counts, so the sampler and the count can never disagree.

    Calling it with an Optuna trial samples one point and returns ``{"plan": TrialPlan config}``.
    Steps are sampled first, then a top-k that has a valid draft count with them, then (top-k > 1)
    a draft count the tree holds; top-k 1 derives the draft count (a chain).
    """

    def __init__(self, spec: SweepSpec) -> None:
        space = spec.space()
        self.speculative_on = spec.engine.speculative_algorithm is not None
        self.triples = space.speculative
        self.all_reduce = list(space.all_reduce)
        self.nccl = {name: [DEFAULT_WORD if v is None else v for v in space.nccl_env[name]] for name in sorted(space.nccl_env)}
        self._space = space

    @property
    def include_auto(self) -> bool:
        return self.speculative_on and self.triples.include_auto

    @property
    def has_explicit(self) -> bool:
        return self.speculative_on and bool(self.triples.steps_choices())

    # --- the define-by-run function -------------------------------------------------------

    def __call__(self, trial: Any) -> dict[str, Any]:
        plan = self.sample(trial)
        return {"plan": plan.to_config()}

    def sample(self, trial: Any) -> TrialPlan:
        """Sample (or, with a :class:`_Replay`, replay) one point of the space."""
        triple = SpeculativeTriple(None, None, None)
        if self.speculative_on:
            modes = (["auto"] if self.include_auto else []) + (["explicit"] if self.has_explicit else [])
            mode = self._choose(trial, "speculative", modes)
            if mode == "explicit":
                triple = self._sample_triple(trial)
        all_reduce = self._choose(trial, "all_reduce", self.all_reduce)
        env: dict[str, str] = {}
        for name, values in self.nccl.items():
            value = self._choose(trial, name, values)
            if value != DEFAULT_WORD:
                env[name] = value
        return TrialPlan("search", Candidate(triple, all_reduce, env))

    def _sample_triple(self, trial: Any) -> SpeculativeTriple:
        space = self.triples
        steps = self._choose(trial, "num_steps", list(space.steps_choices()))
        topks = list(space.topk_choices(num_steps=steps))
        all_topks = sorted({k for s in space.steps_choices() for k in space.topk_choices(num_steps=s)})
        topk = self._choose(trial, "eagle_topk", topks, context="" if topks == all_topks else f"s{steps}")
        drafts = list(space.draft_choices(num_steps=steps, eagle_topk=topk))
        if topk == 1:
            return SpeculativeTriple(steps, 1, drafts[0])
        all_drafts = list(space.num_draft_tokens)
        draft = self._choose(trial, "num_draft_tokens", drafts,
                             context="" if drafts == all_drafts else f"s{steps}_k{topk}")
        return SpeculativeTriple(steps, topk, draft)

    @staticmethod
    def _choose(trial: Any, name: str, choices: list[Any], context: str = "") -> Any:
        if len(choices) == 1:
            return choices[0]
        return trial.suggest_categorical(f"{name}__{context}" if context else name, list(choices))

    # --- baselines and replays ---------------------------------------------------------------

    def baselines(self) -> list[TrialPlan]:
        """No speculation, then SGLang's own choice; both with NCCL's defaults and the first all-reduce path."""
        first_all_reduce = "custom" if "custom" in self.all_reduce else self.all_reduce[0]
        plans = [TrialPlan(BASELINE_PLAIN, Candidate(SpeculativeTriple(None, None, None), first_all_reduce, {}))]
        if self.speculative_on:
            plans.append(TrialPlan(BASELINE_AUTO, Candidate(SpeculativeTriple(None, None, None), first_all_reduce, {})))
        return plans

    def replay(self, plan: TrialPlan) -> tuple[dict[str, Any], dict[str, CategoricalDistribution]] | None:
        """The raw Optuna params and distributions of ``plan``, or None if it is not a point of the space."""
        if not plan.speculative and self.speculative_on:
            return None
        triple = plan.candidate.speculative
        wanted: dict[str, Any] = {
            "speculative": "auto" if triple.is_auto else "explicit",
            "eagle_topk": triple.eagle_topk,
            "num_steps": triple.num_steps,
            "num_draft_tokens": triple.num_draft_tokens,
            "all_reduce": plan.candidate.all_reduce,
            **{name: plan.candidate.nccl_env.get(name, DEFAULT_WORD) for name in self.nccl},
        }
        replay = _Replay(wanted)
        try:
            replayed = self.sample(replay)
        except (ValueError, KeyError):
            return None
        if candidate_key(replayed) != candidate_key(TrialPlan("search", plan.candidate)):
            return None
        return replay.params, replay.distributions

    def candidates(self) -> Iterable[TrialPlan]:
        """Every point of the space, in the space's stable order."""
        for candidate in self._space:
            yield TrialPlan("search", candidate)


class SweepSearch(OptunaSearch):
    """Ray Tune's OptunaSearch over :class:`SweepSpace`, with baselines first and honest tells.

    Its whole state (Optuna study, queue of baselines, what was measured) is in ``__dict__``, which
    ``OptunaSearch.save`` pickles into Tune's ``searcher-state-*.pkl``, so ``Tuner.restore`` brings
    it back.
    """

    MAX_DUPLICATE_PROPOSALS = 20
    """Proposals of already-measured points answered from memory before a fresh point is forced."""

    def __init__(
        self,
        *,
        space: SweepSpace,
        mode: str,
        seed: int,
        slo: bool,
        sampler: optuna.samplers.BaseSampler | None = None,
    ) -> None:
        if sampler is None:
            with warnings.catch_warnings():  # `group` is marked experimental; it is what conditional spaces need
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.TPESampler(
                    seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=5
                )
        super().__init__(space=space, metric=OBJECTIVE_KEY, mode=mode, sampler=sampler)
        self.search_space = space
        self.use_constraints = slo
        self._pending_baselines = list(space.baselines())
        self._baseline_trials: dict[str, TrialPlan] = {}
        self._measured: dict[str, tuple[TrialState, float | None, float | None]] = {}
        self._in_flight: dict[str, str] = {}  # trial id -> candidate key
        self._rng = random.Random(seed)
        self._exhausted = False

    # --- proposing ------------------------------------------------------------------------

    def suggest(self, trial_id: str) -> Optional[dict]:
        if self._pending_baselines:
            plan = self._pending_baselines.pop(0)
            self._baseline_trials[trial_id] = plan
            self._in_flight[trial_id] = candidate_key(plan)
            return {"plan": plan.to_config()}
        for _ in range(self.MAX_DUPLICATE_PROPOSALS):
            config = super().suggest(trial_id)
            if config is None:
                return None
            plan = TrialPlan.from_config(config)
            key = candidate_key(plan)
            known = self._measured.get(key)
            if known is None and key not in self._in_flight.values():
                self._in_flight[trial_id] = key
                return config
            # Already measured (or running): answer the sampler from memory, ask again.
            self._tell_known(trial_id, known)
        plan = self._unmeasured_plan()
        if plan is None:
            logger.info("every configuration of the space has been measured; the search is finished")
            self._exhausted = True
            return Searcher.FINISHED
        replayed = self.search_space.replay(plan)
        assert replayed is not None
        self._ot_study.enqueue_trial(replayed[0])
        config = super().suggest(trial_id)
        self._in_flight[trial_id] = candidate_key(TrialPlan.from_config(config))
        return config

    def _tell_known(self, trial_id: str, known: tuple[TrialState, float | None, float | None] | None) -> None:
        ot_trial = self._ot_trials.pop(trial_id)
        if known is None:  # in flight: constant liar already covers it; do not count it twice
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            return
        state, value, violation = known
        if self.use_constraints and violation is not None and state == TrialState.COMPLETE:
            ot_trial.set_constraint("slo", violation)
        if state == TrialState.COMPLETE and value is not None:
            self._ot_study.tell(ot_trial, value)
        else:
            self._ot_study.tell(ot_trial, state=state if state != TrialState.COMPLETE else TrialState.FAIL)

    def _unmeasured_plan(self) -> TrialPlan | None:
        busy = set(self._measured) | set(self._in_flight.values())
        left = [plan for plan in self.search_space.candidates() if candidate_key(plan) not in busy]
        return self._rng.choice(left) if left else None

    # --- results ----------------------------------------------------------------------------

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self._baseline_trials or not isinstance(result.get(OBJECTIVE_KEY), (int, float)):
            return
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        key = self._in_flight.pop(trial_id, None)
        result = result or {}
        state, value, violation = _outcome(result, error=error)
        if key is not None:
            self._measured[key] = (state, value, violation)
        plan = self._baseline_trials.pop(trial_id, None)
        if plan is not None:
            self._add_baseline(plan, state, value, violation)
            return
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        ot_trial = self._ot_trials[trial_id]
        if self.use_constraints and violation is not None and state == TrialState.COMPLETE:
            ot_trial.set_constraint("slo", violation)
        if state == TrialState.COMPLETE:
            self._ot_study.tell(ot_trial, value)
        else:
            self._ot_study.tell(ot_trial, state=state)
        self._completed_trials.add(trial_id)

    def _add_baseline(self, plan: TrialPlan, state: TrialState, value: float | None, violation: float | None) -> None:
        """A baseline that is also a point of the space (SGLang's auto choice) informs the sampler."""
        replayed = self.search_space.replay(plan)
        if replayed is None or state != TrialState.COMPLETE or value is None:
            return
        params, distributions = replayed
        attrs = {"constraints": [violation]} if self.use_constraints and violation is not None else {}
        self._ot_study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=distributions, value=value, system_attrs=attrs,
            )
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
