"""No request can take the engine down: generated bodies and parameters on every route, and
clients that vanish. The HTTP side runs in this process (``in_process_server``), so a test can
drop a connection at an exact moment and see every log record; the TP worker is a real process.
"""

from __future__ import annotations

import http.client as http_client
import json
import logging
import urllib.error
import urllib.request
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.reference.http_common import MAX_JSON_DEPTH

from helpers.engine import wait_until
from helpers.reference_server import InProcessServer, http, in_process_server, metric_total

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DROP_HEADER = "X-Test-Drop-Connection"
CONTEXT_LENGTH = 128
GREEDY = {"text": "The fixed greedy prompt", "sampling_params": {"max_new_tokens": 24, "temperature": 0}}


async def drop_marked_connections(request, response) -> None:
    """Close the connection of a marked request just before its headers go out: a client that
    disconnected while ``response.prepare`` ran."""
    if request.headers.get(DROP_HEADER) == "before-headers":
        request.transport.close()


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    """A speculative TP 1 engine (3/1/4) with metrics and a short context (cheap requests)."""
    flags = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--enable-metrics", "--context-length", str(CONTEXT_LENGTH))
    with in_process_server(*flags, on_response_prepare=[drop_marked_connections]) as engine:
        yield engine


def aborted(server: InProcessServer) -> float:
    text = http(server, "/metrics")[1]
    return metric_total(text, "sglang:num_aborted_requests_total", model_name="ref-tiny")


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "gone", "stream": True, "sampling_params": {"max_new_tokens": 8}}),
    ("/v1/completions", {"prompt": "gone", "stream": True, "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "gone"}], "stream": True, "max_tokens": 8}),
])
def test_client_gone_during_prepare_is_a_debug_line_and_an_abort(
    server: InProcessServer, caplog: pytest.LogCaptureFixture, path: str, body: dict
) -> None:
    caplog.set_level(logging.DEBUG, logger="serving.reference")
    before = aborted(server)
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", DROP_HEADER: "before-headers"})
    with pytest.raises((urllib.error.URLError, http_client.HTTPException, ConnectionError)):
        urllib.request.urlopen(req, timeout=30).read()
    wait_until(lambda: aborted(server) == before + 1, timeout_s=30, what="the dropped request to be counted as aborted")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert any("went away before the response started" in r.getMessage() and r.levelno == logging.DEBUG
               for r in caplog.records)
    assert http(server, "/health")[0] == 200 and not server.fatal


# ----------------------------------------------------------------------------- generated requests
_SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc80" * 3])
_TEXT = st.one_of(st.text(max_size=12), _SURROGATES)
_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), _TEXT,
)
_JSON = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)
_NUMBER = st.one_of(
    st.integers(min_value=-3, max_value=40),
    st.sampled_from([0, 1, -1, 2, 0.5, 1.0, 1e-6, 5e-324, 1e308, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, 1e400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_STOPS = st.one_of(_TEXT, st.lists(_TEXT, max_size=3), st.lists(st.integers(min_value=-2, max_value=300), max_size=3))
_MAX_TOKENS = st.one_of(st.integers(min_value=-2, max_value=24), st.sampled_from([CONTEXT_LENGTH, 2**64, 1e400]), _LEAF)
_VALID = {
    "temperature": st.floats(min_value=0.0, max_value=3.0),
    "top_p": st.floats(min_value=1e-9, max_value=1.0),
    "top_k": st.integers(min_value=-1, max_value=300),
    "min_p": st.floats(min_value=0.0, max_value=1.0),
    "repetition_penalty": st.just(1.0),
    "frequency_penalty": st.just(0.0),
    "presence_penalty": st.just(0.0),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "stop_token_ids": st.lists(st.integers(min_value=0, max_value=300), max_size=2),
    "ignore_eos": st.booleans(),
    "n": st.just(1),
}


def _sampling(seed_key: str, max_key: str) -> st.SearchStrategy[dict]:
    """Mostly valid values (so generation runs with them), often junk (so validation is hit)."""
    valid = {**_VALID, seed_key: st.integers(min_value=-(2**63), max_value=2**64 - 1), max_key: st.integers(0, 24)}
    junk = {key: _NUMBER | _LEAF for key in valid}
    junk.update({max_key: _MAX_TOKENS, "stop": _STOPS, "stop_token_ids": _STOPS, "bogus": _JSON})
    return st.one_of(
        st.fixed_dictionaries({}, optional=valid),
        st.fixed_dictionaries({}, optional=valid),
        st.fixed_dictionaries({}, optional={**valid, **junk}),
    )


_PROMPT_TEXT = st.text(max_size=16)
_PROMPT_IDS = st.lists(st.integers(min_value=0, max_value=263), min_size=1, max_size=6)
_VALID_NATIVE = st.builds(
    lambda prompt, sampling, rest: {**rest, "sampling_params": sampling, **prompt},
    st.one_of(_PROMPT_TEXT.map(lambda t: {"text": t}), _PROMPT_IDS.map(lambda ids: {"input_ids": ids})),
    _sampling("sampling_seed", "max_new_tokens"),
    st.fixed_dictionaries({}, optional={"stream": st.booleans(), "rid": st.text(min_size=1, max_size=8)}),
)
_NATIVE = st.one_of(_VALID_NATIVE, _VALID_NATIVE, st.fixed_dictionaries({}, optional={
    "text": _TEXT | _JSON,
    "input_ids": st.lists(st.integers(min_value=-2, max_value=300), max_size=6) | _JSON,
    "sampling_params": _sampling("sampling_seed", "max_new_tokens") | _JSON,
    "stream": st.booleans() | _LEAF,
    "rid": _TEXT | _LEAF,
    "return_logprob": _LEAF,
}))
_STREAM = st.fixed_dictionaries({}, optional={"stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})})
_JUNK_STREAM = st.fixed_dictionaries({}, optional={"stream": st.booleans() | _LEAF, "stream_options": _JSON})
_COMPLETIONS = st.builds(
    lambda prompt, rest, sampling: {**rest, **sampling, **prompt},
    st.one_of(
        st.one_of(_PROMPT_TEXT, _PROMPT_IDS, _PROMPT_TEXT.map(lambda t: [t])).map(lambda p: {"prompt": p}),
        st.fixed_dictionaries({}, optional={"prompt": _TEXT | _JSON}),
    ),
    _STREAM | _JUNK_STREAM,
    _sampling("seed", "max_tokens"),
)
_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system", "assistant"]),
    "content": _PROMPT_TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _PROMPT_TEXT}), max_size=2),
})
_JUNK_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "tool"]) | _JSON,
    "content": _TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text") | _LEAF, "text": _TEXT | _LEAF}), max_size=2) | _JSON,
})
_CHAT = st.builds(
    lambda messages, rest, sampling: {**rest, **sampling, **messages},
    st.one_of(
        st.lists(_MESSAGE, min_size=1, max_size=2).map(lambda m: {"messages": m}),
        st.fixed_dictionaries({}, optional={"messages": st.lists(_JUNK_MESSAGE, max_size=2) | _JSON}),
    ),
    _STREAM | _JUNK_STREAM,
    _sampling("seed", "max_completion_tokens"),
)
_RAW = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * (MAX_JSON_DEPTH + 5) + b"1" + b"}" * (MAX_JSON_DEPTH + 5),
        b'{"text": "x", "sampling_params": {"temperature": NaN}}',
        b'{"prompt": "x", "temperature": Infinity}',
        b'{"text": "x", "sampling_params": {"max_new_tokens": ' + b"9" * 5000 + b"}}",
        b'{"text": "\\ud800"}',
        "{\"text\": \"caf\u00e9\"}".encode("latin-1"),
    ]),
)
_CONTENT_TYPES = st.one_of(st.just("application/json"), st.just("application/json"), st.sampled_from([
    "application/json; charset=utf-8", "application/json; charset=foobar", "application/json; charset=latin-1",
    "application/json; charset=utf-16", "application/json; charset=rot13", "text/plain", "",
]))
_POSTS = st.one_of(
    st.tuples(st.sampled_from(["/generate"]), _NATIVE),
    st.tuples(st.just("/v1/completions"), _COMPLETIONS),
    st.tuples(st.just("/v1/chat/completions"), _CHAT),
    st.tuples(st.sampled_from(["/generate", "/v1/completions", "/v1/chat/completions"]), _JSON),
    st.tuples(st.sampled_from(["/abort_request", "/flush_cache"]), _JSON),
)
_GETS = st.sampled_from(["/health", "/v1/models", "/server_info", "/get_model_info", "/metrics", "/health_generate"])


