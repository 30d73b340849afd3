"""The reference engine answers the request shapes SGLang's own clients send, as SGLang does:
batched /generate and /v1/completions, per-request stream_interval, GET /v1/models/{id}, the
model:adapter syntax, the newest meta_info keys, chat's return_meta_info, and logprobs."""

from __future__ import annotations

import json
import urllib.request
from typing import Iterator

import pytest

from serving.engine.process import EngineProcess

from helpers.reference_server import http, running_server, sse_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NUM_DRAFT_TOKENS = 4
SPEC_FLAGS = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "ref-tiny-draft",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", str(NUM_DRAFT_TOKENS))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One speculative TP=1 server shared by this module (servers are slow to start)."""
    with running_server(*SPEC_FLAGS, log_dir=tmp_path_factory.mktemp("ref-sglang-clients")) as engine:
        yield engine


def send_one_body(prompt, *, stream: bool = False, max_new_tokens: int = 16, **extra) -> dict:
    """The body python/sglang/test/send_one.py posts to /generate (image_data and json_schema
    None when unused; prompt is [prompt] * batch_size with --batch-size > 1)."""
    return {
        "text": prompt,
        "image_data": None,
        "sampling_params": {
            "temperature": 0.0, "max_new_tokens": max_new_tokens, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "json_schema": None, "stop": ["Question", "Assistant:", "<|separator|>", "<|eos|>"],
            **extra.pop("sampling", {}),
        },
        "return_logprob": False,
        "stream": stream,
        **extra,
    }


def test_batched_text_answers_one_result_per_item(server: EngineProcess) -> None:
    # send_one.py --batch-size 3 --different-prompts: "Test case {i+1}: " + prompt; reads ret[0].
    prompts = [f"Test case {i + 1}: Human: Give me a FastAPI server.\n\nAssistant:" for i in range(3)]
    status, out = http(server, "/generate", send_one_body(prompts))
    assert status == 200, out
    assert isinstance(out, list) and len(out) == 3
    for prompt, item in zip(prompts, out):
        alone = http(server, "/generate", send_one_body(prompt))[1]
        assert item["output_ids"] == alone["output_ids"] and item["text"] == alone["text"]
        assert item["meta_info"]["prompt_tokens"] == len(prompt) + 1
    assert len({item["meta_info"]["id"] for item in out}) == 3


def test_batched_input_ids_with_per_item_sampling_params(server: EngineProcess) -> None:
    # GenerateReqInput: input_ids as List[List[int]], sampling_params as List[Dict] (one per item).
    body = {"input_ids": [[256, 72, 105], [256, 89, 111, 33]],
            "sampling_params": [{"max_new_tokens": 5, "temperature": 0}, {"max_new_tokens": 9, "temperature": 0}],
            "rid": "job"}
    status, out = http(server, "/generate", body)
    assert status == 200, out
    assert [len(item["output_ids"]) for item in out] == [5, 9]
    assert [item["meta_info"]["id"] for item in out] == ["job_0", "job_1"]  # SGLang's _normalize_rid


def test_batched_stream_chunks_carry_their_index(server: EngineProcess) -> None:
    """A streamed batch interleaves its items' chunks; each carries ``index`` (SGLang's
    _handle_batch_request), and the last chunk of each item is its whole result."""
    prompts = ["alpha beta", "gamma"]
    events = sse_events(server, "/generate", send_one_body(prompts, stream=True, max_new_tokens=12))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["index"] for c in chunks} == {0, 1}
    together = http(server, "/generate", send_one_body(prompts, max_new_tokens=12))[1]
    for index in (0, 1):
        mine = [c for c in chunks if c["index"] == index]
        assert mine[-1]["output_ids"] == together[index]["output_ids"]
        assert mine[-1]["meta_info"]["finish_reason"] is not None
        assert all(c["meta_info"]["finish_reason"] is None for c in mine[:-1])


