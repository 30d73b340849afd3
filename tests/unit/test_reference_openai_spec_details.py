"""SGLang 0.5.23's opt-in speculative details on the reference engine's OpenAI endpoints.

Contract (SGLang ``entrypoints/openai``: ``protocol.SpecTokensDetails`` / ``SglExt``,
``utils.spec_tokens_details_from_meta_info``, ``serving_chat`` / ``serving_completions``):

* ``return_spec_tokens_details: true`` on ``/v1/completions`` and ``/v1/chat/completions`` adds a
  response-level ``sglext.spec_tokens_details`` built from the request's ``meta_info`` (the same
  counters ``/generate`` returns): all nine ``SpecTokensDetails`` fields, absent ones at their
  defaults; one object when ``n`` is 1 (the first choice's), a list per choice when ``n`` > 1.
* Non-streaming: a top-level key of the body. Streaming: a chunk of its own (``choices: []``)
  after the finish chunks and before the ``include_usage`` chunk.
* No flag, or no speculation: no ``sglext``. A non-bool flag: 400. ``chat_template_kwargs`` must
  be an object (or null): anything else is a 400.

One in-process speculative server (``ref-tiny`` + its EAGLE3 draft) serves the module.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from serving.reference.openai_api import sglext_of, spec_tokens_details

from helpers.reference_server import InProcessServer, http, in_process_server, sse_events

pytestmark = pytest.mark.timeout(300)

SPEC_FLAGS = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "ref-tiny-draft",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
DETAIL_KEYS = ["spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
               "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
               "spec_correct_drafts_histogram", "spec_cap_lens_histogram"]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def spec_server() -> Iterator[InProcessServer]:
    """A speculative reference engine (TP=1) served from this process."""
    with in_process_server(*SPEC_FLAGS) as server:
        yield server


def _body(path: str, prompt: Any = "The capital of France is", **extra: Any) -> dict[str, Any]:
    """A greedy 24-token request for ``path``."""
    base: dict[str, Any] = {"max_tokens": 24, "temperature": 0, **extra}
    if path == CHAT:
        return {"messages": [{"role": "user", "content": prompt}], **base}
    return {"prompt": prompt, **base}


def _check_details(details: Any) -> None:
    """One choice's ``SpecTokensDetails``: every field, and counters that agree with each other."""
    assert isinstance(details, dict) and list(details) == DETAIL_KEYS
    ct = details["spec_verify_ct"]
    hist = details["spec_correct_drafts_histogram"]
    assert isinstance(ct, int) and ct > 0
    assert isinstance(hist, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in hist)
    assert sum(hist) == ct
    assert details["spec_num_correct_drafts"] == sum(k * h for k, h in enumerate(hist))
    assert details["spec_num_proposed_drafts"] == ct * 3  # num_draft_tokens - 1 per verify pass
    assert details["spec_accept_rate"] == details["spec_num_correct_drafts"] / details["spec_num_proposed_drafts"]
    assert details["spec_cap_length"] == 0.0 and details["spec_block_accept_length"] == 0.0
    assert details["spec_cap_lens_histogram"] == []


def _stream(server: InProcessServer, path: str, body: dict[str, Any]) -> list[Any]:
    events = sse_events(server, path, {**body, "stream": True})
    assert events[-1] == "[DONE]"
    return events[:-1]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_non_streaming_carries_sglext_only_when_asked(spec_server, path) -> None:
    status, out = http(spec_server, path, _body(path, return_spec_tokens_details=True))
    assert status == 200, out
    assert list(out)[-2:] == ["usage", "sglext"] and list(out["sglext"]) == ["spec_tokens_details"]
    _check_details(out["sglext"]["spec_tokens_details"])
    assert out["sglext"]["spec_tokens_details"]["spec_accept_length"] == (
        out["usage"]["completion_tokens"] / out["sglext"]["spec_tokens_details"]["spec_verify_ct"])
    for off in ({}, {"return_spec_tokens_details": False}):
        status, plain = http(spec_server, path, _body(path, **off))
        assert status == 200 and "sglext" not in plain


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("include_usage", [True, False])
def test_streaming_sends_sglext_in_a_chunk_of_its_own_before_usage(spec_server, path, include_usage) -> None:
    body = _body(path, return_spec_tokens_details=True, stream_options={"include_usage": include_usage})
    events = _stream(spec_server, path, body)
    carrying = [i for i, e in enumerate(events) if "sglext" in e]
    assert len(carrying) == 1, events
    ext_chunk = events[carrying[0]]
    assert ext_chunk["choices"] == [] and "usage" not in ext_chunk
    _check_details(ext_chunk["sglext"]["spec_tokens_details"])
    finish = [i for i, e in enumerate(events) if any(c.get("finish_reason") for c in e["choices"])]
    assert finish and finish[-1] < carrying[0]
    rest = events[carrying[0] + 1:]
    assert rest == ([events[-1]] if include_usage else [])
    if include_usage:
        assert events[-1]["choices"] == [] and "usage" in events[-1] and "sglext" not in events[-1]
    plain = _stream(spec_server, path, _body(path, stream_options={"include_usage": include_usage}))
    assert all("sglext" not in e for e in plain)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("bad", ["true", 1, 0, None, [], {}])
