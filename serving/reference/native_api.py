"""SGLang's native endpoints (``sglang/srt/entrypoints/http_server.py``), registered by ``register``.

* ``GET /health``: 200 once the server is ready and its workers are alive, else 503.
* ``GET /health_generate``: 200 after a 1-token generation completes, or once the engine is seen
  emitting tokens for anyone (a full batch is healthy, as in SGLang); 503 after 20 s. This is the
  readiness signal to poll.
* ``GET /server_info`` (alias ``/get_server_info``): the resolved server args, scheduler info,
  ``internal_states: [{"avg_spec_accept_length": ..., ...}]`` and ``version``.
* ``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream`` (SSE chunks
  ``data: {...}`` with the cumulative text, then ``data: [DONE]``), ``rid``; the response has
  ``text``, ``output_ids`` and ``meta_info``.
* ``GET|POST /flush_cache``: resets the speculative counters; 400 while requests are in flight.
* ``GET /metrics``: Prometheus text (only with ``--enable-metrics``).
* ``GET /get_model_info`` (alias ``/model_info``), ``POST /abort_request``.

Bad input is answered with ``{"error": {"message": ...}}`` (400, or 413 for a body over the
limit, 503 before ready) and the server keeps serving. One deliberate difference: SGLang reports
a validation error of a *streaming* ``/generate`` as an SSE event after a 200; here validation
happens before the stream starts, so it is a plain 400.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncGenerator, Mapping

from aiohttp import web

from serving.reference.engine_client import RequestState
from serving.reference.http_common import (
    AppState,
    RequestError,
    check_ids,
    check_length,
    encode_text,
    final_state,
    json_response,
    output_text,
    read_json,
    request_seed,
    route,
    sampling_params,
    sse,
    state_of,
    stream_response,
)
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.tokenizer import BOS_ID

__all__ = ["HEALTH_CHECK_TIMEOUT_S", "VERSION", "native_error", "parse_generate", "register"]

logger = logging.getLogger(__name__)

VERSION = "0.1.0+spectune.reference"
HEALTH_CHECK_TIMEOUT_S = 20.0


def native_error(message: str, status: int) -> dict[str, Any]:
    """SGLang's native error body."""
    return {"error": {"message": message}}


def parse_generate(state: AppState, body: Mapping[str, Any]) -> tuple[GenerateReq, bool]:
    """Validate a ``/generate`` body into a request and its ``stream`` flag."""
    args, tok = state.args, state.tokenizer
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, list):
            raise RequestError("batched 'text' (a list) is not supported by the reference engine; send one request each")
        ids = encode_text(tok, text, field="'text'")
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise RequestError("'input_ids' must be a non-empty list of token ids")
        if isinstance(input_ids[0], list):
            raise RequestError("batched 'input_ids' is not supported by the reference engine; send one request each")
        ids = check_ids(tok, input_ids, field="input_ids")
    for flag in ("return_logprob", "return_hidden_states"):
        if body.get(flag):
            raise RequestError(f"'{flag}' is not supported by the reference engine")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {stream!r}")
    params = sampling_params(body.get("sampling_params"))
    check_length(args, len(ids), params.max_new_tokens)
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif not isinstance(rid, str) or not rid:
        raise RequestError(f"'rid' must be a non-empty string, got {rid!r}")
    seed = request_seed(args, rid, params)
    return GenerateReq(rid=rid, input_ids=tuple(ids), params=params, seed=seed), stream


# --------------------------------------------------------------------------------- handlers
async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if state_of(request).healthy else 503)


