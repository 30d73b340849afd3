"""SGLang's speculative rules and the EngineConfig model (hand-checked values)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

import serving.speculative_rules
from serving.engine.config import EngineConfig, speculative_problem, tree_capacity
from serving.errors import EngineConfigError


@pytest.mark.parametrize(
    ("steps", "topk", "capacity"),
    [(1, 1, 1), (3, 1, 3), (1, 4, 4), (2, 2, 6), (3, 2, 10), (5, 4, 68), (3, 8, 136)],
)
def test_tree_capacity(steps: int, topk: int, capacity: int) -> None:
    # topk + (steps - 1) * topk^2, e.g. (3, 2): 2 + 2 * 4 = 10
    assert tree_capacity(num_steps=steps, eagle_topk=topk) == capacity


@pytest.mark.parametrize(
    ("triple", "words"),
    [
        ((None, None, None), None),  # SGLang's auto choice
        ((3, 1, 4), None),
        ((3, 2, 11), None),  # 10 candidates + root
        ((5, 4, 8), None),
        ((3, None, None), "set all three"),
        ((None, 2, 6), "set all three"),
        ((3, 1, 5), r"must be speculative_num_steps \+ 1 = 4"),
        ((3, 2, 12), "holds 10"),
        ((1, 2, 4), "holds 2"),
        ((0, 1, 1), r"speculative_num_steps must be an integer in \[1, 16\], got 0"),
        ((3, 1, 10**30), r"speculative_num_draft_tokens must be an integer in \[2, 64\]"),
    ],
)
def test_speculative_problem(triple: tuple, words: str | None) -> None:
    steps, topk, draft = triple
    problem = speculative_problem(num_steps=steps, eagle_topk=topk, num_draft_tokens=draft)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and re.search(words, problem), problem


def make(**overrides) -> EngineConfig:
    fields = dict(
        kind="sglang",
        model_path="org/m",
        tp_size=2,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path="org/d",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    fields.update(overrides)
    return EngineConfig(**fields)


def test_valid_config_and_flag_names_are_normalised() -> None:
    config = make(extra_args={"--mem-fraction-static": 0.8, "trust-remote-code": True}, env={"NCCL_ALGO": "ring"})
    assert config.extra_args == {"mem_fraction_static": 0.8, "trust_remote_code": True}
    assert config.env == {"NCCL_ALGO": "Ring"}
    assert config.speculative


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"speculative_num_draft_tokens": 6}, "chain"),
        ({"speculative_num_steps": None}, "set all three"),
        ({"speculative_draft_model_path": None}, "needs speculative_draft_model_path"),
        ({"speculative_algorithm": None}, "speculative_algorithm is not"),
        ({"extra_args": {"tp": 4}}, "tp_size"),
        ({"extra_args": {"port": 1234}}, "chosen at launch"),
        ({"env": {"NCCL_PROTO": "LL129"}}, "unknown token"),
        ({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}, "overwrites"),
        ({"env": {"NCCL_ALGO": True}}, "string or number"),
        ({"tp_size": 0}, "greater than or equal to 1"),
        ({"unknown_field": 1}, "Extra inputs"),
    ],
)
def test_invalid_engine_config(overrides: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        make(**overrides)


def test_non_speculative_config() -> None:
    config = EngineConfig(kind="reference", model_path="ref-tiny")
    assert not config.speculative and config.tp_size == 1


def test_speculative_rules_are_the_shared_ones() -> None:
    # One copy of SGLang's rules: the engine model re-exports the shared module's functions.
    assert speculative_problem is serving.speculative_rules.speculative_problem
    assert tree_capacity is serving.speculative_rules.tree_capacity


@pytest.mark.parametrize(
    ("field", "allowed"),
    [
        ("speculative_num_steps", "[1, 16]"),
        ("speculative_eagle_topk", "[1, 16]"),
        ("speculative_num_draft_tokens", "[2, 64]"),
    ],
)
def test_absurd_speculative_numbers_are_refused_with_the_allowed_range(field: str, allowed: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(**{field: 10**30})
    assert f"{field} must be an integer in {allowed}, got {10**30}" in str(info.value)
    # raised as the engine's own error class, which pydantic reports as this model's error
    (error,) = info.value.errors()
    assert isinstance(error["ctx"]["error"], EngineConfigError)
