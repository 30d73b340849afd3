"""The sweep's searcher: exact conditional space, baselines first, honest tells, seeded, no repeats."""

from __future__ import annotations


import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.search import Searcher

from orchestrator.space import BASELINE_AUTO, BASELINE_PLAIN, TrialPlan, candidate_key
from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import OBJECTIVE_KEY, OBJECTIVE_REPETITION_KEY
from orchestrator.sweep.search.searcher import SweepSearcher

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spec(**search) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t",
        "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
        "search": {
            "speculative": {"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 11, 12],
                            "include_auto": True},
            "nccl_env": {"NCCL_ALGO": [None, "Ring"]},
            **search,
        },
    })


def _searcher(spec: SweepSpec, seed: int = 0, slo: bool = False) -> SweepSearcher:
    return SweepSearcher(space=DefineByRunSpace(spec), mode="max", seed=seed, slo=slo)


def _sample_randomly(spec: SweepSpec, *, trials: int, seed: int) -> tuple[set, optuna.Study]:
    """Every candidate random sampling of the sweep's space reaches in ``trials`` asks, each checked
    to be a point of ``spec.space()``; and the study, for its distributions."""
    space = DefineByRunSpace(spec)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    seen = set()
    for _ in range(trials):
        trial = study.ask()
        plan = space.sample(trial)
        assert plan.candidate in spec.space(), plan
        seen.add(plan.candidate)
        study.tell(trial, 1.0)
    return seen, study


def test_sampled_points_are_exactly_the_valid_ones() -> None:
    spec = _spec()
    seen, _ = _sample_randomly(spec, trials=400, seed=1)
    # 6 explicit triples + auto, x 2 NCCL choices (see test_space for the hand count)
    assert len(seen) == len(spec.space()) == 14


def test_top_k_one_is_a_chain_never_a_sampled_draft_count() -> None:
    space = DefineByRunSpace(_spec())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(100):
        trial = study.ask()
        plan = space.sample(trial)
        triple = plan.candidate.speculative
        if triple.eagle_topk == 1:
            assert triple.num_draft_tokens == triple.num_steps + 1
            assert not any(name.startswith("num_draft_tokens") for name in trial.params)
        study.tell(trial, 1.0)


def test_every_point_replays_to_itself() -> None:
    spec = _spec()
    space = DefineByRunSpace(spec)
    for plan in space.candidates():
        params, distributions = space.replay(plan)
        assert set(params) == set(distributions)
        study = optuna.create_study()
        study.enqueue_trial(params)
        assert candidate_key(space.sample(study.ask())) == candidate_key(plan)


def test_baselines_come_first_then_the_sampler() -> None:
    searcher = _searcher(_spec())
    first, second, third = (TrialPlan.from_config(searcher.suggest(f"t{i}")) for i in range(3))
    assert (first.kind, second.kind, third.kind) == (BASELINE_PLAIN, BASELINE_AUTO, "search")
    assert first.candidate.nccl_env == {} and second.candidate.nccl_env == {}
    assert not first.speculative and second.candidate.speculative.is_auto


def test_same_seed_same_proposals_other_seed_other_proposals() -> None:
    def proposals(seed: int) -> list[str]:
        # a space large enough that the sampler, not the opening, makes the later proposals
        searcher = _searcher(_spec(speculative={"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1, 2, 4],
                                                "num_draft_tokens": [4, 6, 8, 12]}), seed=seed)
        out = []
        for i in range(12):
            config = searcher.suggest(f"t{i}")
            out.append(candidate_key(TrialPlan.from_config(config)))
            searcher.on_trial_complete(f"t{i}", {"final": True, "status": "ok", OBJECTIVE_KEY: float(i)})
        return out

    assert proposals(5) == proposals(5)
    assert proposals(5) != proposals(6)


