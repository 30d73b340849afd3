"""The sweep's searcher: exact conditional space, baselines first, honest tells, seeded, no repeats."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.search import Searcher

from orchestrator.spec import SweepSpec
from orchestrator.sweep.search import (
    BASELINE_AUTO,
    BASELINE_PLAIN,
    OBJECTIVE_KEY,
    SweepSearch,
    SweepSpace,
    TrialPlan,
    candidate_key,
)

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


def _searcher(spec: SweepSpec, seed: int = 0, slo: bool = False) -> SweepSearch:
    return SweepSearch(space=SweepSpace(spec), mode="max", seed=seed, slo=slo)


def test_sampled_points_are_exactly_the_valid_ones() -> None:
    spec = _spec()
    space = SweepSpace(spec)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(400):
        trial = study.ask()
        plan = space.sample(trial)
        assert plan.candidate in spec.space(), plan
        seen.add(plan.candidate)
        study.tell(trial, 1.0)
    # 6 explicit triples + auto, x 2 NCCL choices (see test_space for the hand count)
    assert len(seen) == len(spec.space()) == 14


def test_top_k_one_is_a_chain_never_a_sampled_draft_count() -> None:
    space = SweepSpace(_spec())
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
    space = SweepSpace(spec)
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
        searcher = _searcher(_spec(), seed=seed)
        out = []
        for i in range(8):
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


def _told(searcher: SweepSearch) -> list[optuna.trial.FrozenTrial]:
    return [t for t in searcher._ot_study.get_trials(deepcopy=False) if t.state != TrialState.RUNNING]


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
        searcher.on_trial_result("t", {**result, "training_iteration": 1})
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
