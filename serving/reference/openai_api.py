"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``
and ``/v1/models/{model}``.

Shapes and errors follow SGLang's ``entrypoints/openai``; what is supported and refused is in
docs/reference-engine.md ("SGLang compatibility: requests"). SGLang's opt-in
``return_spec_tokens_details`` adds the response-level ``sglext.spec_tokens_details`` (see
``_respond``); chat's ``chat_template_kwargs`` is checked (an object) and has no effect.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncGenerator, Callable, Mapping, Optional

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
from serving.reference.native_api import MAX_BATCH_SIZE, logprob_options, lora_not_enabled, requested_lora_adapter
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.tokenizer import END_OF_TURN_ID, IncrementalDecoder, render_chat

__all__ = ["openai_error", "register", "sglext_of", "spec_tokens_details"]

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
_UNSUPPORTED = ("echo", "suffix", "tools", "response_format", "logit_bias")
_STREAM_META_INFO = (
    "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true."
)


# SGLang 0.5.23's ``SpecTokensDetails`` (entrypoints/openai/protocol.py): every field, in its
# order, with the default a field takes when meta_info lacks it (or holds a falsy value).
_SPEC_DETAILS_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("spec_accept_rate", 0.0),
    ("spec_accept_length", 0.0),
    ("spec_cap_length", 0.0),
    ("spec_block_accept_length", 0.0),
    ("spec_num_correct_drafts", 0),
    ("spec_num_proposed_drafts", 0),
    ("spec_verify_ct", 0),
    ("spec_correct_drafts_histogram", []),
    ("spec_cap_lens_histogram", []),
)


def openai_error(message: str, status: int) -> dict[str, Any]:
    """SGLang's OpenAI error body."""
    kind = "ServiceUnavailableError" if status == 503 else "BadRequestError" if status < 500 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _sampling(body: Mapping[str, Any], *, max_tokens_keys: tuple[str, ...], default_max_tokens: int) -> SamplingParams:
    """OpenAI fields (plus SGLang's extensions) -> SamplingParams; errors name the OpenAI field."""
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise RequestError(f"'n' must be an integer, got {show(n)}")
        if n != 1:
            raise RequestError(f"'n'={n} is not supported by the reference engine (only 1)")
    _check_model(body)
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


def _bool_field(body: Mapping[str, Any], key: str) -> bool:
    """``body[key]`` as a bool (False when absent); anything else that is not a bool is a 400."""
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise RequestError(f"'{key}' must be true or false, got {show(value)}")
    return value


def _chat_template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's ``chat_template_kwargs``: a JSON object or null (-> {}); anything else is a 400.

    The reference engine's chat template (``render_chat``) takes no keyword arguments, so the
    checked object is accepted and has no effect, as an unused template variable in SGLang."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'chat_template_kwargs' must be an object, got {show(value)}")
    return value