def test_a_non_bool_flag_is_a_400(spec_server, path, bad) -> None:
    status, out = http(spec_server, path, _body(path, return_spec_tokens_details=bad))
    assert status == 400, out
    assert out["object"] == "error" and out["code"] == 400
    assert out["message"].startswith("'return_spec_tokens_details' must be true or false, got ")


def test_a_batch_of_prompts_reports_the_first_choice_as_sglang_does(spec_server) -> None:
    """SGLang lists details only for ``n`` > 1; a completions batch (``n`` = 1) gets choice 0's."""
    prompts = ["The capital of France is", "Once upon a time, in a land far away,"]
    status, out = http(spec_server, COMPLETIONS, _body(COMPLETIONS, prompts, return_spec_tokens_details=True))
    assert status == 200 and len(out["choices"]) == 2
    details = out["sglext"]["spec_tokens_details"]
    _check_details(details)
    status, first = http(spec_server, COMPLETIONS, _body(COMPLETIONS, prompts[0], return_spec_tokens_details=True))
    assert status == 200 and first["choices"][0]["text"] == out["choices"][0]["text"]
    assert first["sglext"]["spec_tokens_details"] == details


def test_n_above_one_stays_refused(spec_server) -> None:
    status, out = http(spec_server, CHAT, _body(CHAT, n=2, return_spec_tokens_details=True))
    assert status == 400 and "'n'=2 is not supported" in out["message"]


def test_n_above_one_lists_every_choice_in_order() -> None:
    """SGLang's rule, for when ``n`` > 1 is served: one entry per choice with details, in order."""
    metas = [{"spec_verify_ct": 2, "spec_correct_drafts_histogram": [1, 1]}, {}, {"spec_verify_ct": 5}]
    details = [spec_tokens_details(m) for m in metas]
    assert details[1] is None
    listed = sglext_of(details, n=3)["spec_tokens_details"]
    assert [d["spec_verify_ct"] for d in listed] == [2, 5]
    assert sglext_of(details, n=1)["spec_tokens_details"]["spec_verify_ct"] == 2
    assert sglext_of([None, None], n=2) is None


def test_details_from_meta_info_follow_sglang_defaults() -> None:
    assert spec_tokens_details({"id": "x", "completion_tokens": 3}) is None
    details = spec_tokens_details({"spec_verify_ct": 4, "spec_accept_length": 2.5, "spec_accept_rate": None})
    assert details == {"spec_accept_rate": 0.0, "spec_accept_length": 2.5, "spec_cap_length": 0.0,
                       "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0,
                       "spec_verify_ct": 4, "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": []}


def test_without_speculation_there_is_no_sglext() -> None:
    with in_process_server() as server:
        for path in (CHAT, COMPLETIONS):
            status, out = http(server, path, _body(path, return_spec_tokens_details=True))
            assert status == 200 and "sglext" not in out
            events = _stream(server, path, _body(path, return_spec_tokens_details=True,
                                                  stream_options={"include_usage": True}))
            assert all("sglext" not in e for e in events)


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {}, None])
def test_chat_template_kwargs_object_is_accepted(spec_server, kwargs) -> None:
    status, out = http(spec_server, CHAT, _body(CHAT, chat_template_kwargs=kwargs))
    assert status == 200, out
    status, plain = http(spec_server, CHAT, _body(CHAT))
    assert out["choices"][0]["message"] == plain["choices"][0]["message"]  # the template takes no kwargs


@pytest.mark.parametrize("bad", ["enable_thinking", [], 1, True])
def test_chat_template_kwargs_must_be_an_object(spec_server, bad) -> None:
    status, out = http(spec_server, CHAT, _body(CHAT, chat_template_kwargs=bad))
    assert status == 400 and out["message"].startswith("'chat_template_kwargs' must be an object, got ")