def test_no_configuration_runs_twice_and_the_space_ends() -> None:
    spec = _spec(speculative={"num_steps": [2], "eagle_topk": [1]})  # 1 triple x 2 NCCL = 2 points
    searcher = _searcher(spec)
    keys = []
    for i in range(10):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        keys.append(candidate_key(TrialPlan.from_config(config)))
        searcher.on_trial_complete(f"t{i}", {"final": True, "status": "ok", OBJECTIVE_KEY: 1.0 + i})
    assert len(keys) == len(set(keys)) == 2 + 2  # two baselines, then both points, then FINISHED


def _told(searcher: SweepSearcher) -> list[optuna.trial.FrozenTrial]:
    return [t for t in searcher.study.get_trials(deepcopy=False) if t.state != TrialState.RUNNING]


@pytest.mark.parametrize(
    ("result", "error", "state"),
    [
        ({"final": True, "status": "failed", "reason": "engine_died"}, False, TrialState.FAIL),
        ({}, True, TrialState.FAIL),
        ({OBJECTIVE_KEY: 90.0, "repetition": 0}, False, TrialState.PRUNED),  # ASHA stopped it: no final report
        ({"final": True, "status": "ok", OBJECTIVE_KEY: 120.0}, False, TrialState.COMPLETE),
    ],
)
def test_what_a_trial_end_tells_the_sampler(result: dict, error: bool, state: TrialState) -> None:
    searcher = _searcher(_spec())
    for i in range(2):  # the baselines
        searcher.suggest(f"b{i}")
    searcher.suggest("t")
    if OBJECTIVE_KEY in result and not result.get("final"):
        searcher.on_trial_result("t", {**result, OBJECTIVE_REPETITION_KEY: 1})
    searcher.on_trial_complete("t", result, error=error)
    (told,) = _told(searcher)
    assert told.state == state
    if state == TrialState.COMPLETE:
        assert told.value == 120.0


def test_an_slo_violation_is_a_constraint_not_a_worse_value() -> None:
    searcher = _searcher(_spec(), slo=True)
    for i in range(2):
        searcher.suggest(f"b{i}")
    searcher.suggest("t")
    searcher.on_trial_complete("t", {"final": True, "status": "infeasible", OBJECTIVE_KEY: 150.0,
                                     "slo_violation": 0.25})
    (told,) = _told(searcher)
    assert told.state == TrialState.COMPLETE and told.value == 150.0
    assert told.system_attrs["constraints:slo"] == 0.25


def test_the_auto_baseline_informs_the_sampler_the_plain_one_cannot() -> None:
    searcher = _searcher(_spec())
    searcher.suggest("plain")
    searcher.suggest("auto")
    searcher.on_trial_complete("plain", {"final": True, "status": "ok", OBJECTIVE_KEY: 50.0})
    searcher.on_trial_complete("auto", {"final": True, "status": "ok", OBJECTIVE_KEY: 100.0})
    (told,) = _told(searcher)  # speculation off is not a point of the space
    assert told.value == 100.0 and told.params["speculative"] == "auto"


# --- listed triples and NCCL presets ----------------------------------------------------------------


def _listed_spec(**search) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t",
        "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
        "search": {
            "speculative": {"triples": [[3, 1, 4], [5, 4, 8], [2, 2, 4]], "include_auto": True},
            "nccl_presets": [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}, {"NCCL_ALGO": "Tree"}],
            **search,
        },
    })


def test_listed_triples_and_presets_are_sampled_exactly() -> None:
    spec = _listed_spec()
    seen, study = _sample_randomly(spec, trials=300, seed=3)
    assert len(seen) == len(spec.space()) == 4 * 3  # (3 triples + auto) x 3 presets, nothing else
    # one categorical each, over the listed points
    assert set(study.trials[0].distributions) <= {"speculative", "speculative_triple", "nccl_preset"}


def test_every_listed_point_replays_to_itself() -> None:
    space = DefineByRunSpace(_listed_spec())
    for plan in space.candidates():
        params, _ = space.replay(plan)
        study = optuna.create_study()
        study.enqueue_trial(params)
        assert candidate_key(space.sample(study.ask())) == candidate_key(plan)


# --- the staged search ----------------------------------------------------------------------------