def spec_tokens_details(meta_info: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """SGLang's ``spec_tokens_details_from_meta_info`` (entrypoints/openai/utils.py).

    Returns:
        None when ``meta_info`` has none of the speculative keys (no speculation, or no verify
        pass yet: ``EngineClient.meta_info`` writes them only then); else every
        ``SpecTokensDetails`` field, a missing or falsy one as its default (0.0, 0 or []), as
        SGLang serialises the model (no field is ever left out or null).
    """
    if not any(key in meta_info for key, _ in _SPEC_DETAILS_DEFAULTS):
        return None
    return {key: meta_info.get(key) or (list(default) if isinstance(default, list) else default)
            for key, default in _SPEC_DETAILS_DEFAULTS}


def sglext_of(details: list[Optional[dict[str, Any]]], *, n: int) -> Optional[dict[str, Any]]:
    """The response-level ``sglext`` from each choice's spec details (choice order), as SGLang's
    ``_build_*_response`` / ``_generate_*_stream``: a list when the request's ``n`` > 1, else the
    first choice's details only (also for a batch of prompts); None when no choice has any."""
    present = [d for d in details if d is not None]
    if not present:
        return None
    return {"spec_tokens_details": present if n > 1 else present[0]}


def _finish_reason(state: RequestState) -> Optional[str]:
    if state.finish is None:
        return None
    kind = state.finish.get("type")
    return "stop" if kind == "stop" else "length" if kind == "length" else "abort"


def _usage(states: list[RequestState]) -> dict[str, int]:
    """Summed over a batch's items, as SGLang's ``aggregate_token_usage``."""
    prompt = sum(len(s.req.input_ids) for s in states)
    completion = sum(len(s.output_ids) for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _check_model(body: Mapping[str, Any]) -> None:
    """Refuse a LoRA adapter named by ``model`` (``<base>:<adapter>``) or ``lora_path``, as SGLang
    does without ``--enable-lora`` (``serving_base._parse_model_parameter``)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"'model' must be a string, got {show(model)}")
    adapter = None
    if model and ":" in model:
        adapter = model.split(":", 1)[1].strip() or None
    if adapter is None:
        adapter = requested_lora_adapter(body.get("lora_path"))
    if adapter is not None:
        raise RequestError(lora_not_enabled(adapter))


def _token_text(state: AppState) -> Callable[[int], str]:
    tok = state.tokenizer
    return lambda token: tok.decode([token], skip_special_tokens=False)


def _completion_logprobs(text_of: Callable[[int], str], tokens: list[int], values: list[float], tops: list[Any]) -> dict[str, Any]:
    """SGLang's ``to_openai_style_logprobs``: ``{text_offset, token_logprobs, tokens, top_logprobs}``
    (``text_offset`` is -1 per token: SGLang does not compute it either)."""
    return {
        "text_offset": [-1] * len(tokens),
        "token_logprobs": list(values),
        "tokens": [text_of(t) for t in tokens],
        "top_logprobs": [{text_of(t): v for v, t in row} for row in tops],
    }


def _chat_logprobs(text_of: Callable[[int], str], tokens: list[int], values: list[float], tops: list[Any]) -> dict[str, Any]:
    """SGLang's ``ChoiceLogprobs``: ``{content: [{token, bytes, logprob, top_logprobs}]}``."""

    def entry(text: str, value: float) -> dict[str, Any]:
        return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": value}

    content = []
    for i, (token, value) in enumerate(zip(tokens, values)):
        row = tops[i] if i < len(tops) else ()
        top = [entry(text, v) for text, v in {text_of(t): v for v, t in row}.items()]
        content.append({**entry(text_of(token), value), "top_logprobs": top})
    return {"content": content}


def _logprobs_of(state: AppState, rs: RequestState, start: int, *, chat: bool) -> Optional[dict[str, Any]]:
    """The OpenAI logprobs of ``rs``'s output tokens from ``start`` on (None without logprobs)."""
    if not rs.req.return_logprob:
        return None
    end = len(rs.output_logprobs)
    tokens = rs.output_ids[start:end]
    values = rs.output_logprobs[start:end]
    tops = rs.output_top_logprobs[start:end] if rs.req.top_logprobs_num else []
    shape = _chat_logprobs if chat else _completion_logprobs
    return shape(_token_text(state), tokens, values, tops)


async def _respond(
    request: web.Request,
    *,
    state: AppState,
    client: EngineClient,
    reqs: list[GenerateReq],
    stream: bool,
    include_usage: bool,
    chat: bool,
    return_meta_info: bool = False,
    return_spec_details: bool = False,
) -> web.StreamResponse:
    """Submit ``reqs`` (one, or a completions batch) and answer in SGLang's OpenAI shapes.

    With ``return_spec_details`` (SGLang's ``return_spec_tokens_details``) and speculative
    counters to report, the answer carries SGLang's response-level ``sglext`` (``sglext_of``):
    non-streaming, as a top-level key of the body after ``usage``; streaming, as a chunk of its
    own (``choices: []``, the ``sglext`` key) after every choice's finish chunk and before the
    ``include_usage`` chunk, as SGLang 0.5.23's ``_generate_*_stream``.
    """
    for req in reqs:
        if client.is_in_flight(req.rid):
            raise RequestError(f"request id {req.rid!r} is already in flight")
    prefix = "chatcmpl-" if chat else "cmpl-"
    created = int(time.time())
    model = state.args.served_model_name
    submitted = [client.submit(req) for req in reqs]

    if not stream:
        try:
            finals = await asyncio.gather(*(final_state(client, rs) for rs in submitted))
        finally:
            for rs in submitted:
                if not rs.finished:
                    client.abort(rs.rid)
        choices = []
        for index, final in enumerate(finals):
            text = output_text(state.tokenizer, final)
            matched = (final.finish or {}).get("matched")
            choice: dict[str, Any] = {
                "index": index,
                "logprobs": _logprobs_of(state, final, 0, chat=chat),
                "finish_reason": _finish_reason(final),
                "matched_stop": matched,
            }
            if chat:
                choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            else:
                choice["text"] = text
            if return_meta_info:
                choice["meta_info"] = client.meta_info(final, decode=_token_text(state))  # return_text_in_logprobs
            choices.append(choice)
        obj = "chat.completion" if chat else "text_completion"
        body = {"id": prefix + reqs[0].rid, "object": obj, "created": created, "model": model, "choices": choices,
                "usage": _usage(finals)}
        ext = _request_sglext(client, finals) if return_spec_details else None
        if ext is not None:
            body["sglext"] = ext
        return json_response(body)

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(
        rid: str, choices: list[dict[str, Any]], usage: Optional[dict[str, int]] = None,
        sglext: Optional[dict[str, Any]] = None,
    ) -> bytes:
        out: dict[str, Any] = {"id": prefix + rid, "object": chunk_obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        if sglext is not None:
            out["sglext"] = sglext
        return sse(out)

    def piece(index: int, text: str, finish: Optional[str], matched: Any = None, logprobs: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        if chat:
            out["delta"] = {"content": text} if text or finish is None else {}
        else:
            out["text"] = text
        return out

    async def events() -> AsyncGenerator[bytes, None]:
        decoders = [IncrementalDecoder() for _ in reqs]
        sent = [""] * len(reqs)
        logprobs_sent = [0] * len(reqs)

        def new_logprobs(index: int, rs: RequestState) -> Any:
            """Logprobs of the tokens not yet carried by a chunk (SGLang slices them per chunk)."""
            out = _logprobs_of(state, rs, logprobs_sent[index], chat=chat)
            logprobs_sent[index] = len(rs.output_logprobs)
            return out

        if chat:
            yield chunk(reqs[0].rid, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        async for index, rs, new_ids, last in merged_updates(client, submitted):
            decoder = decoders[index]
            if not last:
                delta = decoder.push(new_ids)
                if rs.req.params.stop and not rs.req.params.no_stop_trim:
                    # Hold back text that could be the start of a stop string.
                    hold = max(len(s) for s in rs.req.params.stop) - 1
                    visible = decoder.text[: max(len(sent[index]), len(decoder.text) - hold)]
                    delta = visible[len(sent[index]):]
                if delta:
                    sent[index] += delta
                    yield chunk(rs.rid, [piece(index, delta, None, logprobs=new_logprobs(index, rs))])
                continue
            decoder.push(new_ids, final=True)
            final_text = output_text(state.tokenizer, rs)
            rest = final_text[len(sent[index]):] if final_text.startswith(sent[index]) else ""
            if rest:
                yield chunk(rs.rid, [piece(index, rest, None, logprobs=new_logprobs(index, rs))])
            tail = new_logprobs(index, rs) if logprobs_sent[index] < len(rs.output_logprobs) else None
            yield chunk(rs.rid, [piece(index, "", _finish_reason(rs), (rs.finish or {}).get("matched"), logprobs=tail)])
        ext = _request_sglext(client, submitted) if return_spec_details else None
        if ext is not None:
            yield chunk(reqs[0].rid, [], sglext=ext)
        if include_usage:
            yield chunk(reqs[0].rid, [], _usage(submitted))

    return await stream_response(request, client, submitted, events())


def _request_sglext(client: EngineClient, finals: list[RequestState]) -> Optional[dict[str, Any]]:
    """``sglext`` for finished requests (one per choice, in choice order), from the same
    ``meta_info`` ``/generate`` returns. ``n`` is 1: the reference engine refuses ``n`` > 1."""
    return sglext_of([spec_tokens_details(client.meta_info(rs)) for rs in finals], n=1)


def _prompts(state: AppState, prompt: Any) -> list[list[int]]:
    """SGLang's completion prompt forms: a string or a list of token ids (one prompt), a list of
    strings or a list of token-id lists (a batch, one choice per prompt)."""
    tok = state.tokenizer
    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [check_ids(tok, prompt, field="prompt")]
        if len(prompt) > MAX_BATCH_SIZE:
            raise RequestError(f"'prompt' holds {len(prompt)} prompts; a batch may hold at most {MAX_BATCH_SIZE}")
        if all(isinstance(p, str) for p in prompt):
            return [tok.encode(p) for p in prompt]
        if all(isinstance(p, list) for p in prompt):
            out = []
            for i, ids in enumerate(prompt):
                if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise RequestError(f"prompt[{i}] must be a non-empty list of token ids, got {show(ids)}")
                out.append(check_ids(tok, ids, field=f"prompt[{i}]"))
            return out
    raise RequestError(
        "'prompt' must be a string, a list of token ids, a list of strings or a list of token-id lists, "
        f"got {show(prompt)}"
    )


async def completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    client = state.ready_client()
    body = await read_json(request)
    prompts = _prompts(state, body.get("prompt"))
    params = _sampling(body, max_tokens_keys=("max_tokens",), default_max_tokens=16)
    stream, include_usage = _stream_flags(body)
    return_spec_details = _bool_field(body, "return_spec_tokens_details")
    logprobs = body.get("logprobs")
    if isinstance(logprobs, bool):
        raise RequestError(f"'logprobs' of /v1/completions is the number of top logprobs (an integer), got {show(logprobs)}")
    reqs = []
    for ids in prompts:
        check_length(state.args, len(ids), params.max_new_tokens)
        options = logprob_options(
            state,
            return_logprob=logprobs is not None,
            top_logprobs_num=logprobs,
            logprob_start_len=None,
            prompt_len=len(ids),
            names=("logprobs", "logprobs", "logprob_start_len"),
        )
        rid = uuid.uuid4().hex
        reqs.append(GenerateReq(rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params), **options))
    return await _respond(
        request, state=state, client=client, reqs=reqs, stream=stream, include_usage=include_usage, chat=False,
        return_spec_details=return_spec_details,
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    client = state.ready_client()
    body = await read_json(request)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    _chat_template_kwargs(body)  # checked; render_chat takes no template kwargs
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
    return_meta_info = _bool_field(body, "return_meta_info")
    return_spec_details = _bool_field(body, "return_spec_tokens_details")
    if stream and return_meta_info:
        raise RequestError(_STREAM_META_INFO)
    logprobs = body.get("logprobs", False)
    if logprobs is None:
        logprobs = False
    if not isinstance(logprobs, bool):
        raise RequestError(f"'logprobs' must be true or false, got {show(logprobs)}")
    check_length(state.args, len(ids), params.max_new_tokens)
    # SGLang: return_logprob=logprobs, top_logprobs_num=top_logprobs or 0 (ignored without logprobs).
    options = logprob_options(
        state,
        return_logprob=logprobs,
        top_logprobs_num=body.get("top_logprobs") if logprobs else None,
        logprob_start_len=None,
        prompt_len=len(ids),
        names=("logprobs", "top_logprobs", "logprob_start_len"),
    )
    rid = uuid.uuid4().hex
    req = GenerateReq(
        rid=rid, input_ids=tuple(ids), params=params, seed=request_seed(state.args, rid, params),
        extra_stop_ids=(END_OF_TURN_ID,), **options,
    )
    return await _respond(
        request, state=state, client=client, reqs=[req], stream=stream, include_usage=include_usage, chat=True,
        return_meta_info=return_meta_info, return_spec_details=return_spec_details,
    )


def _model_card(state: AppState, model_id: str) -> dict[str, Any]:
    """SGLang's ``ModelCard`` for the served model."""
    return {
        "id": model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "sglang",
        "root": model_id,
        "parent": None,
        "max_model_len": state.args.context_length,
    }


async def models(request: web.Request) -> web.Response:
    state = state_of(request)
    return json_response({"object": "list", "data": [_model_card(state, state.args.served_model_name)]})


async def retrieve_model(request: web.Request) -> web.Response:
    """SGLang's ``GET /v1/models/{model:path}``: the served model's card, else SGLang's 404."""
    state = state_of(request)
    model = request.match_info["model"]
    if model != state.args.served_model_name:
        return json_response(
            {
                "error": {
                    "message": f"The model '{model}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            status=404,
        )
    return json_response(_model_card(state, model))


def register(app: web.Application) -> None:
    """Add the OpenAI routes to ``app``; their errors use the OpenAI error shape."""
    app.router.add_post("/v1/completions", route(completions, error=openai_error))
    app.router.add_post("/v1/chat/completions", route(chat_completions, error=openai_error))
    app.router.add_get("/v1/models", route(models, error=openai_error))
    app.router.add_get("/v1/models/{model:.+}", route(retrieve_model, error=openai_error))
