"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Shapes follow SGLang's ``entrypoints/openai`` (``choices[].matched_stop``, ``usage``, streaming
chunks, the final usage chunk when ``stream_options.include_usage`` is true, ``data: [DONE]``).
Errors use SGLang's OpenAI error body ``{"object": "error", "message", "type", "param", "code"}``.
Unknown top-level fields are ignored, as SGLang's pydantic models do; parameters the reference
engine cannot honour (``n > 1``, ``logprobs``, ``echo``, tools...) are a 400 that says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Mapping, Optional

from aiohttp import web

from serving.reference.engine_client import RequestState
from serving.reference.http_server import (
    AppState,
    BadRequest,
    check_length,
    dumps,
    json_response,
    output_text,
    read_json,
    request_seed,
    state_of,
)
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.tokenizer import END_OF_TURN_ID, IncrementalDecoder, render_chat

__all__ = ["register"]

logger = logging.getLogger(__name__)


def openai_error(message: str, *, status: int = 400) -> web.Response:
    kind = "BadRequestError" if status == 400 else "ServiceUnavailableError" if status == 503 else "InternalServerError"
    return json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status=status)


def _number(body: Mapping[str, Any], key: str, default: Optional[float]) -> Optional[float]:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{key}' must be a number, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, default: Optional[int]) -> Optional[int]:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r}")
    return value


def _sampling(body: Mapping[str, Any], *, max_tokens: int, extra_stop_ids: tuple[int, ...] = ()) -> SamplingParams:
    """OpenAI fields (plus SGLang's extensions top_k, min_p, ignore_eos...) -> SamplingParams."""
    n = _integer(body, "n", 1)
    if n != 1:
        raise BadRequest(f"'n'={n} is not supported by the reference engine (only 1)")
    for key in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "response_format", "logit_bias"):
        value = body.get(key)
        if value not in (None, False, [], {}) and not (key == "response_format" and value == {"type": "text"}):
            raise BadRequest(f"'{key}' is not supported by the reference engine")
    for key, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if _number(body, key, neutral) != neutral:
            raise BadRequest(f"'{key}' is not supported by the reference engine (only {neutral})")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise BadRequest(f"'stop' must be a string or a list of strings, got {stop!r}")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise BadRequest(f"'stop_token_ids' must be a list of integers, got {stop_ids!r}")
    for key in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
        if key in body and not isinstance(body[key], bool):
            raise BadRequest(f"'{key}' must be true or false, got {body[key]!r}")
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),  # type: ignore[arg-type]
        top_p=_number(body, "top_p", 1.0),  # type: ignore[arg-type]
        top_k=_integer(body, "top_k", -1),  # type: ignore[arg-type]
        min_p=_number(body, "min_p", 0.0),  # type: ignore[arg-type]
        stop=stops,
        stop_token_ids=tuple(stop_ids) + extra_stop_ids,
        ignore_eos=bool(body.get("ignore_eos", False)),
        skip_special_tokens=bool(body.get("skip_special_tokens", True)),
        no_stop_trim=bool(body.get("no_stop_trim", False)),
        sampling_seed=_integer(body, "seed", None),
    )
    try:
        params.verify(field="request")
    except ValueError as exc:
        raise BadRequest(str(exc).replace("request.max_new_tokens", "max_tokens")) from None
    return params