def _run(searcher: SweepSearcher, values, n: int) -> list[TrialPlan]:
    """Drive the searcher as Ray Tune does for n trials; ``values(plan)`` is each trial's objective."""
    plans = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        plan = TrialPlan.from_config(config)
        plans.append(plan)
        searcher.on_trial_complete(f"t{i}", {"final": True, "status": "ok", OBJECTIVE_KEY: values(plan)})
    return plans


def _throughput(plan: TrialPlan) -> float:
    """A made-up objective: longer chains are better, any forced NCCL setting costs 5%."""
    triple = plan.candidate.speculative
    base = 100.0 if triple.is_auto or not plan.speculative else 50.0 + 20.0 * triple.num_steps / triple.eagle_topk
    return base * (0.95 if plan.candidate.nccl_env else 1.0)


def test_rules_of_thumb_come_right_after_the_baselines() -> None:
    spec = _spec(speculative={"num_steps": [1, 2, 3, 4, 5], "eagle_topk": [1, 2, 4], "num_draft_tokens": [4, 6, 8]})
    plans = _run(_searcher(spec), _throughput, 7)
    assert [p.kind for p in plans[:2]] == [BASELINE_PLAIN, BASELINE_AUTO]
    # SGLang's auto choice for DeepSeek (3, 1, 4), the longest chain (its histogram answers for the shorter
    # ones), the NCCL setting at SGLang's chain, the shortest chain that runs the others' kernels (the cycle
    # line's other end: 2 steps, since SGLang on GPUs runs one draft step in another graph), then the
    # Llama rule (5, 4, 8) with NCCL's defaults
    assert [p.label() for p in plans[2:7]] == ["steps=3 topk=1 draft=4", "steps=5 topk=1 draft=6",
                                               "steps=3 topk=1 draft=4 NCCL_ALGO=Ring", "steps=2 topk=1 draft=3",
                                               "steps=5 topk=4 draft=8"]
    assert all(p.candidate.all_reduce == "default" for p in plans[2:7])


def test_rules_of_thumb_are_taken_to_the_nearest_point_of_the_space() -> None:
    space = DefineByRunSpace(_spec(speculative={"num_steps": [2, 6], "eagle_topk": [1, 2], "num_draft_tokens": [3, 6]}))
    assert [p.candidate.speculative.label() for p in space.starting_points()] == [
        "steps=2 topk=1 draft=3", "steps=6 topk=2 draft=6"]
    listed = DefineByRunSpace(_listed_spec())
    assert [p.candidate.speculative.label() for p in listed.starting_points()] == [
        "steps=3 topk=1 draft=4", "steps=5 topk=4 draft=8"]


