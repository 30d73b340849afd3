"""The HTTP API (aiohttp): SGLang's native endpoints; the OpenAI ones live in ``openai_api``.

Endpoints and fields follow ``sglang/srt/entrypoints/http_server.py``:

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

Bad input is answered 400 with ``{"error": {"message": ...}}`` and the server keeps serving. One
deliberate difference: SGLang reports a validation error of a *streaming* ``/generate`` as an SSE
event after a 200; here validation happens before the stream starts, so it is a plain 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
import zlib
from typing import Any, Mapping, Optional

from aiohttp import web

from serving.reference.engine_client import EngineClient, RequestState
from serving.reference.metrics import ReferenceMetrics
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.server_args import ServerArgs
from serving.reference.tokenizer import BOS_ID, ByteTokenizer

__all__ = ["VERSION", "AppState", "BadRequest", "build_app"]

logger = logging.getLogger(__name__)

VERSION = "0.1.0+spectune.reference"
HEALTH_CHECK_TIMEOUT_S = 20.0
MAX_BODY_BYTES = 64 * 1024 * 1024


class BadRequest(ValueError):
    """A client error; the message names the field and the value."""


@dataclasses.dataclass
class AppState:
    """What the handlers share."""

    args: ServerArgs
    tokenizer: ByteTokenizer
    metrics: Optional[ReferenceMetrics]
    client: Optional[EngineClient] = None
    ready: bool = False
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    worker_info: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    max_total_num_tokens: int = 0

    @property
    def healthy(self) -> bool:
        return self.ready and self.client is not None and not self.client.workers.dead_ranks()


STATE_KEY: Any = web.AppKey("reference_state", AppState) if hasattr(web, "AppKey") else "reference_state"


def state_of(request: web.Request) -> AppState:
    return request.app[STATE_KEY]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_response(obj: Any, *, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=dumps)


def error_response(message: str, *, status: int = 400) -> web.Response:
    """SGLang's native error body."""
    return json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or ``BadRequest``."""
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def request_seed(args: ServerArgs, rid: str, params: SamplingParams) -> int:
    """The request's sampling seed: ``sampling_seed`` if given, else derived from the server
    seed and the request id (so every TP rank draws the same numbers)."""
    if params.sampling_seed is not None:
        return params.sampling_seed
    return zlib.crc32(f"{args.random_seed}:{rid}".encode())


def check_length(args: ServerArgs, n_input: int, max_new_tokens: int) -> None:
    """SGLang's context-length checks (same messages)."""
    if n_input >= args.context_length:
        raise BadRequest(
            f"The input ({n_input} tokens) is longer than the model's context length "
            f"({args.context_length} tokens)."
        )
    if max_new_tokens + n_input >= args.context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {args.context_length} "
            f"tokens. You requested a total of {max_new_tokens + n_input} tokens: {n_input} tokens from "
            f"the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit."
        )


def output_text(tokenizer: ByteTokenizer, state: RequestState) -> str:
    """Decoded output, trimmed at a matched stop string unless ``no_stop_trim``."""
    params = state.req.params
    text = tokenizer.decode(state.output_ids, skip_special_tokens=params.skip_special_tokens)
    finish = state.finish or {}
    matched = finish.get("matched")
    if finish.get("type") == "stop" and isinstance(matched, str) and not params.no_stop_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    return text


def parse_generate(state: AppState, body: Mapping[str, Any]) -> tuple[GenerateReq, bool]:
    """Validate a ``/generate`` body into a request and its ``stream`` flag."""
    args, tok = state.args, state.tokenizer
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, list):
            raise BadRequest("batched 'text' (a list) is not supported by the reference engine; send one request each")
        if not isinstance(text, str):
            raise BadRequest(f"'text' must be a string, got {type(text).__name__}")
        ids = tok.encode(text)
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise BadRequest("'input_ids' must be a non-empty list of token ids")
        if isinstance(input_ids[0], list):
            raise BadRequest("batched 'input_ids' is not supported by the reference engine; send one request each")
        try:
            ids = tok.check_ids(input_ids, field="input_ids")
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    for flag in ("return_logprob", "return_hidden_states"):
        if body.get(flag):
            raise BadRequest(f"'{flag}' is not supported by the reference engine")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    try:
        params = SamplingParams.from_request(body.get("sampling_params"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    check_length(args, len(ids), params.max_new_tokens)
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif not isinstance(rid, str) or not rid:
        raise BadRequest(f"'rid' must be a non-empty string, got {rid!r}")
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
    if not state.healthy or state.client is None:
        return error_response("the server is not ready", status=503)
    try:
        req, stream = parse_generate(state, await read_json(request))
    except BadRequest as exc:
        return error_response(str(exc))
    if state.client.is_in_flight(req.rid):
        return error_response(f"request id {req.rid!r} is already in flight")
    iterator = state.client.generate(req)

    def payload(rs: RequestState) -> dict[str, Any]:
        return {
            "text": output_text(state.tokenizer, rs),
            "output_ids": list(rs.output_ids),
            "meta_info": state.client.meta_info(rs),  # type: ignore[union-attr]
        }

    if not stream:
        final: Optional[RequestState] = None
        async for rs, _, last in iterator:
            if last:
                final = rs
        assert final is not None
        return json_response(payload(final))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        async for rs, new_ids, last in iterator:
            if new_ids or last:
                await response.write(b"data: " + dumps(payload(rs)).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        await iterator.aclose()
        raise
    return response


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
    try:
        body = await read_json(request)
    except BadRequest as exc:
        return error_response(str(exc))
    rid = body.get("rid")
    if not isinstance(rid, str):
        return error_response("'rid' must be a string")
    if state.client is not None:
        state.client.abort(rid)
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    assert state.metrics is not None
    return web.Response(text=state.metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(state: AppState) -> web.Application:
    """The aiohttp application with every route registered."""
    from serving.reference import openai_api

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_route("GET", "/flush_cache", flush_cache)
    app.router.add_route("POST", "/flush_cache", flush_cache)
    app.router.add_post("/abort_request", abort_request)
    if state.args.enable_metrics:
        app.router.add_get("/metrics", metrics)
    openai_api.register(app)
    return app
