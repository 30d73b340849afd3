"""The search space: exactly the valid configurations, counted by hand."""

from __future__ import annotations

from orchestrator.space import count_candidates, iter_candidates, speculative_triples
from orchestrator.spec import SpeculativeSearch, SweepSpec


def test_triples_follow_sglang_rules() -> None:
    search = SpeculativeSearch(num_steps=[1, 3], eagle_topk=[1, 2], num_draft_tokens=[2, 4, 11, 12])
    got = {(t.num_steps, t.eagle_topk, t.num_draft_tokens) for t in speculative_triples(search)}
    # topk 1: draft = steps + 1 -> (1,1,2), (3,1,4)
    # steps 1, topk 2: capacity 2 -> draft <= 3 -> (1,2,2)
    # steps 3, topk 2: capacity 2 + 2*4 = 10 -> draft <= 11 -> (3,2,2), (3,2,4), (3,2,11)
    assert got == {(1, 1, 2), (3, 1, 4), (1, 2, 2), (3, 2, 2), (3, 2, 4), (3, 2, 11)}


def test_auto_is_one_more_point() -> None:
    search = SpeculativeSearch(num_steps=2, include_auto=True)
    labels = [t.label() for t in speculative_triples(search)]
    assert labels == ["auto", "steps=2 topk=1 draft=3"]


def test_count_matches_enumeration_and_hand_count() -> None:
    spec = SweepSpec.from_dict(
        {
            "name": "t",
            "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
            "search": {
                "speculative": {"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 11, 12]},
                "all_reduce": ["custom", "nccl"],
                "nccl_env": {"NCCL_ALGO": [None, "Ring", "Tree"], "NCCL_PROTO": [None, "LL"]},
            },
        }
    )
    candidates = list(iter_candidates(spec))
    assert count_candidates(spec) == len(candidates) == 6 * 2 * 3 * 2
    assert len(set(candidates)) == len(candidates)
    # "default" means unset: the default point carries no NCCL variable at all.
    assert any(c.nccl_env == {} for c in candidates)
    assert all(c.nccl_env.get("NCCL_PROTO") in (None, "LL") for c in candidates)


def test_non_speculative_spec_has_one_speculative_point() -> None:
    spec = SweepSpec.from_dict(
        {"name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "speculative_algorithm": None}}
    )
    assert count_candidates(spec) == 1
    (only,) = iter_candidates(spec)
    assert only.speculative.is_auto