def test_stream_interval_sets_the_tokens_per_chunk(server: EngineProcess) -> None:
    """sampling_params.stream_interval: a chunk when len(output_ids) % interval == 1, and the end."""
    body = send_one_body("Stream with an interval", stream=True, max_new_tokens=40, sampling={"stream_interval": 7})
    chunks = sse_events(server, "/generate", body)[:-1]
    assert all(len(c["output_ids"]) % 7 == 1 for c in chunks[:-1]), [len(c["output_ids"]) for c in chunks]
    assert len(chunks[-1]["output_ids"]) == 40 and len(chunks) <= 40 // 7 + 2
    status, out = http(server, "/generate", send_one_body("x", sampling={"stream_interval": 0}))
    assert status == 400 and "sampling_params.stream_interval must be an integer in [1, 1073741824], got 0" in out["error"]["message"]


def test_batched_completions_have_one_choice_per_prompt(server: EngineProcess) -> None:
    # OpenAI client completions.create(prompt=[...]) and bench_serving-style token-id prompts.
    for prompt in (["first prompt", "second one"], [[256, 104, 105], [256, 121, 111]]):
        body = {"model": "ref-tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}
        status, out = http(server, "/v1/completions", body)
        assert status == 200, out
        assert [c["index"] for c in out["choices"]] == [0, 1]
        for p, choice in zip(prompt, out["choices"]):
            alone = http(server, "/v1/completions", {**body, "prompt": p})[1]
            assert choice["text"] == alone["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] == 12
    events = sse_events(server, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 6, "temperature": 0, "stream": True,
                                                   "stream_options": {"include_usage": True}})
    texts = {0: "", 1: ""}
    for event in events[:-1]:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    final = http(server, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 6, "temperature": 0})[1]
    assert [texts[0], texts[1]] == [c["text"] for c in final["choices"]]
    assert events[-2]["usage"]["completion_tokens"] == 12


def test_models_by_id_and_the_model_field(server: EngineProcess) -> None:
    status, card = http(server, "/v1/models/ref-tiny")
    assert status == 200 and card["id"] == "ref-tiny" and card["object"] == "model" and card["owned_by"] == "sglang"
    assert card == http(server, "/v1/models")[1]["data"][0]
    status, out = http(server, "/v1/models/gpt-4o")
    assert status == 404
    assert out == {"error": {"message": "The model 'gpt-4o' does not exist", "type": "invalid_request_error",
                             "param": "model", "code": "model_not_found"}}
    # serving_base._parse_model_parameter: "<base>:<adapter>" asks for LoRA, refused without --enable-lora.
    status, out = http(server, "/v1/chat/completions", {"model": "ref-tiny:sql-expert", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and out["message"].startswith("LoRA adapter 'sql-expert' was requested, but LoRA is not enabled.")
    # Any other model name is served by the one model, as SGLang does.
    assert http(server, "/v1/completions", {"model": "some-other-name", "prompt": "x", "max_tokens": 2})[0] == 200


def test_meta_info_carries_sglangs_newest_keys(server: EngineProcess) -> None:
    """SGLang 0.5.23's tokenizer_manager.py (_handle_batch_output, _calculate_spec_decoding_metrics):
    weight_version, num_retractions, the draft
    counters by their new names (old ones as aliases), the histogram; no spec keys without a verify."""
    meta = http(server, "/generate", send_one_body("Hello there", max_new_tokens=24))[1]["meta_info"]
    assert meta["weight_version"] == "default" and meta["num_retractions"] == 0
    ct = meta["spec_verify_ct"]
    assert meta["spec_num_proposed_drafts"] == ct * (NUM_DRAFT_TOKENS - 1) == meta["spec_proposed_drafts"]
    assert meta["spec_num_correct_drafts"] == meta["spec_accepted_drafts"]
    hist = meta["spec_correct_drafts_histogram"]
    assert hist == meta["spec_accept_histogram"] and sum(hist) == ct
    assert sum(k * n for k, n in enumerate(hist)) == meta["spec_num_correct_drafts"]
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])
    one = http(server, "/generate", send_one_body("Hello there", max_new_tokens=1))[1]["meta_info"]
    assert not [k for k in one if k.startswith("spec_")]  # finished at prefill: no verify ran


