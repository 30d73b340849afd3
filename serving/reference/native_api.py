"""SGLang's native endpoints (``srt/entrypoints/http_server.py``), registered by ``register``.

The routes and their behaviour are listed in docs/reference-engine.md ("HTTP API"); errors are
``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncGenerator, Mapping

from aiohttp import web

from serving.reference.checks import check_int, show
from serving.reference.engine_client import RequestState
from serving.reference.http_common import (
    AppState,
    RequestError,
    StreamInterval,
    check_ids,
    check_length,
    encode_text,
    final_state,
    json_response,
    merged_updates,
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
from serving.reference.server_info import build_server_info
from serving.reference.tokenizer import BOS_ID

__all__ = [
    "HEALTH_CHECK_TIMEOUT_S",
    "MAX_BATCH_SIZE",
    "VERSION",
    "lora_not_enabled",
    "requested_lora_adapter",
    "logprob_options",
    "native_error",
    "parse_generate",
    "register",
]

logger = logging.getLogger(__name__)

VERSION = "0.1.0+spectune.reference"
HEALTH_CHECK_TIMEOUT_S = 20.0


def native_error(message: str, status: int) -> dict[str, Any]:
    """SGLang's native error body."""
    return {"error": {"message": message}}


MAX_BATCH_SIZE = 4096
"""Most items in one batched ``/generate`` or ``/v1/completions`` (SGLang sets none)."""


def parse_generate(state: AppState, body: Mapping[str, Any]) -> tuple[list[GenerateReq], bool, bool]:
    """Validate a ``/generate`` body, as SGLang's ``GenerateReqInput.normalize_batch_and_arguments``.

    Returns:
        The requests, whether the body is a single request (not a batch), and its ``stream`` flag.

    Raises:
        RequestError: the body is invalid; the message names the field.
    """
    tok = state.tokenizer
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'")
    prompts: list[list[int]]
    if text is not None:
        single = not isinstance(text, list)
        items = [text] if single else text
        _check_batch_size(len(items), field="text")
        prompts = [encode_text(tok, t, field="'text'" if single else f"'text[{i}]'") for i, t in enumerate(items)]
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise RequestError("'input_ids' must be a non-empty list of token ids, or a list of such lists (a batch)")
        single = not isinstance(input_ids[0], list)
        if single:
            prompts = [check_ids(tok, input_ids, field="input_ids")]
        else:
            _check_batch_size(len(input_ids), field="input_ids")
            prompts = []
            for i, ids in enumerate(input_ids):
                if not isinstance(ids, list) or not ids:
                    raise RequestError(
                        f"input_ids[{i}] must be a non-empty list of token ids (a batch needs one list per item), "
                        f"got {show(ids)}"
                    )
                prompts.append(check_ids(tok, ids, field=f"input_ids[{i}]"))
    for flag in ("return_hidden_states", "token_ids_logprob"):
        if body.get(flag):
            raise RequestError(f"'{flag}' is not supported by the reference engine")
    lora_path = body.get("lora_path")
    if lora_path is not None and not isinstance(lora_path, (str, list)):
        raise RequestError(f"'lora_path' must be a string or a list of strings, got {show(lora_path)}")
    adapter = requested_lora_adapter(lora_path)
    if adapter is not None:
        raise RequestError(lora_not_enabled(adapter))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {stream!r}")
    n = len(prompts)
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if single:
            raise RequestError("'sampling_params' is a list, which needs a batch: 'text' as a list or 'input_ids' as a list of lists")
        per_item = _per_item(raw_params, n, field="sampling_params")
        params = [sampling_params(p, field=f"sampling_params[{i}]") for i, p in enumerate(per_item)]
    else:
        params = [sampling_params(raw_params)] * n
    logprob = _per_item(body.get("return_logprob"), n, field="return_logprob", single=single)
    top_num = _per_item(body.get("top_logprobs_num"), n, field="top_logprobs_num", single=single)
    start_len = _per_item(body.get("logprob_start_len"), n, field="logprob_start_len", single=single)
    text_in_logprobs = body.get("return_text_in_logprobs", False)
    if not isinstance(text_in_logprobs, bool):
        raise RequestError(f"'return_text_in_logprobs' must be true or false, got {show(text_in_logprobs)}")
    rids = _rids(body.get("rid"), n, single=single)
    reqs = []
    for i, (ids, p, rid) in enumerate(zip(prompts, params, rids)):
        check_length(state.args, len(ids), p.max_new_tokens)
        where = "" if single else f"[{i}]"
        options = logprob_options(
            state,
            return_logprob=logprob[i],
            top_logprobs_num=top_num[i],
            logprob_start_len=start_len[i],
            prompt_len=len(ids),
            names=(f"return_logprob{where}", f"top_logprobs_num{where}", f"logprob_start_len{where}"),
        )
        reqs.append(GenerateReq(rid=rid, input_ids=tuple(ids), params=p, seed=request_seed(state.args, rid, p), **options))
    return reqs, single, stream


def requested_lora_adapter(lora_path: Any) -> Any:
    """The first adapter a ``lora_path`` (a string or a list) names, else None."""
    if isinstance(lora_path, str):
        return lora_path or None
    if isinstance(lora_path, list):
        return next((a for a in lora_path if a), None)
    return None