def test_speculative_stage_holds_nccl_at_defaults_then_varies_one_factor_at_a_time() -> None:
    spec = _spec(speculative={"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 6]},
                 all_reduce=["default", "nccl"], nccl_env={"NCCL_ALGO": [None, "Ring", "Tree"]})
    searcher = _searcher(spec)
    settings = DefineByRunSpace(spec).setting_points()
    stage = searcher.speculative_stage
    assert stage == 9 + len(DefineByRunSpace(spec).opening()) - 2  # 0.4 x 22 points, rounded up; the opening
    plans = _run(searcher, _throughput, 2 + stage + 3)
    # right after SGLang's chain and the longest chain: one start per all-reduce path and NCCL setting there
    assert [p.candidate for p in plans[4:4 + len(settings)]] == [p.candidate for p in settings]
    assert sorted((p.candidate.all_reduce, tuple(p.candidate.nccl_env.items())) for p in settings) == [
        ("nccl", ()), ("nccl", (("NCCL_ALGO", "Ring"),)), ("nccl", (("NCCL_ALGO", "Tree"),))]
    assert {p.candidate.speculative for p in settings} == {plans[2].candidate.speculative}
    speculative_stage = plans[2:4] + plans[4 + len(settings):2 + stage]
    assert all(p.candidate.nccl_env == {} and p.candidate.all_reduce == "default" for p in speculative_stage)
    best = max(plans[:2 + stage], key=_throughput).candidate.speculative
    variants = plans[2 + stage:2 + stage + 3]
    assert all(p.candidate.speculative == best for p in variants)
    assert sorted((p.candidate.all_reduce, tuple(p.candidate.nccl_env.items())) for p in variants) == [
        ("default", (("NCCL_ALGO", "Ring"),)), ("default", (("NCCL_ALGO", "Tree"),)), ("nccl", ())]


def test_no_stages_when_only_the_speculative_numbers_vary() -> None:
    spec = _spec(nccl_env={})
    searcher = _searcher(spec)
    assert searcher.speculative_stage == 0 and DefineByRunSpace(spec).variants(
        TrialPlan("search", next(iter(spec.space())))) == []


def test_the_staged_search_still_measures_every_point_once_then_finishes() -> None:
    spec = _listed_spec()
    plans = _run(_searcher(spec), _throughput, 100)
    keys = [candidate_key(p) for p in plans]
    assert len(keys) == len(set(keys)) == 1 + len(spec.space())  # no speculation + every point, then FINISHED


def test_one_factor_variants_start_from_a_point_of_the_space_even_when_a_baseline_won() -> None:
    # SGLang's auto choice is not a point here (include_auto false): its NCCL variants are not either
    spec = _spec(speculative={"num_steps": [1, 2, 3], "eagle_topk": [1]})
    searcher = _searcher(spec)
    searcher.speculative_stage = 2

    def auto_wins(plan: TrialPlan) -> float:
        return 1000.0 if plan.kind == BASELINE_AUTO else _throughput(plan)

    plans = _run(searcher, auto_wins, 7)
    assert all(p.candidate in spec.space() for p in plans[2:])
    # the NCCL variant is of the best *point* measured (here also SGLang's chain, measured with it early)
    ring = [p for p in plans if p.candidate.nccl_env == {"NCCL_ALGO": "Ring"}]
    searched = [p for p in plans[2:] if not p.candidate.nccl_env]
    assert ring and ring[0].candidate.speculative == max(searched, key=_throughput).candidate.speculative


def test_after_the_variants_every_other_proposal_keeps_the_best_settings() -> None:
    spec = _spec(speculative={"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 6]},
                 all_reduce=["default", "nccl"], nccl_env={"NCCL_ALGO": [None, "Ring", "Tree"]})
    searcher = _searcher(spec)
    stage = searcher.speculative_stage
    plans = _run(searcher, _throughput, 2 + stage + 3 + 8)
    after = list(enumerate(plans[2 + stage + 3:], start=stage + 3))  # (proposal number, plan)
    pinned = [p for number, p in after if number % 2 == 0]
    # the best settings are NCCL's defaults and the custom path (_throughput: any forced setting costs 5%)
    assert len(pinned) == 4 and all(p.candidate.nccl_env == {} and p.candidate.all_reduce == "default" for p in pinned)
    keys = [candidate_key(p) for p in plans]
    assert len(keys) == len(set(keys))


def test_a_preset_trial_records_every_listed_variable_by_name() -> None:
    """MLflow's params and the report's NCCL effects key on the variable names: with
    ``search.nccl_presets`` they must be the presets' variables, 'default' where a preset leaves one unset."""
    from orchestrator.sweep.execution.trial import _params

    spec = _listed_spec()
    by_env = {tuple(sorted(p.candidate.nccl_env.items())): p for p in DefineByRunSpace(spec).candidates()}
    tree = _params(by_env[(("NCCL_ALGO", "Tree"),)], spec)
    assert tree["NCCL_ALGO"] == "Tree" and tree["NCCL_PROTO"] == "default"
    defaults = _params(by_env[()], spec)
    assert defaults["NCCL_ALGO"] == defaults["NCCL_PROTO"] == "default"


# --- small spaces: enumerated, not sampled -----------------------------------------------------------


def _budgeted(spec: SweepSpec, budget: int) -> SweepSearcher:
    return SweepSearcher(space=DefineByRunSpace(spec), mode="max", seed=0, slo=False, budget=budget)


def test_a_budget_that_covers_the_space_enumerates_it_visiting_each_point_once() -> None:
    spec = _listed_spec()  # (3 triples + auto) x 3 presets: 12 points, 13 configurations with no speculation
    searcher = _budgeted(spec, budget=20)
    assert searcher.enumerating and not _budgeted(spec, budget=4).enumerating
    plans = _run(searcher, _throughput, 20)
    keys = [candidate_key(p) for p in plans]
    assert len(keys) == len(set(keys)) == 1 + len(spec.space())  # every configuration once, then FINISHED
    # the opening first (after the baselines): SGLang's chain (also the longest), its presets, the Llama rule
    assert [p.label() for p in plans[2:6]] == [
        "steps=3 topk=1 draft=4", "steps=3 topk=1 draft=4 NCCL_ALGO=Ring NCCL_PROTO=LL",
        "steps=3 topk=1 draft=4 NCCL_ALGO=Tree", "steps=5 topk=4 draft=8"]


def test_enumeration_alternates_a_step_from_the_best_and_the_farthest_point() -> None:
    spec = _spec(speculative={"num_steps": list(range(1, 11)), "eagle_topk": [1]}, nccl_env={})
    space = DefineByRunSpace(spec)
    plans = _run(_budgeted(spec, budget=12), _throughput, 8)
    steps = [p.candidate.speculative.num_steps for p in plans[2:7]]
    # the opening: SGLang's chain (3 steps), the longest chain (10), the shortest that runs the others' kernels
    # (2: SGLang on GPUs), the chain nearest 5-4-8 (5); then, longer chains being better, the unmeasured point
    # nearest the best (10 steps): 9 ...
    assert steps == [3, 10, 2, 5, 9]
    measured = [p.candidate for p in plans[:7] if p.speculative]
    farthest = max((p for p in space.candidates() if p.candidate not in measured),
                   key=lambda p: min(space.distance(p.candidate, c) for c in measured))
    assert plans[7].candidate == farthest.candidate  # ... then the point farthest from everything measured
    assert farthest.candidate.speculative.num_steps == 1  # steps are scaled by their logs: 1 lies far from 2 and 3


def test_a_distance_counts_every_changed_setting_as_one_whole_range() -> None:
    space = DefineByRunSpace(_spec(speculative={"num_steps": [1, 4], "eagle_topk": [1]}))
    chain_1, chain_4 = (c for c in space._space if not c.speculative.is_auto and not c.nccl_env)
    # steps 1 -> 4 and the chain's draft 2 -> 5 each span their whole range: 1 each, Euclidean
    assert space.distance(chain_1, chain_4) == pytest.approx(2 ** 0.5)
    ring = next(c for c in space._space if c.nccl_env and c.speculative == chain_1.speculative)
    assert space.distance(chain_1, ring) == 1.0


def test_a_saved_searcher_restored_proposes_what_it_would_have_proposed(tmp_path) -> None:
    """``save``/``restore`` (what Tune's experiment state and ``Tuner.restore`` call) keep the study,
    the stages and the measured points: the resumed sweep goes on as if it had never stopped."""
    spec = _spec()

    def drive(searcher: SweepSearcher, numbers: range) -> list[str]:
        keys = []
        for i in numbers:
            keys.append(candidate_key(TrialPlan.from_config(searcher.suggest(f"t{i}"))))
            searcher.on_trial_complete(f"t{i}", {"final": True, "status": "ok", OBJECTIVE_KEY: float(i % 5)})
        return keys

    expected = drive(_searcher(spec, seed=3), range(12))
    first = _searcher(spec, seed=3)
    head = drive(first, range(6))
    first.save(str(tmp_path / "searcher.pkl"))
    resumed = _searcher(spec, seed=99)  # whatever it was built with, the saved state wins
    resumed.restore(str(tmp_path / "searcher.pkl"))
    assert head + drive(resumed, range(6, 12)) == expected
    assert all(t.state != TrialState.RUNNING for t in resumed.study.trials), "every asked trial was told"
