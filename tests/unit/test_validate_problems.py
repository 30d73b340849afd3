"""One formatter for pydantic's errors (orchestrator.validation): the user's path, one problem per
field, union arms collapsed, values quoted short."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec
from orchestrator.validation import short_repr, validation_problems
from serving.engine.config import EngineConfig

from helpers.spec_cases import with_


def _problems(**fields) -> list[str]:
    with pytest.raises(ValidationError) as excinfo:
        EngineConfig(kind="sglang", model_path="m", **fields)
    return [str(p) for p in validation_problems(excinfo.value, model=EngineConfig)]


def test_a_value_no_union_arm_accepts_is_one_problem_listing_the_arms() -> None:
    assert _problems(extra_args={"mem_fraction_static": {"a": 1}}) == [
        "extra_args.mem_fraction_static: got {'a': 1} (a mapping); expected true or false, an integer, a number, "
        "a string or a list"
    ]


def test_a_bad_item_inside_a_union_arm_is_reported_at_the_value() -> None:
    (problem,) = _problems(extra_args={"x": [[1]]})
    assert problem == ("extra_args.x: got [[1]] (a list); expected true or false, an integer, a number, a string or "
                       "a list")


def test_unknown_key_suggests_the_close_one_for_the_given_model() -> None:
    (problem,) = _problems(tp_sise=2)
    assert problem.startswith("tp_sise: unknown key (did you mean 'tp_size'?); allowed here: kind, model_path")


def test_quoted_values_are_cut_short() -> None:
    (problem,) = _problems(tp_size="8" * 10_000)
    assert len(problem) < 200 and "..." in problem


def test_an_integer_too_long_to_print_is_still_a_spec_error() -> None:
    """repr() of a 5000-digit int raises ValueError; the formatter must not."""
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_dict(with_("engine.tp_size", 10**5000))
    (problem,) = excinfo.value.problems
    assert problem.field == "engine.tp_size"
    assert "expected an integer in [1, 64]" in problem.message and "too large to show" in problem.message


def test_short_repr_survives_cycles_and_depth() -> None:
    cyclic: list = []
    cyclic.append(cyclic)
    assert short_repr(cyclic) == "[[[[...]]]]"  # maxlevel 3, then "..."
    assert short_repr([10**5000]) == "<a list too large to show>"


def test_a_key_that_is_not_a_string_is_named_plainly() -> None:
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_dict(with_("search.nccl_env", {1: [None, "Ring"]}))
    assert [str(p) for p in excinfo.value.problems] == ["search.nccl_env.1: keys must be strings, got 1"]


def test_a_retired_setting_says_why_it_went_instead_of_unknown_key() -> None:
    """An old spec that still sets the removed chain gate's switch is told what happened to it."""
    with pytest.raises(ValidationError) as excinfo:
        SweepSpec.model_validate({"name": "x", "engine": {"kind": "reference", "model_path": "ref-tiny",
                                                          "speculative_algorithm": None},
                                  "search": {"skip_predicted_chains": True}})
    (problem,) = [str(p) for p in validation_problems(excinfo.value, model=SweepSpec)]
    assert problem.startswith("search.skip_predicted_chains: no longer a setting: the chain gate was removed")
    assert problem.endswith("delete the line")
