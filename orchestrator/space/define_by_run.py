"""The sweep's space as Optuna samples it: a define-by-run function over ``SweepSpec.space()``,
with the baselines, the replay of a known point, and the geometry the staged search needs.

Conditional parameters get a name per context (``num_draft_tokens_s3_k2``); listed points are
one categorical each. See docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Protocol

from optuna.distributions import CategoricalDistribution

from orchestrator.space.kernels import one_step_runs_own_graph
from orchestrator.space.plan import BASELINE_AUTO, BASELINE_PLAIN, TrialPlan, candidate_key
from orchestrator.space.points import Candidate, HasSearchSpace, SpeculativeList, SpeculativeTriple, preset_label

__all__ = ["DEFAULT_WORD", "DefineByRunSpace"]

DEFAULT_WORD = "default"
"""How an unset NCCL variable (NCCL's own choice) appears among the sampler's choices and params."""

TRIPLE_PARAM = "speculative_triple"
"""The sampler's parameter for listed triples (``search.speculative.triples``), values like ``3-1-4``."""

PRESET_PARAM = "nccl_preset"
"""The sampler's parameter for listed NCCL presets (``search.nccl_presets``), values like
``NCCL_ALGO=Ring,NCCL_PROTO=LL`` or ``default``."""

RULES_OF_THUMB: tuple[SpeculativeTriple, ...] = (SpeculativeTriple(3, 1, 4), SpeculativeTriple(5, 4, 8))
"""Where the sampler starts (after the baselines), each taken to the nearest point of the space:
SGLang's auto choices, a 3-step chain (DeepSeek family) and a 5-step top-4 tree of 8 tokens (Llama)."""


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


# --- what DefineByRunSpace needs of a spec (orchestrator.spec.SweepSpec, which this module does not import) ---


class SpeculatingEngine(Protocol):
    """An engine section that may speculate (``EngineSpec``)."""

    @property
    def speculative_algorithm(self) -> str | None: ...


class SampledSpec(HasSearchSpace, Protocol):
    """A spec whose space a sweep samples (``SweepSpec``): the space, and whether the engine speculates."""

    @property
    def engine(self) -> SpeculatingEngine: ...


class DefineByRunSpace:
    """The sweep's space as an Optuna define-by-run function over ``SweepSpec.space()`` (the object
    ``spectune validate`` counts).

    Calling it with an Optuna trial samples one point (steps, then a top-k valid with them, then
    for top-k > 1 a draft count the tree holds) and returns ``{"plan": TrialPlan config}``.
    """

    def __init__(self, spec: SampledSpec) -> None:
        self.speculative_on = spec.engine.speculative_algorithm is not None
        self.one_step_own_graph = one_step_runs_own_graph(spec)  # the opening's shortest chain is then 2 steps
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
        env = self._sample_nccl(trial) if self._space.searches_nccl(all_reduce) else {}
        return TrialPlan("search", Candidate(triple, all_reduce, env))

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
        """The all-reduce path of the baselines and of the speculative stage: SGLang's default if searched."""
        return "default" if "default" in self.all_reduce else self.all_reduce[0]

    @property
    def has_nccl_dimensions(self) -> bool:
        """Whether anything besides the speculative numbers varies (all-reduce path, NCCL)."""
        nccl_searched = any(self._space.searches_nccl(arm) for arm in self.all_reduce)
        return len(self.all_reduce) > 1 or nccl_searched and (
            any(len(v) > 1 for v in self.nccl.values()) or len(self.presets or {}) > 1)

    def pins(self, candidate: Candidate | None = None) -> dict[str, Any]:
        """Optuna params that hold the all-reduce path and the NCCL variables at ``candidate``'s
        settings (default: the default path and NCCL's defaults). Enqueued as a partial trial, they
        leave the sampler only the speculative numbers to choose."""
        all_reduce = candidate.all_reduce if candidate is not None else self.default_all_reduce
        env = dict(candidate.nccl_env) if candidate is not None else {}
        pins: dict[str, Any] = {"all_reduce": all_reduce} if len(self.all_reduce) > 1 else {}
        if not self._space.searches_nccl(all_reduce):
            return pins  # NCCL's defaults are the only setting on this arm: nothing is sampled
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

    def _chain_end(self, pick: Callable[..., SpeculativeTriple], shortest_steps: int = 1) -> TrialPlan | None:
        """The top-k 1 chain (no auto) of at least ``shortest_steps`` steps that ``pick`` (``min`` or ``max``)
        chooses by its steps, on the default path with NCCL's defaults; None without such chains."""
        if not self.has_explicit:
            return None
        chains = [t for t in self.triples if not t.is_auto and t.eagle_topk == 1 and t.num_steps >= shortest_steps]
        if not chains:
            return None
        return TrialPlan("search", Candidate(pick(chains, key=lambda t: t.num_steps), self.default_all_reduce, {}))

    def longest_chain(self) -> TrialPlan | None:
        """The longest top-k 1 chain of the space (default path, NCCL's defaults): its accepted-draft
        histogram predicts every shorter chain's accept length (``sweep.output.predicted_rows``); None
        without explicit chains."""
        return self._chain_end(max)

    def shortest_chain(self) -> TrialPlan | None:
        """The shortest top-k 1 chain of the space that runs the same kernels as the longer ones (default path,
        NCCL's defaults): two steps where one draft step runs another graph (``kernels.one_step_runs_own_graph``:
        GPUs decoding in CUDA graphs), else one. With the longest it brackets every chain the model covers, so
        no prediction extrapolates below what was measured, and SGLang's chain between them is the held-out
        check of the model; None without such chains."""
        return self._chain_end(min, 2 if self.one_step_own_graph else 1)

    def opening_stages(self) -> list[tuple[str, list[TrialPlan]]]:
        """The opening (:meth:`opening`) by part, each without a plan an earlier part holds, empty parts
        left out: ``chains`` (SGLang's chain, the first rule of thumb, and the longest chain: one start
        that answers for every shorter one), ``settings`` (:meth:`setting_points`), ``shortest`` (the
        shortest chain: the cycle-time line's other end, so no prediction extrapolates below a measured
        chain, and SGLang's chain, predicted from the two ends, is checked by its own measurement; after
        the settings, which it does not inform, so they come as early as they did), ``rules`` (the other
        rules of thumb)."""
        starts = self.starting_points()
        longest, shortest = self.longest_chain(), self.shortest_chain()
        parts = [("chains", starts[:1] + ([longest] if longest is not None else [])),
                 ("settings", self.setting_points()),
                 ("shortest", [shortest] if shortest is not None else []), ("rules", starts[1:])]
        seen: list[TrialPlan] = []
        stages: list[tuple[str, list[TrialPlan]]] = []
        for name, plans in parts:
            fresh = []
            for plan in plans:
                if plan not in seen:
                    seen.append(plan)
                    fresh.append(plan)
            if fresh:
                stages.append((name, fresh))
        return stages

    def opening(self) -> list[TrialPlan]:
        """What the searcher proposes after the baselines and before sampling, in order: the plans of
        :meth:`opening_stages`."""
        return [plan for _, plans in self.opening_stages() for plan in plans]

    def setting_points(self) -> list[TrialPlan]:
        """One start per setting besides the speculative numbers, all at the first starting point (SGLang's
        default chain): each other all-reduce path, and on each path where NCCL carries decode each NCCL
        preset (or each value of one NCCL variable, the others at their defaults). NCCL settings and the
        all-reduce path move the cycle time, not the acceptance, so one start per setting pins what it
        does; the searcher proposes these right after the starting points, so a night reaches every
        setting in its first hours. Empty where nothing but the speculative numbers varies."""
        starts = self.starting_points()
        if not starts or not self.has_nccl_dimensions:
            return []
        first = starts[0].candidate
        out = [TrialPlan("search", Candidate(first.speculative, path, {})) for path in self.all_reduce
               if path != first.all_reduce]
        nccl_paths = [path for path in self.all_reduce if self._space.searches_nccl(path)]
        if nccl_paths:  # NCCL's settings once, on the path where NCCL surely carries decode
            path = "nccl" if "nccl" in nccl_paths else nccl_paths[0]
            base = TrialPlan("search", Candidate(first.speculative, path, {}))
            out += [v for v in self.variants(base) if v.candidate.all_reduce == path]
        unique: list[TrialPlan] = []
        for plan in out:
            if plan not in unique and plan not in starts and self.holds(plan):
                unique.append(plan)
        return unique

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
        out = [Candidate(candidate.speculative, path, dict(candidate.nccl_env) if self._space.searches_nccl(path) else {})
               for path in self.all_reduce if path != candidate.all_reduce]
        if not self._space.searches_nccl(candidate.all_reduce):
            return [TrialPlan("search", c) for c in out]
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

