"""Every spec that validates survives its own dump: ``model_validate(model_dump()) == spec``.

A trial re-validates the spec it is handed as ``spec.model_dump()`` (plain data crossing to a Ray
worker), so a form that validates from YAML but not from its dump passes ``spectune validate``
and then fails every trial (listed triples once did). The shipped specs are checked, and a
hypothesis property generates specs over every form of the speculative and NCCL sections.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))


def _same_after_dump(spec: SweepSpec) -> None:
    again = SweepSpec.model_validate(spec.model_dump())
    assert again == spec
    assert SweepSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_specs_survive_their_dump(path: Path) -> None:
    _same_after_dump(SweepSpec.from_yaml(path))


def test_listed_triples_survive_their_dump() -> None:
    spec = SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "search": {"speculative": {"triples": [[3, 2, 10], [3, 1, 4]], "include_auto": True}},
    })
    dumped = spec.model_dump()["search"]["speculative"]
    assert dumped == {"triples": [[3, 2, 10], [3, 1, 4]], "include_auto": True}
    _same_after_dump(spec)


_ints = st.integers(min_value=1, max_value=6)
_dimension = st.one_of(
    _ints,
    st.lists(_ints, min_size=1, max_size=4, unique=True),
    st.tuples(_ints, _ints).map(lambda ab: {"low": min(ab), "high": max(ab)}),
)
_speculative = st.one_of(
    st.fixed_dictionaries({"num_steps": _dimension}, optional={"include_auto": st.booleans()}),
    st.fixed_dictionaries(
        {"num_steps": _dimension, "eagle_topk": st.sampled_from([[1, 2], [2], 2, {"low": 1, "high": 2}]),
         "num_draft_tokens": st.sampled_from([[4, 6], 4, {"low": 3, "high": 6}])},
        optional={"include_auto": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"triples": st.lists(st.sampled_from([[3, 1, 4], [2, 1, 3], [3, 2, 6], [5, 4, 8], [1, 1, 2]]),
                             min_size=1, max_size=4, unique_by=tuple)},
        optional={"include_auto": st.booleans()},
    ),
)
_nccl = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"nccl_env": st.fixed_dictionaries(
        {}, optional={"NCCL_ALGO": st.sampled_from([[None, "Ring"], ["default", "Tree", "Ring"]]),
                      "NCCL_PROTO": st.sampled_from([["default", "LL"], [None, "Simple"]])})}),
    st.fixed_dictionaries({"nccl_presets": st.sampled_from([
        [{}], [{}, {"NCCL_ALGO": "Ring"}], [{}, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}, {"NCCL_PROTO": None,
                                                                                           "NCCL_ALGO": "Ring"}]])}),
)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(speculative=_speculative, nccl=_nccl, all_reduce=st.sampled_from([["default"], ["default", "nccl"], ["nccl"], ["default", "no_fusion", "nccl"]]),
       levels=st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=3, unique=True))
def test_every_spec_form_that_validates_survives_its_dump(speculative, nccl, all_reduce, levels) -> None:
    data = {
        "name": "gen",
        "engine": {"kind": "sglang", "model_path": "org/model", "draft_model_path": "org/draft", "tp_size": 2},
        "search": {"speculative": speculative, "all_reduce": all_reduce, **nccl},
        "benchmark": {"concurrency": levels},
    }
    try:
        spec = SweepSpec.from_dict(data)
    except SpecError:
        return  # not a valid spec (e.g. an empty space): nothing to round-trip
    _same_after_dump(spec)