def _max_tokens(body: Mapping[str, Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = _integer(body, key, None)
        if value is not None:
            if value < 0:
                raise BadRequest(f"'{key}' must be at least 0, got {value}")
            return value
    return default


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    return stream, bool(options.get("include_usage", False))


def _finish_reason(state: RequestState) -> Optional[str]:
    if state.finish is None:
        return None
    kind = state.finish.get("type")
    return "stop" if kind == "stop" else "length" if kind == "length" else "abort"


def _usage(state: RequestState) -> dict[str, int]:
    prompt, completion = len(state.req.input_ids), len(state.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _run(
    request: web.Request,
    *,
    state: AppState,
    req: GenerateReq,
    stream: bool,
    include_usage: bool,
    chat: bool,
) -> web.StreamResponse:
    client = state.client
    assert client is not None
    if client.is_in_flight(req.rid):
        return openai_error(f"request id {req.rid!r} is already in flight")
    rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
    created = int(time.time())
    model = state.args.served_model_name
    obj = "chat.completion" if chat else "text_completion"
    iterator = client.generate(req)

    if not stream:
        final: Optional[RequestState] = None
        async for rs, _, last in iterator:
            if last:
                final = rs
        assert final is not None
        text = output_text(state.tokenizer, final)
        matched = (final.finish or {}).get("matched")
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish_reason(final), "matched_stop": matched}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        else:
            choice["text"] = text
        return json_response(
            {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": _usage(final)}
        )

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(choices: list[dict[str, Any]], usage: Optional[dict[str, int]] = None) -> None:
        chunk: dict[str, Any] = {"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            chunk["usage"] = usage
        await response.write(b"data: " + dumps(chunk).encode() + b"\n\n")

    def piece(text: str, finish: Optional[str], matched: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        if chat:
            out["delta"] = {"content": text} if text or finish is None else {}
        else:
            out["text"] = text
        return out

    decoder = IncrementalDecoder()
    sent = ""
    try:
        if chat:
            await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        async for rs, new_ids, last in iterator:
            if not last:
                delta = decoder.push(new_ids)
                if rs.req.params.stop and not rs.req.params.no_stop_trim:
                    # Hold back text that could be the start of a stop string.
                    hold = max(len(s) for s in rs.req.params.stop) - 1
                    visible = decoder.text[: max(len(sent), len(decoder.text) - hold)]
                    delta = visible[len(sent):]
                if delta:
                    sent += delta
                    await send([piece(delta, None)])
                continue
            decoder.push(new_ids, final=True)
            final_text = output_text(state.tokenizer, rs)
            rest = final_text[len(sent):] if final_text.startswith(sent) else ""
            if rest:
                await send([piece(rest, None)])
            await send([piece("", _finish_reason(rs), (rs.finish or {}).get("matched"))])
            if include_usage:
                await send([], _usage(rs))
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        await iterator.aclose()
        raise
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    if not state.healthy or state.client is None:
        return openai_error("the server is not ready", status=503)
    try:
        body = await read_json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = state.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            try:
                ids = state.tokenizer.check_ids(prompt, field="prompt")
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        else:
            raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")
        params = _sampling(body, max_tokens=_max_tokens(body, ("max_tokens",), 16))
        stream, include_usage = _stream_flags(body)
        check_length(state.args, len(ids), params.max_new_tokens)
    except BadRequest as exc:
        return openai_error(str(exc))
    rid = uuid.uuid4().hex
    req = GenerateReq(rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params))
    return await _run(request, state=state, req=req, stream=stream, include_usage=include_usage, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    if not state.healthy or state.client is None:
        return openai_error("the server is not ready", status=503)
    try:
        body = await read_json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        try:
            ids = render_chat(messages)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        params = _sampling(
            body,
            max_tokens=_max_tokens(body, ("max_completion_tokens", "max_tokens"), state.args.context_length - len(ids) - 1),
            extra_stop_ids=(END_OF_TURN_ID,),
        )
        stream, include_usage = _stream_flags(body)
        check_length(state.args, len(ids), params.max_new_tokens)
    except BadRequest as exc:
        return openai_error(str(exc))
    rid = uuid.uuid4().hex
    req = GenerateReq(rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params))
    return await _run(request, state=state, req=req, stream=stream, include_usage=include_usage, chat=True)


async def models(request: web.Request) -> web.Response:
    state = state_of(request)
    args = state.args
    return json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": args.served_model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "sglang",
                    "root": args.model_path,
                    "max_model_len": args.context_length,
                }
            ],
        }
    )


def register(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
