"""Request validation: nothing the HTTP side accepts may fail later in a TP worker.

A value that fails in a worker (a seed torch cannot unpack, a NaN temperature in the sampler)
takes the whole server down with every request in flight, so the checks live where requests
enter, in ``SamplingParams.from_request`` (one path for every route).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.reference.checks import SEED_MAX, SEED_MIN, check_finite, check_int, show
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import MAX_TOP_K, SamplingParams, target_probs
from serving.reference.scheduler import Request

OPENAI_NAMES = {"sampling_seed": "seed", "max_new_tokens": "max_tokens"}


def _escaped(text: str) -> str:
    return "".join("\\" + c if c in "()[].*+?^$|{}" else c for c in text)


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"temperature": 0.7, "sampling_seed": 2**64},
         "sampling_params.sampling_seed must be an integer in [-9223372036854775808, 18446744073709551615], "
         "got 18446744073709551616"),
        ({"sampling_seed": SEED_MIN - 1}, "sampling_params.sampling_seed must be an integer in ["),
        ({"temperature": math.nan}, "sampling_params.temperature must be a finite number, got nan"),
        ({"temperature": math.inf}, "sampling_params.temperature must be a finite number, got inf"),
        ({"temperature": 10**400}, "sampling_params.temperature must be a finite number"),
        ({"top_p": math.nan}, "sampling_params.top_p must be a finite number"),
        ({"min_p": -math.inf}, "sampling_params.min_p must be a finite number"),
        ({"max_new_tokens": math.inf}, "sampling_params.max_new_tokens must be an integer, got inf"),
        ({"max_new_tokens": math.nan}, "sampling_params.max_new_tokens must be an integer, got nan"),
        ({"top_k": 2**40}, f"sampling_params.top_k must be -1 (disable) or an integer in [1, {MAX_TOP_K}]"),
        ({"top_k": -2}, "sampling_params.top_k must be -1 (disable)"),
        ({"stop_token_ids": [5, -1]}, "sampling_params.stop_token_ids[1] must be an integer in [0, 2147483647], got -1"),
        ({"stop_token_ids": [2**70]}, "sampling_params.stop_token_ids[0] must be an integer in [0, 2147483647]"),
        ({"repetition_penalty": math.nan}, "sampling_params.repetition_penalty=nan is not supported"),
        ({"repetition_penalty": True}, "sampling_params.repetition_penalty=True is not supported"),
        ({"n": True}, "sampling_params.n=True is not supported"),
        ({"min_new_tokens": math.inf}, "sampling_params.min_new_tokens=inf is not supported"),
        ({"ignore_eos": 1}, "sampling_params.ignore_eos must be true or false, got 1"),
    ],
)
def test_values_a_worker_cannot_take_are_refused_naming_field_and_range(raw, needle) -> None:
    with pytest.raises(ValueError, match=_escaped(needle)):
        SamplingParams.from_request(raw)


def test_openai_fields_are_named_as_the_client_spelled_them() -> None:
    with pytest.raises(ValueError, match=r"^seed must be an integer in \[-9223372036854775808, 18446744073709551615\]"):
        SamplingParams.from_request({"sampling_seed": 2**64}, field="request", names=OPENAI_NAMES)
    with pytest.raises(ValueError, match=r"^max_tokens must be at least 0, got -5"):
        SamplingParams.from_request({"max_new_tokens": -5}, field="request", names=OPENAI_NAMES)
    with pytest.raises(ValueError, match=r"^request.temperature must be a finite number"):
        SamplingParams.from_request({"temperature": math.nan}, field="request", names=OPENAI_NAMES)


@pytest.mark.parametrize("seed", [SEED_MIN, -1, 0, SEED_MAX])
def test_every_accepted_seed_seeds_a_worker_generator(seed: int) -> None:
    params = SamplingParams.from_request({"temperature": 0.7, "sampling_seed": seed})
    request = Request.from_req(GenerateReq(rid="s", input_ids=(1,), params=params, seed=params.sampling_seed))
    assert request.generator is not None


def test_neutral_values_still_pass() -> None:
    params = SamplingParams.from_request(
        {"n": 1, "repetition_penalty": 1, "frequency_penalty": 0.0, "spaces_between_special_tokens": True,
         "max_new_tokens": 16.0, "top_k": -1, "stop_token_ids": [0, 2**31 - 1]}
    )
    assert params.max_new_tokens == 16 and isinstance(params.max_new_tokens, int)


def test_shared_checks_name_field_value_and_range() -> None:
    with pytest.raises(ValueError, match=r"^x must be an integer in \[1, 3\], got 4$"):
        check_int(4, name="x", low=1, high=3)
    with pytest.raises(ValueError, match=r"^x must be an integer, got True$"):
        check_int(True, name="x", low=0)
    with pytest.raises(ValueError, match=r"^x must be a finite number, got nan$"):
        check_finite(math.nan, name="x")
    assert len(show("y" * 10_000)) == 80
    assert "too large to print" in show(10**5000)


_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.0, 1.0, 1e-6, 5e-324, 1e308, 2**63, 2**64 - 1, 2**64]),
)
_VALUES = st.one_of(
    _NUMBERS,
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.lists(st.one_of(st.text(max_size=3), st.integers(-3, 300)), max_size=3),
)
_KEYS = st.sampled_from(
    ["max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
     "sampling_seed", "n", "repetition_penalty", "frequency_penalty", "min_new_tokens"]
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_whatever_is_accepted_samples_in_a_worker(raw) -> None:
    """Accepted parameters always seed a generator and give a finite, normalised distribution."""
    try:
        params = SamplingParams.from_request(raw)
    except ValueError:
        return
    seed = params.sampling_seed if params.sampling_seed is not None else 0
    request = Request.from_req(GenerateReq(rid="p", input_ids=(1,), params=params, seed=seed))
    if params.greedy:
        return
    assert request.generator is not None
    logits = torch.linspace(-8.0, 8.0, 264, dtype=torch.float64)
    probs = target_probs(logits, params)
    assert bool(torch.isfinite(probs).all()) and float(probs.sum()) == pytest.approx(1.0)
    torch.multinomial(probs, 1, generator=request.generator)
