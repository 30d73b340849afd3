"""What the native and the OpenAI routes share: state, reading a body, errors, streams, checks.

Bad input becomes a ``RequestError`` (400, 413, 503) that ``route`` renders in the route
family's error shape; see docs/reference-engine.md ("Bad input").
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import logging
import time
import zlib
from typing import Any, AsyncGenerator, Awaitable, Callable, Optional, Sequence

from aiohttp import web

from serving.reference.checks import show
from serving.reference.engine_client import EngineClient, RequestState
from serving.reference.metrics import ReferenceMetrics
from serving.reference.sampling import SamplingParams
from serving.reference.server_args import ServerArgs
from serving.reference.tokenizer import ByteTokenizer

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "STATE_KEY",
    "AppState",
    "ErrorShape",
    "RequestError",
    "StreamInterval",
    "check_ids",
    "check_length",
    "dumps",
    "encode_text",
    "final_state",
    "json_response",
    "merged_updates",
    "output_text",
    "read_json",
    "request_seed",
    "route",
    "sampling_params",
    "sse",
    "state_of",
    "stream_response",
]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (413 beyond)."""
MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects accepted in a request body (no request needs more)."""

ErrorShape = Callable[[str, int], dict[str, Any]]
"""A route family's error body for (message, status)."""


class RequestError(Exception):
    """A request the server refuses; the message names the field, the value and what is allowed.

    Attributes:
        status: The HTTP status to answer (400 unless said otherwise).
    """

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
    decode_cuda_graph_bs: tuple[int, ...] = ()  # what rank 0 captured (WorkerReady)
    graph_memory_gb: float = 0.0
    startup_time: Optional[float] = None  # seconds from process start to ready (/server_info)
    drop_fields: tuple[str, ...] = ()  # the drop_field fault: /server_info and meta_info keys never sent

    @property
    def healthy(self) -> bool:
        return self.ready and self.client is not None and not self.client.workers.dead_ranks()

    def ready_client(self) -> EngineClient:
        """The engine client, or a 503 ``RequestError`` while the server is not ready."""
        if not self.healthy or self.client is None:
            raise RequestError("the server is not ready", status=503)
        return self.client


STATE_KEY = web.AppKey("reference_state", AppState)


