"""The searcher: a define-by-run Optuna space with SGLang's speculative rules, the two baselines
first, and what each trial's end means to the sampler.

The space is conditional and exact: top-k 1 is a chain (the draft-token count follows the
steps, it is not sampled), larger top-k sample only draft-token counts the tree can hold. So the
sampler can never propose a configuration SGLang would reject or silently rewrite. Where the
valid choices of a dimension depend on an earlier choice, the parameter gets a name of its own
for that context (``num_draft_tokens_s3_k2``): Optuna's categorical distributions must keep one
set of choices per name, and TPE's ``group`` mode models such conditional parameters as they are.
Listed points (``search.speculative.triples``, ``search.nccl_presets``) are one categorical each.

The search is staged, because a sweep of a large model affords a few dozen trials (see
:class:`SweepSearch`): SGLang's rule-of-thumb configurations first, then the speculative numbers
with NCCL at its defaults, then NCCL one setting at a time on the best point, then the numbers at
the best NCCL settings and everything at once, in turn.
``benchmarks/search_efficiency.py`` measures what this buys on measured grids.

:class:`SweepSearch` is Ray Tune's ``OptunaSearch`` with four additions: the baselines (no
speculation, then SGLang's own choice, both with NCCL's defaults) are served before the sampler is
asked; a proposal equal to a configuration already measured is answered from that measurement
and the sampler asked again (small discrete spaces repeat themselves); a failed trial is told as
FAIL and a trial ASHA stopped as PRUNED, never as a fake number; an SLO violation is an Optuna
constraint (infeasible), not a worse value.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Iterable, Optional

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from orchestrator.space import (
    BASELINE_AUTO,
    BASELINE_PLAIN,
    Candidate,
    SpeculativeList,
    SpeculativeTriple,
    TrialPlan,
    candidate_key,
    preset_label,
)
from orchestrator.spec import SweepSpec

__all__ = [
    "DEFAULT_WORD",
    "SweepSpace",
    "SweepSearch",
]

logger = logging.getLogger(__name__)

DEFAULT_WORD = "default"
"""How an unset NCCL variable (NCCL's own choice) appears among the sampler's choices and params."""

TRIPLE_PARAM = "speculative_triple"
"""The sampler's parameter for listed triples (``search.speculative.triples``), values like ``3-1-4``."""

PRESET_PARAM = "nccl_preset"
"""The sampler's parameter for listed NCCL presets (``search.nccl_presets``), values like
``NCCL_ALGO=Ring,NCCL_PROTO=LL`` or ``default``."""

OBJECTIVE_KEY = "objective"
"""The metric name every trial reports to Ray Tune, ASHA and Optuna (the spec's objective)."""


RULES_OF_THUMB: tuple[SpeculativeTriple, ...] = (SpeculativeTriple(3, 1, 4), SpeculativeTriple(5, 4, 8))
"""Where the sampler starts (after the baselines), each taken to the nearest point of the space:
SGLang's auto choices, a 3-step chain for DeepSeek-family models (Kimi-K2.5) and a 5-step top-4
tree of 8 tokens for Llama. One of them is usually the auto baseline itself; the other then shows
at once whether the other shape is better."""


def _closest(choices: Iterable[int], want: int | None) -> int:
    """The choice nearest ``want`` by ratio (ties: the smaller)."""
    target = want or 1
    return min(choices, key=lambda c: (abs(math.log(c / target)), c))


def _log_distance(triple: SpeculativeTriple, want: SpeculativeTriple) -> tuple[float, ...]:
    """How far ``triple`` is from ``want``: steps first, then top-k, then draft (log ratios)."""
    pairs = zip((triple.num_steps, triple.eagle_topk, triple.num_draft_tokens),
                (want.num_steps, want.eagle_topk, want.num_draft_tokens))
    return tuple(abs(math.log((a or 1) / (b or 1))) for a, b in pairs)


def _triple_label(triple: SpeculativeTriple) -> str:
    """``3-1-4`` (steps-topk-draft): a listed triple as one categorical choice."""
    return f"{triple.num_steps}-{triple.eagle_topk}-{triple.num_draft_tokens}"


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
        self.speculative_on = spec.engine.speculative_algorithm is not None
        self._space = spec.space()
        self.triples = self._space.speculative
        self.all_reduce = list(self._space.all_reduce)
        nccl_env = self._space.nccl_env
        self.nccl = {name: [DEFAULT_WORD if v is None else v for v in nccl_env[name]] for name in sorted(nccl_env)}
        presets = self._space.nccl_presets
        self.presets: dict[str, dict[str, str]] | None = (
            None if presets is None else {preset_label(p): dict(p) for p in presets}
        )
        self._ranges: list[tuple[float, float]] | None = None

    @property
    def include_auto(self) -> bool:
        return self.speculative_on and self.triples.include_auto

    @property
    def has_explicit(self) -> bool:
        return self.speculative_on and len(self.triples) > (1 if self.triples.include_auto else 0)

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
        return TrialPlan("search", Candidate(triple, all_reduce, self._sample_nccl(trial)))

    def _sample_nccl(self, trial: Any) -> dict[str, str]:
        """One NCCL setting: a categorical over the listed presets, or one per variable."""
        if self.presets is not None:
            return dict(self.presets[self._choose(trial, PRESET_PARAM, list(self.presets))])
        env: dict[str, str] = {}
        for name, values in self.nccl.items():
            value = self._choose(trial, name, values)
            if value != DEFAULT_WORD:
                env[name] = value
        return env

    def _sample_triple(self, trial: Any) -> SpeculativeTriple:
        if isinstance(self.triples, SpeculativeList):  # exactly the listed points: one categorical
            labels = {_triple_label(t): t for t in self.triples.triples}
            return labels[self._choose(trial, TRIPLE_PARAM, list(labels))]
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
        first_all_reduce = self.default_all_reduce
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
            TRIPLE_PARAM: _triple_label(triple),
            "all_reduce": plan.candidate.all_reduce,
            PRESET_PARAM: preset_label(plan.candidate.nccl_env),
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

    def holds(self, plan: TrialPlan) -> bool:
        """Whether ``plan`` is a point of the space (no speculation never is; SGLang's auto choice is
        when the spec includes it)."""
        return (plan.speculative or not self.speculative_on) and plan.candidate in self._space

    @property
    def size(self) -> int:
        """Points of the space (what ``spectune validate`` counts)."""
        return len(self._space)

    def candidates(self) -> Iterable[TrialPlan]:
        """Every point of the space, in the space's stable order."""
        for candidate in self._space:
            yield TrialPlan("search", candidate)

    # --- what the staged search needs --------------------------------------------------------

    @property
    def default_all_reduce(self) -> str:
        """The all-reduce path of the baselines and of the speculative stage: SGLang's custom one if searched."""
        return "custom" if "custom" in self.all_reduce else self.all_reduce[0]

    @property
    def has_nccl_dimensions(self) -> bool:
        """Whether anything besides the speculative numbers varies (all-reduce path, NCCL)."""
        return len(self.all_reduce) > 1 or any(len(v) > 1 for v in self.nccl.values()) or len(self.presets or {}) > 1

    def pins(self, candidate: Candidate | None = None) -> dict[str, Any]:
        """Optuna params that hold the all-reduce path and the NCCL variables at ``candidate``'s
        settings (default: the default path and NCCL's defaults). Enqueued as a partial trial, they
        leave the sampler only the speculative numbers to choose."""
        all_reduce = candidate.all_reduce if candidate is not None else self.default_all_reduce
        env = dict(candidate.nccl_env) if candidate is not None else {}
        pins: dict[str, Any] = {"all_reduce": all_reduce} if len(self.all_reduce) > 1 else {}
        if self.presets is not None and len(self.presets) > 1:
            pins[PRESET_PARAM] = preset_label(env)
        pins.update({name: env.get(name, DEFAULT_WORD) for name, values in self.nccl.items() if len(values) > 1})
        return pins

    def starting_points(self) -> list[TrialPlan]:
        """SGLang's rule-of-thumb configurations (``RULES_OF_THUMB``), each as the nearest point of the
        space, with the default all-reduce path and NCCL's defaults; no repeats."""
        if not self.has_explicit:
            return []
        plans: list[TrialPlan] = []
        for triple in RULES_OF_THUMB:
            plan = TrialPlan("search", Candidate(self._nearest(triple), self.default_all_reduce, {}))
            if plan not in plans:
                plans.append(plan)
        return plans

    def _nearest(self, want: SpeculativeTriple) -> SpeculativeTriple:
        """The explicit point of the space closest to ``want`` (by log ratio, steps first, then top-k, then draft)."""
        if isinstance(self.triples, SpeculativeList):
            return min(self.triples.triples, key=lambda t: _log_distance(t, want))
        space = self.triples
        steps = _closest(space.steps_choices(), want.num_steps)
        topk = _closest(space.topk_choices(num_steps=steps), want.eagle_topk)
        draft = _closest(space.draft_choices(num_steps=steps, eagle_topk=topk), want.num_draft_tokens)
        return SpeculativeTriple(steps, topk, draft)

    def coordinates(self, candidate: Candidate) -> tuple[tuple[float, ...], tuple[str, ...]]:
        """Where ``candidate`` sits, for the enumeration's distances: the speculative numbers on a log
        scale, each scaled to [0, 1] over the space's range (SGLang's auto choice at its usual
        (3, 1, 4)), and the other settings as labels (the all-reduce path, each NCCL variable or
        the preset), compared as equal or not."""
        triple = candidate.speculative
        if triple.is_auto:
            triple = RULES_OF_THUMB[0]
        numbers = (triple.num_steps, triple.eagle_topk, triple.num_draft_tokens)
        scaled = tuple(
            0.0 if high <= low else (math.log(value or 1) - low) / (high - low)
            for value, (low, high) in zip(numbers, self._log_ranges())
        )
        settings = [candidate.all_reduce]
        if self.presets is not None:
            settings.append(preset_label(candidate.nccl_env))
        settings += [candidate.nccl_env.get(name, DEFAULT_WORD) for name in self.nccl]
        return scaled, tuple(settings)

    def _log_ranges(self) -> list[tuple[float, float]]:
        if self._ranges is None:
            explicit = [t for t in self.triples if not t.is_auto] or [RULES_OF_THUMB[0]]
            columns = zip(*((t.num_steps, t.eagle_topk, t.num_draft_tokens) for t in explicit))
            self._ranges = [(math.log(min(c)), math.log(max(c))) for c in columns]
        return self._ranges

    def distance(self, a: Candidate, b: Candidate) -> float:
        """Euclidean over the scaled numbers plus one per setting that differs (a changed NCCL
        variable is as far as the whole range of one number)."""
        (xa, sa), (xb, sb) = self.coordinates(a), self.coordinates(b)
        return math.sqrt(sum((p - q) ** 2 for p, q in zip(xa, xb))) + sum(p != q for p, q in zip(sa, sb))

    def variants(self, plan: TrialPlan) -> list[TrialPlan]:
        """``plan`` with one setting besides the speculative numbers changed: each other all-reduce
        path, each other value of one NCCL variable, each other NCCL preset (one factor at a time)."""
        candidate = plan.candidate
        out = [Candidate(candidate.speculative, path, dict(candidate.nccl_env))
               for path in self.all_reduce if path != candidate.all_reduce]
        if self.presets is not None:
            out += [Candidate(candidate.speculative, candidate.all_reduce, dict(env))
                    for env in self.presets.values() if env != candidate.nccl_env]
        for name, values in self.nccl.items():
            for value in values:
                env = {k: v for k, v in candidate.nccl_env.items() if k != name}
                if value != DEFAULT_WORD:
                    env[name] = value
                if env != candidate.nccl_env:
                    out.append(Candidate(candidate.speculative, candidate.all_reduce, env))
        return [TrialPlan("search", c) for c in out]


class SweepSearch(OptunaSearch):
    """Ray Tune's OptunaSearch over :class:`SweepSpace`, with baselines first, a staged search and honest tells.

    A sweep of a large model affords a few dozen trials, so the order of proposals matters:

    1. the baselines (no speculation, SGLang's auto choice);
    2. SGLang's rule-of-thumb configurations (``RULES_OF_THUMB``, nearest points of the space);
    3. the speculative stage: TPE chooses the speculative numbers while the all-reduce path and the
       NCCL variables stay at their defaults (they act mostly independently of the numbers, and
       NCCL's defaults are often the best), ``speculative_stage`` proposals long;
    4. the best configuration so far with one NCCL / all-reduce setting changed at a time;
    5. alternately: TPE on the speculative numbers with the settings of the best configuration so
       far (where NCCL is best), and TPE over everything (settings that interact, such as the
       all-reduce path with the NCCL variables), all of the above in its history.

    Stages 3 and 4 only apply where the space varies more than the speculative numbers.

    Its whole state (Optuna study, queues, what was measured) is in ``__dict__``, which
    ``OptunaSearch.save`` pickles into Tune's ``searcher-state-*.pkl``, so ``Tuner.restore`` brings
    it back.
    """

    ENUMERATE_COVERAGE = 0.5
    """Enumerate the space instead of sampling it when the trial budget covers at least this share of
    it (baselines counted): TPE's model needs more points than such a space has to beat a planned
    order, and it re-proposes measured points."""

    enumerating = False
    """Whether this search enumerates its space (set from the budget; a class default so a searcher
    state pickled before enumeration existed restores as sampling)."""
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
        space: SweepSpace,
        mode: str,
        seed: int,
        slo: bool,
        sampler: optuna.samplers.BaseSampler | None = None,
        budget: int | None = None,
        staged: bool = True,
    ) -> None:
        super().__init__(space=space, metric=OBJECTIVE_KEY, mode=mode, sampler=sampler or default_sampler(seed))
        self.search_space = space
        self.use_constraints = slo
        self._pending_baselines = list(space.baselines())
        self._baseline_trials: dict[str, TrialPlan] = {}
        self._measured: dict[str, tuple[TrialState, float | None, float | None]] = {}
        self._plans: dict[str, TrialPlan] = {}  # candidate key -> plan, for the one-factor stage
        self._in_flight: dict[str, str] = {}  # trial id -> candidate key
        self._queue: list[TrialPlan] = space.starting_points()
        self._proposed = 0  # proposals after the baselines
        self.enumerating = budget is not None and budget >= self.ENUMERATE_COVERAGE * (
            len(space.baselines()) + space.size)
        staged = staged and space.has_nccl_dimensions and not self.enumerating
        self._variants_queued = not staged
        self.speculative_stage = self._speculative_stage_length() if staged else 0
        self._exhausted = False
        self._enumerated = 0

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
        queued = self._next_queued()
        if queued is not None:
            return self._propose(trial_id, queued)
        if self.enumerating:
            plan = self._enumerated_plan()
            if plan is None:
                return self._finish()
            return self._propose(trial_id, plan)
        pins = self._pins()
        for _ in range(self.MAX_DUPLICATE_PROPOSALS):
            if pins:  # a partial trial: the sampler picks the rest
                self._ot_study.enqueue_trial(pins)
            config = super().suggest(trial_id)
            if config is None:
                return None
            plan = TrialPlan.from_config(config)
            key = candidate_key(plan)
            known = self._measured.get(key)
            if known is None and key not in self._in_flight.values():
                self._accept(trial_id, plan)
                return config
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
        """The next point of a space the budget covers, alternately the unmeasured point nearest the
        best so far (a local step, to climb) and the one farthest from everything measured (to
        split what is left); never a measured point while unmeasured ones remain."""
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
        """The point of ``left`` farthest from every configuration measured or running (the first in
        the space's order on ties): a planned spread rather than a random pick."""
        busy = self._busy()
        seen = [self._plans[key].candidate for key in busy if key in self._plans and self._plans[key].speculative]
        if not seen:
            return left[0]
        distance = self.search_space.distance
        return max(left, key=lambda plan: min(distance(plan.candidate, c) for c in seen))

    def _propose(self, trial_id: str, plan: TrialPlan) -> dict:
        """Propose exactly ``plan`` through the sampler's study (so Optuna records it as a trial)."""
        replayed = self.search_space.replay(plan)
        assert replayed is not None, plan
        self._ot_study.enqueue_trial(replayed[0])
        config = super().suggest(trial_id)
        self._accept(trial_id, TrialPlan.from_config(config))
        return config

    def _accept(self, trial_id: str, plan: TrialPlan) -> None:
        key = candidate_key(plan)
        self._in_flight[trial_id] = key
        self._plans[key] = plan
        self._proposed += 1

    def _pins(self) -> dict[str, Any]:
        """What the sampler may not choose for the next proposal: in the speculative stage, the
        all-reduce path and NCCL at their defaults; once the one-factor variants are done, every
        other proposal holds them at the best configuration's settings (the numbers searched where
        NCCL is best, while the proposals between search everything, for settings that interact),
        until every speculative point has been measured with those settings."""
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

    def _busy(self) -> set[str]:
        """Keys of the configurations measured or running."""
        return set(self._measured) | set(self._in_flight.values())

    def _unmeasured(self) -> list[TrialPlan]:
        busy = self._busy()
        return [plan for plan in self.search_space.candidates() if candidate_key(plan) not in busy]

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
            resolved = _resolved_plan(plan, result)
            if resolved is not None:
                # SGLang's auto choice *is* this explicit point: a later proposal of it is answered
                # from this measurement, and the sampler learns it as that point.
                key = candidate_key(resolved)
                self._measured[key] = (state, value, violation)
                self._plans[key] = resolved
                self._add_baseline(resolved, state, value, violation)
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


def _resolved_plan(plan: TrialPlan, result: dict) -> TrialPlan | None:
    """The explicit point SGLang's auto choice resolved to (``resolved_*`` of the auto baseline's final
    report), with the baseline's all-reduce path and NCCL settings; None for other trials."""
    numbers = [result.get(f"resolved_{name}") for name in ("num_steps", "eagle_topk", "num_draft_tokens")]
    if plan.kind != BASELINE_AUTO or not all(isinstance(v, int) for v in numbers):
        return None
    return TrialPlan("search", Candidate(SpeculativeTriple(*numbers), plan.candidate.all_reduce,
                                         dict(plan.candidate.nccl_env)))


def default_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """The sweep's TPE: multivariate over groups of parameters that occur together (what a
    conditional space needs), a constant liar for trials in flight, few random start-up trials
    (the baselines and rule-of-thumb points already spread the first measurements)."""
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