def test_chat_return_meta_info(server: EngineProcess) -> None:
    body = {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 10, "temperature": 0,
            "return_meta_info": True}
    status, out = http(server, "/v1/chat/completions", body)
    assert status == 200, out
    meta = out["choices"][0]["meta_info"]
    assert meta["completion_tokens"] == out["usage"]["completion_tokens"] and meta["spec_verify_ct"] >= 1
    assert "meta_info" not in http(server, "/v1/chat/completions", {**body, "return_meta_info": False})[1]["choices"][0]
    status, out = http(server, "/v1/chat/completions", {**body, "stream": True})
    assert status == 400 and out["message"] == ("return_meta_info is not supported with streaming. "
                                                "Please set stream=false when using return_meta_info=true.")


def test_native_logprobs(server: EngineProcess) -> None:
    # send_one.py --return-logprob, plus the logprob fields of SGLang's test clients.
    body = {**send_one_body("Log me", max_new_tokens=8), "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": 0, "return_text_in_logprobs": True}
    out = http(server, "/generate", body)[1]
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert meta["output_token_logprobs_length"] == 8
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == out["text"]
    for (value, token, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert value <= 0 and top[0][1] == token and top[0][0] == pytest.approx(value)  # greedy: the argmax
    inputs = meta["input_token_logprobs"]
    assert [t for _, t, _ in inputs] == [256, *b"Log me"] and inputs[0][0] is None and meta["input_top_logprobs"][0] is None
    plain = http(server, "/generate", send_one_body("Log me", max_new_tokens=8))[1]["meta_info"]
    assert "output_token_logprobs" not in plain


def test_openai_logprobs(server: EngineProcess) -> None:
    status, out = http(server, "/v1/completions", {"prompt": "Once", "max_tokens": 6, "temperature": 0, "logprobs": 2})
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == out["choices"][0]["text"] and lp["text_offset"] == [-1] * 6
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6 and all(len(t) <= 2 for t in lp["top_logprobs"])
    # OpenAI client chat.completions.create(logprobs=True, top_logprobs=2)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0, "logprobs": True,
            "top_logprobs": 2}
    out = http(server, "/v1/chat/completions", chat)[1]
    content = out["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == out["choices"][0]["message"]["content"]
    assert all(c["bytes"] == list(c["token"].encode()) and c["top_logprobs"][0]["token"] == c["token"] for c in content)
    events = sse_events(server, "/v1/chat/completions", {**chat, "stream": True})
    streamed = [c for e in events[:-1] for ch in e["choices"] if ch.get("logprobs") for c in ch["logprobs"]["content"]]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    assert http(server, "/v1/chat/completions", {**chat, "logprobs": False})[1]["choices"][0]["logprobs"] is None
    for path, bad, needle in (("/v1/completions", {"prompt": "x", "logprobs": -1}, "'logprobs' must be an integer in [0, "),
                              ("/v1/completions", {"prompt": "x", "logprobs": True}, "number of top logprobs"),
                              ("/v1/chat/completions", {**chat, "top_logprobs": 10**6}, "'top_logprobs' must be an integer")):
        status, out = http(server, path, bad)
        assert status == 400 and needle in out["message"], out


def test_unsupported_openai_features_stay_400(server: EngineProcess) -> None:
    for body, needle in (({"prompt": "x", "n": 2}, "'n'=2"), ({"prompt": "x", "echo": True}, "'echo'")):
        status, out = http(server, "/v1/completions", body)
        assert status == 400 and needle in out["message"]
    req = urllib.request.Request(server.url + "/generate", data=json.dumps(send_one_body("ok")).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
