"""The HTTP API of a running reference engine: SGLang's endpoints, fields and error handling."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from serving.engine.process import EngineProcess

from helpers.engine import wait_until
from helpers.reference_server import generate_concurrently, http, metric_total, running_server, sse_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPEC_FLAGS = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "ref-tiny-draft",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
              "--enable-metrics")


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One speculative TP=1 server shared by this module."""
    with running_server(*SPEC_FLAGS, log_dir=tmp_path_factory.mktemp("ref-http")) as engine:
        yield engine


def greedy(text: str, n: int = 24, **extra) -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, **extra}}


def test_health_and_model_endpoints(spec_server: EngineProcess) -> None:
    assert http(spec_server, "/health")[0] == 200
    assert http(spec_server, "/health_generate")[0] == 200
    status, models = http(spec_server, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "ref-tiny" and models["object"] == "list"
    status, info = http(spec_server, "/get_model_info")
    assert status == 200 and info["model_path"] == "ref-tiny" and info["is_generation"] is True


def test_generate_meta_info(spec_server: EngineProcess) -> None:
    status, out = http(spec_server, "/generate", greedy("Hello there", 20))
    assert status == 200, out
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 20
    assert meta["finish_reason"] == {"type": "length", "length": 20}
    assert meta["prompt_tokens"] == len("Hello there") + 1
    assert meta["e2e_latency"] > 0 and isinstance(meta["id"], str)
    assert 1 <= meta["spec_verify_ct"] <= 19
    assert meta["spec_accept_length"] == pytest.approx(20 / meta["spec_verify_ct"])
    assert isinstance(out["text"], str) and len(out["text"]) == 20  # printable ASCII bytes


def test_generate_input_ids_equals_text(spec_server: EngineProcess) -> None:
    _, by_text = http(spec_server, "/generate", greedy("abc", 8))
    _, by_ids = http(spec_server, "/generate", {"input_ids": [256, 97, 98, 99], "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert by_text["output_ids"] == by_ids["output_ids"]


def test_generate_stream(spec_server: EngineProcess) -> None:
    events = sse_events(spec_server, "/generate", {**greedy("Stream me", 16), "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert chunks[-1]["output_ids"] == http(spec_server, "/generate", greedy("Stream me", 16))[1]["output_ids"]
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(lengths) and lengths[-1] == 16
    assert len(chunks) < 16, "speculation should put several tokens in some chunks"
    assert chunks[-1]["text"].startswith(chunks[0]["text"])  # cumulative text, as SGLang


def test_stop_string_is_trimmed(spec_server: EngineProcess) -> None:
    _, full = http(spec_server, "/generate", greedy("Once upon", 30))
    stop = full["text"][12:14]
    _, cut = http(spec_server, "/generate", greedy("Once upon", 30, stop=[stop]))
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == full["text"][: full["text"].find(stop)]


def test_openai_completions(spec_server: EngineProcess) -> None:
    status, out = http(spec_server, "/v1/completions", {"model": "ref-tiny", "prompt": "Hello there", "max_tokens": 20, "temperature": 0})
    assert status == 200, out
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}
    assert out["choices"][0]["text"] == http(spec_server, "/generate", greedy("Hello there", 20))[1]["text"]
    events = sse_events(spec_server, "/v1/completions", {"prompt": "Hello there", "max_tokens": 20, "temperature": 0,
                                                         "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    text = "".join(c["choices"][0]["text"] for c in events[:-1] if c["choices"])
    assert text == out["choices"][0]["text"]
    assert events[-2]["usage"]["completion_tokens"] == 20 and events[-2]["choices"] == []


def test_openai_chat(spec_server: EngineProcess) -> None:
    body = {"model": "ref-tiny", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 12, "temperature": 0}
    status, out = http(spec_server, "/v1/chat/completions", body)
    assert status == 200, out
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and out["object"] == "chat.completion"
    assert out["usage"]["completion_tokens"] <= 12
    events = sse_events(spec_server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1] if c["choices"])
    assert content == message["content"]
    finals = [c for c in events[:-1] if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals and finals[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert events[-2]["usage"] == out["usage"]


def test_sampling_is_reproducible_by_seed(spec_server: EngineProcess) -> None:
    body = {"text": "Roll", "sampling_params": {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "sampling_seed": 7}}
    assert http(spec_server, "/generate", body)[1]["output_ids"] == http(spec_server, "/generate", body)[1]["output_ids"]


@pytest.mark.parametrize(
    "path, raw, needle",
    [
        ("/generate", b"{not json", "not valid JSON"),
        ("/generate", b"[1, 2]", "JSON object"),
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": -1}}', "max_new_tokens must be at least 0"),
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": 100000000}}', "maximum context length"),
        ("/generate", b'{"text": "x", "sampling_params": {"bogus": 1}}', "unexpected keyword argument"),
        ("/generate", b'{"input_ids": [1, 99999]}', "outside the vocabulary"),
        ("/generate", b'{"sampling_params": {}}', "exactly one of"),
        ("/generate", ('{"text": "' + "x" * 3000 + '"}').encode(), "longer than the model's context length"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": -5}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "n": 3}', "'n'=3"),
        ("/v1/chat/completions", b'{"messages": []}', "messages"),
        ("/v1/chat/completions", b"{oops", "not valid JSON"),
        # used to reach both TP workers and fail in manual_seed: the server exited 1
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": 0.7, "sampling_seed": 18446744073709551616}}',
         "sampling_params.sampling_seed must be an integer in [-9223372036854775808, 18446744073709551615], "
         "got 18446744073709551616"),
        ("/v1/completions", b'{"prompt": "x", "temperature": 0.7, "seed": 18446744073709551616}',
         "seed must be an integer in [-9223372036854775808, 18446744073709551615]"),
        # used to fail in the workers' sampler ("probability tensor contains either inf, nan")
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": NaN}}', "sampling_params.temperature must be a finite number"),
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": Infinity}}', "must be a finite number, got inf"),
        ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', "temperature must be a finite number"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": -Infinity}',
         "temperature must be a finite number"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}', "top_p must be a finite number"),
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": 1e400}}', "must be a finite number"),
        # used to be 500s with a traceback
        ("/generate", b'{"text": "\\ud800"}', "text contains '\\ud800', a lone surrogate"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "lone surrogate"),
        ("/generate", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": ' + b"9" * 5000 + b"}}", "not valid JSON"),
        ("/v1/chat/completions", b'{"messages": [{"role": [], "content": "x"}]}', "messages[0].role=[] is not supported"),
        ("/v1/completions", b'{"prompt": "x", "n": 0.5}', "'n' must be an integer, got 0.5"),
    ],
)
def test_bad_input_is_400_and_server_keeps_serving(spec_server: EngineProcess, path: str, raw: bytes, needle: str) -> None:
    status, out = http(spec_server, path, raw=raw)
    assert status == 400, out
    message = out["error"]["message"] if "error" in out else out["message"]
    assert needle in message
    assert http(spec_server, "/generate", greedy("still alive?", 4))[0] == 200
    assert "Traceback" not in spec_server.log_path.read_text()


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
@pytest.mark.parametrize("charset", ["foobar", "rot13"])
def test_an_unknown_charset_is_400_in_the_routes_shape(spec_server: EngineProcess, path: str, charset: str) -> None:
    body = {"text": "x"} if path == "/generate" else {"prompt": "x"}
    status, out = http(spec_server, path, body, content_type=f"application/json; charset={charset}")
    assert status == 400, out
    message = out["error"]["message"] if path == "/generate" else out["message"]
    assert f"charset '{charset}' is not a known text encoding" in message
    assert "Traceback" not in spec_server.log_path.read_text()
    assert http(spec_server, path, body, content_type="application/json; charset=utf-8")[0] == 200


def test_flush_cache_and_server_info_accept_length(spec_server: EngineProcess) -> None:
    """As SGLang 0.5.23: after /flush_cache (or on a fresh engine) one short request leaves
    ``avg_spec_accept_length`` absent, because the totals fold only every --decode-log-interval (40)
    decode batches, never on idle; once 40 decode batches ran it is present, and it is the
    per-request aggregate sum(completion_tokens - 1) / sum(spec_verify_ct) over the folded batches."""
    assert http(spec_server, "/flush_cache")[0] == 200
    _, info = http(spec_server, "/server_info")
    assert "avg_spec_accept_length" not in info["internal_states"][0]
    outs = [http(spec_server, "/generate", greedy("The capital city of France is", 8))[1]]
    _, info = http(spec_server, "/server_info")
    assert "avg_spec_accept_length" not in info["internal_states"][0], "one short request must not fold"
    words = ["alpha", "beta", "gamma delta", "epsilon", "zeta eta theta", "iota", "kappa", "lambda"]
    for i in range(40):  # one request at a time: about 40 / 2.5 decode batches each
        outs.append(http(spec_server, "/generate", greedy(f"Prompt {i}: {words[i % len(words)]}", 40))[1])
        _, info = http(spec_server, "/server_info")
        if "avg_spec_accept_length" in info["internal_states"][0]:
            break
    state = info["internal_states"][0]
    assert "avg_spec_accept_length" in state, "40 decode batches must fold the counters"
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert state["spec_verify_ct_total"] <= verify  # the batches after the fold are not in it yet
    assert state["avg_spec_accept_length"] == pytest.approx((completion - len(outs)) / verify, rel=0.1)
    assert 1.0 <= state["avg_spec_accept_length"] <= 4.0
    assert info["speculative_num_steps"] == 3 and info["speculative_eagle_topk"] == 1
    assert info["disable_custom_all_reduce"] is False and "version" in info
    assert http(spec_server, "/get_server_info")[1]["internal_states"] == info["internal_states"]


def test_flush_cache_refused_while_busy(spec_server: EngineProcess) -> None:
    """While a request is in flight (its stream has started), /flush_cache is a 400."""
    import json
    import urllib.request

    body = {**greedy("long one", 1000), "stream": True}
    req = urllib.request.Request(spec_server.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as stream:
        first = stream.readline()
        assert first.startswith(b"data: ")
        status, text = http(spec_server, "/flush_cache")
        rest = stream.read()
    assert status == 400 and "pending requests" in text
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert http(spec_server, "/flush_cache")[0] == 200


def test_metrics_use_sglang_names(spec_server: EngineProcess) -> None:
    http(spec_server, "/generate", greedy("count me", 8))
    status, text = http(spec_server, "/metrics")
    assert status == 200
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_running_reqs",
                 "sglang:spec_accept_length", "sglang:time_to_first_token_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_count", "sglang:gen_throughput"):
        assert name in text, name
    generated = metric_total(text, "sglang:generation_tokens_total", model_name="ref-tiny")
    assert generated >= 8


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """Plain decoding, no metrics, one request at a time."""
    with running_server("--max-running-requests", "1", log_dir=tmp_path_factory.mktemp("ref-one")) as engine:
        yield engine


def test_metrics_absent_without_flag(one_slot_server: EngineProcess) -> None:
    assert http(one_slot_server, "/metrics")[0] == 404
    _, info = http(one_slot_server, "/server_info")
    assert info["speculative_algorithm"] is None and info["max_running_requests"] == 1
    _, out = http(one_slot_server, "/generate", greedy("plain", 6))
    assert "spec_verify_ct" not in out["meta_info"]


def test_health_generate_is_200_while_the_batch_is_full(one_slot_server: EngineProcess) -> None:
    """The only slot is busy, so the health request waits in the queue; like SGLang, tokens
    flowing for someone else prove the engine healthy: the check answers 200 while the busy
    request is still in flight (it is aborted only afterwards), not once it has finished."""
    import urllib.request

    rid = "keep-busy"
    body = {**greedy("keep busy", 1900, ignore_eos=True), "stream": True, "rid": rid}
    req = urllib.request.Request(one_slot_server.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as stream:
        assert stream.readline().startswith(b"data: ")
        status, _ = http(one_slot_server, "/health_generate")
        flush_status, flush_text = http(one_slot_server, "/flush_cache")  # refused while a request is pending
        assert http(one_slot_server, "/abort_request", {"rid": rid})[0] == 200
        rest = stream.read().decode()
    assert status == 200
    assert flush_status == 400 and "pending requests" in flush_text, "the health check waited for the busy request"
    final = json.loads([line for line in rest.splitlines() if line.startswith("data: {")][-1][len("data: "):])
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    assert final["meta_info"]["completion_tokens"] < 1900


def test_client_disconnect_aborts_the_request(spec_server: EngineProcess) -> None:
    """A client that goes away mid-request frees its slot (the request is aborted in the engine)."""
    import socket

    def aborted() -> float:
        text = http(spec_server, "/metrics")[1]
        return metric_total(text, "sglang:num_aborted_requests_total", model_name="ref-tiny")

    before = aborted()
    body = json.dumps(greedy("abandon me", 1800)).encode()
    with socket.create_connection(("127.0.0.1", spec_server.command.port)) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_until(lambda: aborted() > before, timeout_s=20, what="the abandoned request to be aborted",
               detail=spec_server.log_tail)
    assert http(spec_server, "/flush_cache")[0] == 200