def lora_not_enabled(adapter: Any) -> str:
    """SGLang's message for a LoRA adapter asked of a server without ``--enable-lora``
    (``tokenizer_manager._validate_and_resolve_lora``)."""
    return (
        f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. "
        "Please launch the server with --enable-lora flag and preload adapters "
        "using --lora-paths or /load_lora_adapter endpoint."
    )


def logprob_options(
    state: AppState,
    *,
    return_logprob: Any,
    top_logprobs_num: Any,
    logprob_start_len: Any,
    prompt_len: int,
    names: tuple[str, str, str] = ("return_logprob", "top_logprobs_num", "logprob_start_len"),
) -> dict[str, Any]:
    """Checked logprob fields of one request, as ``GenerateReq`` keywords (None: the default).

    Raises:
        RequestError: a field has the wrong type or is out of range.
    """
    flag_name, top_name, start_name = names
    if return_logprob is None:
        return_logprob = False
    if not isinstance(return_logprob, bool):
        raise RequestError(f"'{flag_name}' must be true or false, got {show(return_logprob)}")
    vocab = state.tokenizer.vocab_size
    top = 0 if top_logprobs_num is None else _int(top_logprobs_num, name=top_name, low=0, high=vocab)
    start = -1 if logprob_start_len is None else _int(logprob_start_len, name=start_name, low=-1, high=prompt_len - 1)
    return {"return_logprob": return_logprob, "top_logprobs_num": top, "logprob_start_len": start}


def _int(value: Any, *, name: str, low: int, high: int) -> int:
    try:
        return check_int(value, name=f"'{name}'", low=low, high=high)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def _check_batch_size(n: int, *, field: str) -> None:
    if n == 0:
        raise RequestError(f"'{field}' is an empty list; a batch needs at least one item")
    if n > MAX_BATCH_SIZE:
        raise RequestError(f"'{field}' holds {n} items; a batch may hold at most {MAX_BATCH_SIZE}")


def _per_item(value: Any, n: int, *, field: str, single: bool = False) -> list[Any]:
    """One value per item; a list needs a batch and one entry per item."""
    if not isinstance(value, list):
        return [value] * n
    if single:
        raise RequestError(f"'{field}' is a list, which needs a batch: 'text' as a list or 'input_ids' as a list of lists")
    if len(value) != n:
        raise RequestError(f"'{field}' has {len(value)} entries for a batch of {n}; give one per item (or one value for all)")
    return value


def _rids(rid: Any, n: int, *, single: bool) -> list[str]:
    """SGLang's ``_normalize_rid``: fresh ids, ``<rid>_<i>`` from one string, or a list of n."""
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(rid, str) and rid:
        return [rid] if single else [f"{rid}_{i}" for i in range(n)]
    if isinstance(rid, list) and not single:
        if len(rid) != n:
            raise RequestError(f"'rid' has {len(rid)} entries for a batch of {n}; give one per item")
        for i, r in enumerate(rid):
            if not isinstance(r, str) or not r:
                raise RequestError(f"'rid[{i}]' must be a non-empty string, got {show(r)}")
        duplicates = sorted({r for r in rid if rid.count(r) > 1})
        if duplicates:
            raise RequestError(f"Duplicate request IDs detected within the request: {duplicates}")
        return list(rid)
    raise RequestError(f"'rid' must be a non-empty string{'' if single else ' or a list of them'}, got {show(rid)}")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if state_of(request).healthy else 503)


async def health_generate(request: web.Request) -> web.Response:
    """200 once a 1-token generation completes or the engine is seen producing tokens, as SGLang."""
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
    return json_response(build_server_info(state_of(request), version=VERSION))


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
    """SGLang's ``/generate``: one result, or a list of per-item results for a batch."""
    state = state_of(request)
    client = state.ready_client()
    body = await read_json(request)
    reqs, single, stream = parse_generate(state, body)
    for req in reqs:
        if client.is_in_flight(req.rid):
            raise RequestError(f"Duplicate request ID detected: {req.rid!r} is already in flight")
    decode = _decoder(state) if body.get("return_text_in_logprobs") else None
    submitted = [client.submit(req) for req in reqs]

    def payload(rs: RequestState) -> dict[str, Any]:
        return {
            "text": output_text(state.tokenizer, rs),
            "output_ids": list(rs.output_ids),
            "meta_info": client.meta_info(rs, decode=decode),
        }

    if not stream:
        if single:
            return json_response(payload(await final_state(client, submitted[0])))
        try:
            done = await asyncio.gather(*(final_state(client, rs) for rs in submitted))
        finally:
            for rs in submitted:
                if not rs.finished:
                    client.abort(rs.rid)
        return json_response([payload(rs) for rs in done])

    intervals = [StreamInterval(req.params.stream_interval) for req in reqs]

    async def events() -> AsyncGenerator[bytes, None]:
        if single:
            async for rs, new_ids, last in client.updates(submitted[0]):
                if intervals[0].due(rs, new_ids, last):
                    yield sse(payload(rs))
            return
        def chunk(index: int, rs: RequestState, new_ids: tuple[int, ...], last: bool) -> bytes | None:
            return sse({**payload(rs), "index": index}) if intervals[index].due(rs, new_ids, last) else None

        async for _, event, _, _ in merged_updates(client, submitted, snapshot=chunk):
            if event is not None:
                yield event

    return await stream_response(request, client, submitted, events())


def _decoder(state: AppState) -> Any:
    """Token id -> its text, special tokens kept."""
    tok = state.tokenizer
    return lambda token: tok.decode([token], skip_special_tokens=False)


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