def state_of(request: web.Request) -> AppState:
    return request.app[STATE_KEY]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_response(obj: Any, *, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=dumps)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route(handler: Handler, *, error: ErrorShape) -> Handler:
    """``handler`` with its ``RequestError`` answered in the route family's error shape.

    Anything else propagates: a bug stays a 500 with a traceback in the log, where it belongs.
    """

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            return json_response(error(str(exc), exc.status), status=exc.status)

    guarded.__name__ = handler.__name__
    guarded.__doc__ = handler.__doc__
    return guarded


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object whose strings are valid Unicode, or ``RequestError``.

    The charset of ``Content-Type`` is honoured (UTF-8 without one); an unknown one is a 400.
    """
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            f"request body is larger than {MAX_BODY_BYTES} bytes; send less", status=413
        ) from None
    charset = request.charset or "utf-8"
    try:
        codecs.lookup(charset)
        text = raw.decode(charset)
    except LookupError:
        raise RequestError(
            f"Content-Type charset {show(charset)} is not a known text encoding; send UTF-8 JSON"
        ) from None
    except UnicodeError as exc:
        raise RequestError(f"request body is not valid {charset}: {exc}") from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise RequestError(
            f"request body is nested too deeply; at most {MAX_JSON_DEPTH} levels of arrays and objects"
        ) from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    _check_document(body)
    return body


Crumb = Optional[tuple[Any, Any]]
"""Where a value sits in the body: (the parent's crumb, its key or index), None for the top."""


def _check_document(body: Any) -> None:
    """Check the depth and Unicode validity (no lone surrogates) of a parsed body, iteratively."""
    stack: list[tuple[Any, int, Crumb]] = [(body, 0, None)]
    while stack:
        container, depth, crumb = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            raise RequestError(f"request body is nested more than {MAX_JSON_DEPTH} levels deep (at {_path(crumb)})")
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, item in items:
            if isinstance(key, str) and not _valid_text(key):
                raise _surrogate_error(key, (crumb, key))
            if isinstance(item, str):
                if not _valid_text(item):
                    raise _surrogate_error(item, (crumb, key))
            elif isinstance(item, (dict, list)):
                stack.append((item, depth + 1, (crumb, key)))


def _path(crumb: Crumb) -> str:
    parts: list[str] = []
    while crumb is not None:
        crumb, key = crumb
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = "".join(reversed(parts)).lstrip(".")
    return text.encode("utf-8", "backslashreplace").decode("utf-8") or "the top"


def _valid_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_error(text: str, crumb: Crumb) -> RequestError:
    bad = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    return RequestError(
        f"{_path(crumb)} contains {ascii(bad)}, a lone surrogate that is not valid Unicode; send valid UTF-8 text"
    )


def encode_text(tokenizer: ByteTokenizer, text: object, *, field: str) -> list[int]:
    """A prompt string -> token ids (``RequestError`` naming ``field`` if it is not a string)."""
    if not isinstance(text, str):
        raise RequestError(f"{field} must be a string, got {type(text).__name__}")
    return tokenizer.encode(text)


def check_ids(tokenizer: ByteTokenizer, ids: list[Any], *, field: str) -> list[int]:
    """Client-supplied token ids, checked against the vocabulary."""
    try:
        return tokenizer.check_ids(ids, field=field)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def sampling_params(raw: Any, *, field: str = "sampling_params", names: Optional[dict[str, str]] = None) -> SamplingParams:
    """``SamplingParams.from_request`` with its ``ValueError`` as a 400."""
    try:
        return SamplingParams.from_request(raw, field=field, names=names)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def request_seed(args: ServerArgs, rid: str, params: SamplingParams) -> int:
    """``sampling_seed`` if given, else derived from ``--random-seed`` and the request id."""
    if params.sampling_seed is not None:
        return params.sampling_seed
    return zlib.crc32(f"{args.random_seed}:{rid}".encode())


def check_length(args: ServerArgs, n_input: int, max_new_tokens: int) -> None:
    """SGLang's context-length checks (same messages)."""
    if n_input >= args.context_length:
        raise RequestError(
            f"The input ({n_input} tokens) is longer than the model's context length "
            f"({args.context_length} tokens)."
        )
    if max_new_tokens + n_input >= args.context_length:
        raise RequestError(
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


async def stream_response(
    request: web.Request,
    client: EngineClient,
    states: RequestState | Sequence[RequestState],
    events: AsyncGenerator[bytes, None],
) -> web.StreamResponse:
    """Answer submitted requests as server-sent ``events``, then ``data: [DONE]``.

    If the client goes away or the handler is cancelled, the requests are aborted in the engine.
    """
    submitted = [states] if isinstance(states, RequestState) else list(states)
    rids = ", ".join(s.rid for s in submitted)
    for state in submitted:
        state.is_streaming = True  # before the first await: no token of this request is observed yet
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        try:
            await response.prepare(request)
        except ConnectionResetError:
            logger.debug("client of %s went away before the response started; request %s aborted", request.path, rids)
            for state in submitted:
                client.abort(state.rid)
            return response
        try:
            async for event in events:
                await response.write(event)
            await response.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            logger.debug("client of %s went away mid-stream; request %s aborted", request.path, rids)
            for state in submitted:
                client.abort(state.rid)
        return response
    finally:
        await events.aclose()


async def merged_updates(
    client: EngineClient, states: Sequence[RequestState],
    snapshot: Optional[Callable[[int, RequestState, tuple[int, ...], bool], Any]] = None,
) -> AsyncGenerator[tuple[int, Any, tuple[int, ...], bool], None]:
    """``client.updates`` of several requests as one stream of (item index, state, new ids,
    is_last), in the order produced (SGLang's ``_handle_batch_request``). Closing it aborts what
    is left. ``snapshot(index, state, new_ids, is_last)``, where given, renders each update as it
    arrives (a state is live) and takes the state's place."""
    queue: asyncio.Queue[tuple[int, Any, tuple[int, ...], bool]] = asyncio.Queue()

    async def pump(index: int, state: RequestState) -> None:
        async for rs, new_ids, last in client.updates(state):
            shot = rs if snapshot is None else snapshot(index, rs, new_ids, last)
            queue.put_nowait((index, shot, new_ids, last))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(states)]
    try:
        remaining = len(states)
        while remaining:
            item = await queue.get()
            if item[3]:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        for state in states:
            if not state.finished:
                client.abort(state.rid)


class StreamInterval:
    """The per-request ``stream_interval`` rule: a chunk when the output length ``% interval == 1``,
    and at the end (docs/reference-engine.md, "SGLang compatibility: requests")."""

    def __init__(self, interval: Optional[int]) -> None:
        self.interval = interval or 1

    def due(self, state: RequestState, new_ids: tuple[int, ...], last: bool) -> bool:
        if last:
            return True
        if not new_ids:
            return False
        if self.interval == 1:
            return True
        return len(state.output_ids) % self.interval == 1


async def final_state(client: EngineClient, state: RequestState) -> RequestState:
    """Wait for a submitted request to finish (aborted in the engine if this is cancelled)."""
    async for _ in client.updates(state):
        pass
    return state


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + dumps(obj).encode() + b"\n\n"