def _send(server: InProcessServer, method: str, path: str, data: bytes | None, content_type: str) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _check_error_shape(path: str, status: int, body: bytes) -> None:
    if path == "/flush_cache":  # SGLang's plain-text answer
        assert body.decode().strip(), body
        return
    error = json.loads(body)
    if path.startswith("/v1/"):
        assert error["object"] == "error" and error["code"] == status, error
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), error
    else:
        assert set(error) == {"error"} and isinstance(error["error"]["message"], str) and error["error"]["message"], error


def test_generated_requests_never_5xx_and_the_engine_stays_correct(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every answer is 200 or a 4xx in the route's error shape; afterwards the engine is healthy
    and a fixed greedy prompt gives exactly what it gave before."""
    status, baseline = http(server, "/generate", GREEDY)
    assert status == 200, baseline
    statuses: list[int] = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=st.one_of(
        st.tuples(st.just("POST"), _POSTS.map(lambda pb: (pb[0], json.dumps(pb[1], allow_nan=True).encode())), _CONTENT_TYPES),
        st.tuples(st.just("POST"), st.tuples(st.sampled_from(["/generate", "/v1/completions", "/v1/chat/completions"]), _RAW), _CONTENT_TYPES),
        st.tuples(st.just("GET"), _GETS.map(lambda p: (p, None)), st.just("")),
    ))
    def one(case: tuple[str, tuple[str, bytes | None], str]) -> None:
        method, (path, data), content_type = case
        status, body = _send(server, method, path, data, content_type)
        statuses.append(status)
        assert status == 200 or 400 <= status < 500, (status, path, data[:200] if data else None, body[:300])
        if status != 200:
            _check_error_shape(path, status, body)
        assert not server.fatal, server.fatal

    one()
    assert 200 in statuses and 400 in statuses, sorted(set(statuses))
    assert http(server, "/health")[0] == 200 and http(server, "/health_generate")[0] == 200
    assert not server.workers.dead_ranks() and not server.fatal
    assert http(server, "/generate", GREEDY)[1]["output_ids"] == baseline["output_ids"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_body_over_the_limit_is_413_in_each_routes_shape(server: InProcessServer) -> None:
    from serving.reference.http_common import MAX_BODY_BYTES

    raw = b'{"text": "' + b"x" * MAX_BODY_BYTES + b'"}'
    status, native = http(server, "/generate", raw=raw)
    assert status == 413 and "larger than" in native["error"]["message"]
    status, openai = http(server, "/v1/completions", raw=raw)
    assert status == 413 and openai["object"] == "error" and openai["code"] == 413 and "larger than" in openai["message"]
    assert http(server, "/generate", GREEDY)[0] == 200
