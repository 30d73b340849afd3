"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Shapes follow SGLang's ``entrypoints/openai`` (``choices[].matched_stop``, ``usage``, streaming
chunks, the final usage chunk when ``stream_options.include_usage`` is true, ``data: [DONE]``).
Errors use SGLang's OpenAI error body ``{"object": "error", "message", "type", "param", "code"}``.
Unknown top-level fields are ignored, as SGLang's pydantic models do; parameters the reference
engine cannot honour (``n > 1``, ``logprobs``, ``echo``, tools...) are a 400 that says so.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, AsyncGenerator, Mapping, Optional

from aiohttp import web

from serving.reference.checks import show
from serving.reference.engine_client import EngineClient, RequestState
from serving.reference.http_common import (
    AppState,
    RequestError,
    check_ids,
    check_length,
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
from serving.reference.tokenizer import END_OF_TURN_ID, IncrementalDecoder, render_chat

__all__ = ["openai_error", "register"]

logger = logging.getLogger(__name__)

# OpenAI (and SGLang-extension) request fields -> SamplingParams fields.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "seed": "sampling_seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
}
_UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "tools", "response_format", "logit_bias")


def openai_error(message: str, status: int) -> dict[str, Any]:
    """SGLang's OpenAI error body."""
    kind = "ServiceUnavailableError" if status == 503 else "BadRequestError" if status < 500 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _sampling(body: Mapping[str, Any], *, max_tokens_keys: tuple[str, ...], default_max_tokens: int) -> SamplingParams:
    """OpenAI fields (plus SGLang's extensions top_k, min_p, ignore_eos...) -> SamplingParams,
    through the same validation as ``/generate``'s ``sampling_params`` (errors name the OpenAI field)."""
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise RequestError(f"'n' must be an integer, got {show(n)}")
        if n != 1:
            raise RequestError(f"'n'={n} is not supported by the reference engine (only 1)")
    for key in _UNSUPPORTED:
        value = body.get(key)
        if value not in (None, False, [], {}) and not (key == "response_format" and value == {"type": "text"}):
            raise RequestError(f"'{key}' is not supported by the reference engine")
    raw = {ours: body[theirs] for theirs, ours in _SAMPLING_FIELDS.items() if body.get(theirs) is not None}
    names = {ours: theirs for theirs, ours in _SAMPLING_FIELDS.items()}
    key = next((k for k in max_tokens_keys if body.get(k) is not None), None)
    raw["max_new_tokens"] = body[key] if key is not None else default_max_tokens
    names["max_new_tokens"] = key or max_tokens_keys[0]
    return sampling_params(raw, field="request", names=names)


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {show(stream)}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object")
    return stream, bool(options.get("include_usage", False))


def _finish_reason(state: RequestState) -> Optional[str]:
    if state.finish is None:
        return None
    kind = state.finish.get("type")
    return "stop" if kind == "stop" else "length" if kind == "length" else "abort"


def _usage(state: RequestState) -> dict[str, int]:
    prompt, completion = len(state.req.input_ids), len(state.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _respond(
    request: web.Request,
    *,
    state: AppState,
    client: EngineClient,
    req: GenerateReq,
    stream: bool,
    include_usage: bool,
    chat: bool,
) -> web.StreamResponse:
    if client.is_in_flight(req.rid):
        raise RequestError(f"request id {req.rid!r} is already in flight")
    rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
    created = int(time.time())
    model = state.args.served_model_name
    submitted = client.submit(req)

    if not stream:
        final = await final_state(client, submitted)
        text = output_text(state.tokenizer, final)
        matched = (final.finish or {}).get("matched")
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish_reason(final), "matched_stop": matched}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        else:
            choice["text"] = text
        obj = "chat.completion" if chat else "text_completion"
        return json_response(
            {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": _usage(final)}
        )

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], usage: Optional[dict[str, int]] = None) -> bytes:
        out: dict[str, Any] = {"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return sse(out)

    def piece(text: str, finish: Optional[str], matched: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        if chat:
            out["delta"] = {"content": text} if text or finish is None else {}
        else:
            out["text"] = text
        return out

    async def events() -> AsyncGenerator[bytes, None]:
        decoder = IncrementalDecoder()
        sent = ""
        if chat:
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        async for rs, new_ids, last in client.updates(submitted):
            if not last:
                delta = decoder.push(new_ids)
                if rs.req.params.stop and not rs.req.params.no_stop_trim:
                    # Hold back text that could be the start of a stop string.
                    hold = max(len(s) for s in rs.req.params.stop) - 1
                    visible = decoder.text[: max(len(sent), len(decoder.text) - hold)]
                    delta = visible[len(sent):]
                if delta:
                    sent += delta
                    yield chunk([piece(delta, None)])
                continue
            decoder.push(new_ids, final=True)
            final_text = output_text(state.tokenizer, rs)
            rest = final_text[len(sent):] if final_text.startswith(sent) else ""
            if rest:
                yield chunk([piece(rest, None)])
            yield chunk([piece("", _finish_reason(rs), (rs.finish or {}).get("matched"))])
            if include_usage:
                yield chunk([], _usage(rs))

    return await stream_response(request, client, submitted, events())


async def completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    client = state.ready_client()
    body = await read_json(request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = check_ids(state.tokenizer, prompt, field="prompt")
    else:
        raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)")
    params = _sampling(body, max_tokens_keys=("max_tokens",), default_max_tokens=16)
    stream, include_usage = _stream_flags(body)
    check_length(state.args, len(ids), params.max_new_tokens)
    rid = uuid.uuid4().hex
    req = GenerateReq(rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params))
    return await _respond(request, state=state, client=client, req=req, stream=stream, include_usage=include_usage, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    client = state.ready_client()
    body = await read_json(request)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    try:
        ids = render_chat(messages)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    params = _sampling(
        body,
        max_tokens_keys=("max_completion_tokens", "max_tokens"),
        default_max_tokens=max(0, state.args.context_length - len(ids) - 1),
    )
    stream, include_usage = _stream_flags(body)
    check_length(state.args, len(ids), params.max_new_tokens)
    rid = uuid.uuid4().hex
    req = GenerateReq(
        rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params),
        extra_stop_ids=(END_OF_TURN_ID,),
    )
    return await _respond(request, state=state, client=client, req=req, stream=stream, include_usage=include_usage, chat=True)


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
    """Add the OpenAI routes to ``app``; their errors use the OpenAI error shape."""
    app.router.add_post("/v1/completions", route(completions, error=openai_error))
    app.router.add_post("/v1/chat/completions", route(chat_completions, error=openai_error))
    app.router.add_get("/v1/models", route(models, error=openai_error))
