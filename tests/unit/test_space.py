"""The search space: exactly the valid configurations, counted by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.space import (
    AUTO,
    Candidate,
    SearchSpace,
    SpeculativeList,
    SpeculativeSpace,
    SpeculativeTriple,
    count_candidates,
    iter_candidates,
    space_problems,
    speculative_triples,
)
from orchestrator.spec import SweepSpec
from orchestrator.spec_search import SpeculativeSpec
from serving.speculative_rules import speculative_problem

from helpers.spec_cases import BASE


def test_triples_follow_sglang_rules() -> None:
    search = SpeculativeSpec(num_steps=[1, 3], eagle_topk=[1, 2], num_draft_tokens=[2, 4, 11, 12])
    got = {(t.num_steps, t.eagle_topk, t.num_draft_tokens) for t in speculative_triples(search)}
    # topk 1: draft = steps + 1 -> (1,1,2), (3,1,4)
    # steps 1, topk 2: capacity 2 -> draft <= 3 -> (1,2,2)
    # steps 3, topk 2: capacity 2 + 2*4 = 10 -> draft <= 11 -> (3,2,2), (3,2,4), (3,2,11)
    assert got == {(1, 1, 2), (3, 1, 4), (1, 2, 2), (3, 2, 2), (3, 2, 4), (3, 2, 11)}


def test_auto_is_one_more_point() -> None:
    search = SpeculativeSpec(num_steps=2, include_auto=True)
    labels = [t.label() for t in speculative_triples(search)]
    assert labels == ["auto", "steps=2 topk=1 draft=3"]


def test_count_matches_enumeration_and_hand_count() -> None:
    spec = SweepSpec.from_dict(
        {
            "name": "t",
            "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
            "search": {
                "speculative": {"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 11, 12]},
                "all_reduce": ["default", "nccl"],
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


# --- counting without listing ------------------------------------------------------------------


def test_draft_choices_are_what_the_tree_holds_by_hand() -> None:
    space = SpeculativeSpace(num_steps=(1, 2, 5), eagle_topk=(1, 2, 4), num_draft_tokens=(4, 6, 8, 12, 16))
    assert space.draft_choices(num_steps=5, eagle_topk=1) == (6,)  # chain: steps + 1
    assert space.draft_choices(num_steps=1, eagle_topk=2) == ()  # tree of 2 holds 2: draft <= 3
    assert space.draft_choices(num_steps=2, eagle_topk=2) == (4, 6)  # 2 + 1*4 = 6: draft <= 7
    assert space.draft_choices(num_steps=1, eagle_topk=4) == (4,)  # 4: draft <= 5
    assert space.topk_choices(num_steps=1) == (1, 4)
    assert space.steps_choices() == (1, 2, 5)


def test_kimi_sized_space_counted_by_hand() -> None:
    # The shipped Kimi spec's speculative search: steps 1-5, topk {1, 2, 4}, drafts {4, 6, 8, 12, 16}.
    # topk 1: 5 chains. topk 2 (capacity 2, 6, 10, 14, 18 -> drafts <= 3, 7, 11, 15, 19): 0+2+3+4+5 = 14.
    # topk 4 (capacity 4, 20, 36, ...): 1+5+5+5+5 = 21. Plus auto: 41.
    space = SpeculativeSpace(
        num_steps=(1, 2, 3, 4, 5), eagle_topk=(1, 2, 4), num_draft_tokens=(4, 6, 8, 12, 16), include_auto=True
    )
    assert len(space) == 41
    assert len(list(space)) == 41


def test_the_largest_space_is_listed_and_counted_as_the_closed_form() -> None:
    """Every value the bounds allow (SGLang-sized), counted as the capacity formula says."""
    steps, topks, drafts = range(1, 17), range(1, 17), range(2, 65)
    space = SpeculativeSpace(num_steps=tuple(steps), eagle_topk=tuple(topks), num_draft_tokens=tuple(drafts))
    # Closed form from SGLang's rule: top-k 1 is one chain per step count; for k > 1 the drafts
    # 2..min(k + (s-1)k^2 + 1, 64) are valid, i.e. min(k + (s-1)k^2, 63) of them.
    closed = 16 + sum(min(k + (s - 1) * k * k, 63) for s in steps for k in topks if k > 1)
    assert len(space) == closed == len(set(space))
    assert list(space_problems(SearchSpace(speculative=space))) == []


def test_nccl_product_is_counted_and_refused_beyond_the_bound() -> None:
    many = tuple([None, *map(str, range(1, 65))])  # 65 choices each
    space = SearchSpace(
        speculative=SpeculativeSpace(num_steps=(1, 2), eagle_topk=(1,)),
        all_reduce=("default", "nccl"),
        nccl_env={"NCCL_MIN_NCHANNELS": many, "NCCL_MAX_NCHANNELS": many, "NCCL_MIN_CTAS": many},
    )
    assert len(space) == 2 * 2 * 65**3 == 1_098_500
    (problem,) = space_problems(space)
    assert problem.startswith(
        "search: 1,098,500 configurations (speculative 2 x all_reduce 2 x NCCL_MAX_NCHANNELS 65 x "
        "NCCL_MIN_CTAS 65 x NCCL_MIN_NCHANNELS 65)"
    )
    assert "narrow the largest dimension, NCCL_MAX_NCHANNELS" in problem


def test_empty_speculative_space_is_a_problem() -> None:
    space = SearchSpace(speculative=SpeculativeSpace(num_steps=(1,), eagle_topk=(2,), num_draft_tokens=(8,)))
    assert len(space) == 0
    (problem,) = space_problems(space)
    assert problem.startswith("search.speculative: no combination")


def test_membership() -> None:
    space = SearchSpace(
        speculative=SpeculativeSpace(num_steps=(2, 3), eagle_topk=(1, 2), num_draft_tokens=(4, 8)),
        all_reduce=("default",),
        nccl_env={"NCCL_ALGO": (None, "Ring")},
    )
    listed = set(space)
    assert len(listed) == len(space)
    assert all(c in space for c in listed)
    outside = [
        Candidate(SpeculativeTriple(2, 2, 8)),  # capacity 6: draft <= 7
        Candidate(SpeculativeTriple(3, 1, 5)),  # chain of 3 takes 4 draft tokens
        Candidate(AUTO),  # auto not asked for
        Candidate(SpeculativeTriple(3, 2, 8), "nccl"),
        Candidate(SpeculativeTriple(3, 2, 8), nccl_env={"NCCL_ALGO": "Tree"}),
        Candidate(SpeculativeTriple(3, 2, 8), nccl_env={"NCCL_PROTO": "LL"}),
    ]
    assert [c in space for c in outside] == [False] * len(outside)
    assert Candidate(SpeculativeTriple(3, 2, 8), nccl_env={"NCCL_ALGO": "Ring"}) in space


def test_a_space_made_by_hand_must_be_sorted_and_bounded() -> None:
    with pytest.raises(ValueError, match="sorted"):
        SpeculativeSpace(num_steps=(3, 1), eagle_topk=(1,))
    with pytest.raises(ValueError, match=r"\[1, 16\]"):
        SpeculativeSpace(num_steps=(1, 17), eagle_topk=(1,))


def _values(low: int, high: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(low, high), max_size=6, unique=True).map(lambda v: tuple(sorted(v)))


@settings(max_examples=60, deadline=None)
@given(
    steps=_values(1, 16),
    topks=_values(1, 16),
    drafts=_values(2, 64),
    auto=st.booleans(),
    probe=st.tuples(st.integers(1, 16), st.integers(1, 16), st.integers(2, 64)),
)
def test_space_agrees_with_sglang_rules_by_brute_force(steps, topks, drafts, auto, probe) -> None:
    """Count, order, membership and the define-by-run choices all equal a brute force over the
    rule itself (serving.speculative_rules.speculative_problem)."""
    space = SpeculativeSpace(num_steps=steps, eagle_topk=topks, num_draft_tokens=drafts, include_auto=auto)
    brute = [SpeculativeTriple(None, None, None)] if auto else []
    for s in steps:
        for k in topks:
            for d in (s + 1,) if k == 1 else drafts:
                if speculative_problem(num_steps=s, eagle_topk=k, num_draft_tokens=d) is None:
                    brute.append(SpeculativeTriple(s, k, d))
    assert list(space) == brute
    assert len(space) == len(brute)
    triple = SpeculativeTriple(*probe)
    assert (triple in space) == (triple in brute)
    assert set(space.steps_choices()) == {t.num_steps for t in brute if not t.is_auto}
    for s in space.steps_choices():
        assert set(space.topk_choices(num_steps=s)) == {t.eagle_topk for t in brute if t.num_steps == s}


# --- listed points: triples and NCCL presets ---------------------------------------------------


def test_listed_triples_count_iterate_and_belong_exactly() -> None:
    listed = SpeculativeList(
        triples=(SpeculativeTriple(5, 4, 8), SpeculativeTriple(3, 1, 4)), include_auto=True
    )
    assert len(listed) == 3
    assert list(listed) == [AUTO, SpeculativeTriple(5, 4, 8), SpeculativeTriple(3, 1, 4)]  # listed order
    assert SpeculativeTriple(3, 1, 4) in listed and AUTO in listed
    # valid by SGLang's rules, but not listed: not a point
    assert SpeculativeTriple(4, 1, 5) not in listed
    assert listed.values_used() == ([3, 5], [1, 4], [4, 8])
    assert AUTO not in SpeculativeList(triples=(SpeculativeTriple(3, 1, 4),))


def test_a_listed_triple_must_follow_sglang_rules() -> None:
    with pytest.raises(ValueError, match=r"steps=3 topk=1 draft=5.*chain"):
        SpeculativeList(triples=(SpeculativeTriple(3, 1, 5),))
    with pytest.raises(ValueError, match="repeated"):
        SpeculativeList(triples=(SpeculativeTriple(3, 1, 4), SpeculativeTriple(3, 1, 4)))
    with pytest.raises(ValueError, match="include_auto"):
        SpeculativeList(triples=(AUTO,))


def test_nccl_presets_are_one_dimension_of_exact_settings() -> None:
    presets = ({}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}, {"NCCL_ALGO": "Tree"})
    space = SearchSpace(
        speculative=SpeculativeList(triples=(SpeculativeTriple(3, 1, 4), SpeculativeTriple(5, 4, 8))),
        all_reduce=("default", "nccl"),
        nccl_presets=presets,
    )
    assert space.dimension_sizes() == {"speculative": 2, "all_reduce": 2, "nccl_presets": 3}
    listed = list(space)
    assert len(listed) == len(space) == 2 * 2 * 3 and len(set(listed)) == len(listed)
    assert [c.nccl_env for c in listed[:3]] == list(presets)  # the presets' order
    assert all(c in space for c in listed)
    # a mix of two presets is not one of them
    assert Candidate(SpeculativeTriple(3, 1, 4), nccl_env={"NCCL_ALGO": "Ring"}) not in space
    assert Candidate(SpeculativeTriple(3, 1, 4), nccl_env={"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}) not in space


def test_presets_and_a_per_variable_product_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="not both"):
        SearchSpace(nccl_env={"NCCL_ALGO": (None, "Ring")}, nccl_presets=({},))


def test_spec_triples_build_the_listed_space() -> None:
    search = SpeculativeSpec(triples=[[3, 1, 4], [5, 4, 8]], include_auto=True)
    assert isinstance(search.space(), SpeculativeList)
    labels = [t.label() for t in speculative_triples(search)]
    assert labels == ["auto", "steps=3 topk=1 draft=4", "steps=5 topk=4 draft=8"]


def test_a_point_is_the_engine_template_with_its_settings_applied() -> None:
    """The spec's engine section is the template (``EngineSpec.template``: SGLang's own numbers and
    all-reduce); a point applies its settings to it and leaves the rest as the template has it."""
    from orchestrator.spec import SweepSpec

    spec = SweepSpec.model_validate({**BASE, "engine": {**BASE["engine"], "env": {"NCCL_DEBUG": "WARN"}}})
    template = spec.engine.template()
    assert (template.speculative_num_steps, template.disable_custom_all_reduce) == (None, False)
    point = Candidate(SpeculativeTriple(3, 1, 4), "nccl", {"NCCL_ALGO": "Ring"})
    config = point.applied_to(template)
    assert (config.speculative_num_steps, config.speculative_eagle_topk, config.speculative_num_draft_tokens) == (3, 1, 4)
    assert config.disable_custom_all_reduce and config.enforce_disable_flashinfer_allreduce_fusion
    assert config.env == {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"}
    applied = {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "disable_custom_all_reduce", "enforce_disable_flashinfer_allreduce_fusion", "env"}
    assert config.model_dump(exclude=applied) == template.model_dump(exclude=applied)
    assert spec.engine_config(num_steps=3, eagle_topk=1, num_draft_tokens=4, all_reduce="nccl",
                              nccl_env={"NCCL_ALGO": "Ring"}) == config