async def health_generate(request: web.Request) -> web.Response:
    """200 once a 1-token generation completes, or, as in SGLang, as soon as the engine is seen
    producing tokens for anyone (a busy server is healthy even if the check waits in its queue)."""
    state = state_of(request)
    client = state.client
    if not state.healthy or client is None:
        return web.Response(status=503)
    req = GenerateReq(
        rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
        input_ids=(BOS_ID,),
        params=SamplingParams(max_new_tokens=1, temperature=0.0),
        seed=0,
        is_health_check=True,
    )

    async def run() -> None:
        async for _ in client.generate(req):
            pass

    started = time.monotonic()
    task = asyncio.ensure_future(run())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                if task.exception() is None:
                    return web.Response(status=200)
                break
            if client.last_output_at > started:
                return web.Response(status=200)
            if time.monotonic() - started > HEALTH_CHECK_TIMEOUT_S:
                break
    finally:
        if not task.done():
            task.cancel()
    logger.error("health check failed: no token within %.0fs", HEALTH_CHECK_TIMEOUT_S)
    return web.Response(status=503)


async def server_info(request: web.Request) -> web.Response:
    state = state_of(request)
    internal = dict(state.client.internal_state) if state.client else {}
    return json_response(
        {
            **state.args.to_dict(),
            "max_total_num_tokens": state.max_total_num_tokens,
            "max_req_input_len": state.args.context_length - 1,
            "internal_states": [internal],
            "version": VERSION,
            "reference_engine": {
                "workers": state.worker_info,
                "ready": state.ready,
                "counters": (
                    "lifetime since the last /flush_cache; folded every --decode-log-interval "
                    "iterations and whenever the server goes idle"
                ),
            },
        }
    )


async def model_info(request: web.Request) -> web.Response:
    args = state_of(request).args
    return json_response(
        {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
    )


async def generate(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    client = state.ready_client()
    req, stream = parse_generate(state, await read_json(request))
    if client.is_in_flight(req.rid):
        raise RequestError(f"request id {req.rid!r} is already in flight")
    submitted = client.submit(req)

    def payload(rs: RequestState) -> dict[str, Any]:
        return {"text": output_text(state.tokenizer, rs), "output_ids": list(rs.output_ids), "meta_info": client.meta_info(rs)}

    if not stream:
        return json_response(payload(await final_state(client, submitted)))

    async def events() -> AsyncGenerator[bytes, None]:
        async for rs, new_ids, last in client.updates(submitted):
            if new_ids or last:
                yield sse(payload(rs))

    return await stream_response(request, client, submitted, events())


async def flush_cache(request: web.Request) -> web.Response:
    state = state_of(request)
    if state.client is None or not state.ready:
        return web.Response(status=503, text="The server is not ready.\n")
    ok, message = await state.client.flush()
    if ok:
        logger.info("Cache flushed successfully!")
        return web.Response(
            status=200,
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
        )
    logger.warning(message)
    return web.Response(status=400, text=message + "\n")


async def abort_request(request: web.Request) -> web.Response:
    state = state_of(request)
    body = await read_json(request)
    rid = body.get("rid")
    if not isinstance(rid, str):
        raise RequestError("'rid' must be a string")
    if state.client is not None:
        state.client.abort(rid)
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    assert state.metrics is not None
    return web.Response(text=state.metrics.render(), content_type="text/plain", charset="utf-8")


def register(app: web.Application, *, enable_metrics: bool) -> None:
    """Add the native routes to ``app`` (``/metrics`` only with ``--enable-metrics``)."""

    def native(handler: Any) -> Any:
        return route(handler, error=native_error)

    for path, handler in (
        ("/health", health),
        ("/health_generate", health_generate),
        ("/server_info", server_info),
        ("/get_server_info", server_info),
        ("/get_model_info", model_info),
        ("/model_info", model_info),
    ):
        app.router.add_get(path, native(handler))
    app.router.add_post("/generate", native(generate))
    app.router.add_put("/generate", native(generate))
    app.router.add_route("GET", "/flush_cache", native(flush_cache))
    app.router.add_route("POST", "/flush_cache", native(flush_cache))
    app.router.add_post("/abort_request", native(abort_request))
    if enable_metrics:
        app.router.add_get("/metrics", native(metrics))
