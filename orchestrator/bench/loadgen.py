"""The load generator: sends requests, returns one record per request, never raises per request.

Speaks SGLang's native ``/generate`` (SSE) and OpenAI ``/v1/completions`` and
``/v1/chat/completions``, in closed loop (a fixed number in flight) or open loop (Poisson arrivals,
capped at the concurrency). A failed request becomes a record with ``error`` and ``error_kind``;
a server that refuses connections or looks hung stops the run early (``not_sent``, ``abandoned``,
:attr:`LoadResult.hung`). See docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import aiohttp
from pydantic import BaseModel, Field

__all__ = [
    "ApiKind",
    "ErrorKind",
    "LoadResult",
    "RequestRecord",
    "Sampling",
    "WorkItem",
    "build_payload",
    "endpoint_path",
    "run_load",
    "send_request",
]

logger = logging.getLogger(__name__)

ApiKind = Literal["generate", "completions", "chat"]
"""``generate``: SGLang native; ``completions`` / ``chat``: OpenAI-compatible."""

ErrorKind = Literal[
    "connection",  # could not connect (refused, reset before a response)
    "http_4xx",  # the server rejected the request
    "http_5xx",  # the server failed
    "timeout",  # no complete response within request_timeout_s
    "dropped_stream",  # the response ended before the request finished
    "server_error",  # the server reported an error inside a 200 response (SSE error event, abort)
    "bad_response",  # the response could not be understood
    "not_sent",  # not sent: the server had stopped accepting connections, or looked hung
    "abandoned",  # in flight when the run was stopped because the engine looked hung
]

_PATHS: dict[str, str] = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


class RequestRecord(BaseModel):
    """What happened to one request. Times are client-side wall times (``time.perf_counter``)."""

    index: int = Field(description="Position of the request in its run.")
    prompt_id: str = Field(description="Id of the prompt sent.")
    sent_s: float | None = Field(default=None, description="When it was sent, seconds after the run started.")
    scheduled_s: float | None = Field(
        default=None, description="Open loop: its scheduled arrival, seconds after the run started (None in closed loop)."
    )
    queue_delay_ms: float | None = Field(
        default=None,
        description="Open loop: scheduled arrival to sent (waiting for a slot under the concurrency cap); "
        "included in ttft_ms and e2e_ms. None in closed loop.",
    )
    ttft_ms: float | None = Field(
        default=None,
        description="Start to first chunk carrying output (streamed only); the start is the send in closed "
        "loop and the scheduled arrival in open loop.",
    )
    e2e_ms: float | None = Field(default=None, description="Start (as for ttft_ms) to last byte received.")
    num_chunks: int | None = Field(default=None, description="Streamed chunks that carried output.")
    output_tokens: int | None = Field(default=None, description="The server's completion_tokens.")
    prompt_tokens: int | None = Field(default=None, description="The server's prompt_tokens.")
    spec_verify_ct: int | None = Field(default=None, description="meta_info.spec_verify_ct: verify cycles.")
    spec_accept_length: float | None = Field(
        default=None, description="meta_info.spec_accept_length as sent (counts the prefill token)."
    )
    spec_correct_drafts: int | None = Field(
        default=None,
        description="Draft tokens accepted (bonus excluded): meta_info.spec_num_correct_drafts (SGLang "
        "0.5.23+), spec_accepted_drafts (earlier 0.5.x) or spec_accept_token_num (older); None if absent.",
    )
    spec_proposed_drafts: int | None = Field(
        default=None,
        description="Draft tokens proposed = spec_verify_ct * (num_draft_tokens - 1): meta_info."
        "spec_num_proposed_drafts, spec_proposed_drafts or spec_draft_token_num; None if absent.",
    )
    spec_correct_drafts_histogram: list[int] | None = Field(
        default=None, description="meta_info.spec_correct_drafts_histogram: [k] = this request's verify cycles that "
        "accepted k drafts, bonus excluded (SGLang 0.5.23's Req.update_spec_correct_drafts_histogram); None if absent.")
    server_e2e_latency_s: float | None = Field(default=None, description="meta_info.e2e_latency (server side).")
    finish_reason: str | None = Field(default=None, description="Why generation stopped (length, stop, ...).")
    status: int | None = Field(default=None, description="HTTP status.")
    error: str | None = Field(default=None, description="What went wrong; None for a successful request.")
    error_kind: ErrorKind | None = Field(default=None, description="Category of the error.")
    output_text: str | None = Field(default=None, description="Generated text (kept only when asked).")
    output_ids: list[int] | None = Field(default=None, description="Generated token ids (non-streamed native only).")


class Sampling(BaseModel):
    """Pinned sampling for every request of a run."""

    max_new_tokens: int = Field(ge=1, description="Output length cap.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy.")
    seed: int = Field(default=0, ge=0, description="Sampling seed (sent only where it matters: temperature > 0).")
    ignore_eos: bool = Field(default=True, description="Generate exactly max_new_tokens (SGLang/vLLM extension).")


@dataclass(frozen=True)
class WorkItem:
    """One request to send: a prompt and its id, and (a request replayed from a log) its own messages,
    output cap and sampling, which take the place of the run's (the cap never above the run's)."""

    prompt_id: str
    text: str
    messages: tuple[tuple[str, str], ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class LoadResult:
    """Records in request order plus the wall time of the whole load phase.

    ``hung`` is set (to why) when the run was stopped early because the engine looked hung:
    ``hang_limit`` requests in a row timed out with none completing in between.
    """

    records: list[RequestRecord]
    duration_s: float
    hung: str | None = None


def endpoint_path(api: ApiKind) -> str:
    """The URL path each API is served at."""
    return _PATHS[api]


def build_payload(*, api: ApiKind, text: str, sampling: Sampling, stream: bool, model: str | None,
                  item: WorkItem | None = None, chat_template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one request, in the API's own field names (OpenAI's with
    ``stream_options.include_usage``, so the final chunk carries the token count, and SGLang's
    ``return_spec_tokens_details``, so it carries the request's speculative counters under
    ``sglext.spec_tokens_details``: SGLang 0.5.23 ``entrypoints/openai/protocol.py``).

    ``item`` (a request replayed from a log) brings its own messages (chat), output cap (never above
    ``sampling.max_new_tokens``), temperature and top_p. ``chat_template_kwargs`` goes to the chat API
    as is (SGLang passes it to the model's chat template, e.g. Kimi's thinking switch).
    """
    max_new = sampling.max_new_tokens
    temperature = sampling.temperature
    top_p = None
    if item is not None:
        if item.max_tokens is not None:
            max_new = min(max_new, item.max_tokens)
        if item.temperature is not None:
            temperature = item.temperature
        top_p = item.top_p
    if api == "generate":
        params: dict[str, Any] = {"temperature": temperature, "max_new_tokens": max_new}
        if top_p is not None:
            params["top_p"] = top_p
        if sampling.ignore_eos:
            params["ignore_eos"] = True
        if temperature > 0:
            params["sampling_seed"] = sampling.seed
        return {"text": text, "sampling_params": params, "stream": stream}
    body: dict[str, Any] = {
        "max_tokens": max_new,
        "temperature": temperature,
        "seed": sampling.seed,
        "stream": stream,
        "return_spec_tokens_details": True,
    }
    if top_p is not None:
        body["top_p"] = top_p
    if model is not None:
        body["model"] = model
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    if api == "completions":
        body["prompt"] = text
    else:
        messages = item.messages if item is not None and item.messages else (("user", text),)
        body["messages"] = [{"role": role, "content": content} for role, content in messages]
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
    return body


def _finish_type(value: Any) -> str | None:
    """SGLang sends ``{"type": "length", ...}``; OpenAI sends ``"length"``."""
    if value is None:
        return None
    if isinstance(value, dict):
        return str(value.get("type")) if value.get("type") is not None else json.dumps(value)
    return str(value)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


CORRECT_DRAFTS_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
"""meta_info's accepted-draft count, newest SGLang spelling first (SGLang 0.5.23:
``TokenizerManager._calculate_spec_decoding_metrics``); absent means "not reported", never 0."""

PROPOSED_DRAFTS_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
"""The proposed-draft count (spec_verify_ct * (speculative_num_draft_tokens - 1)), same order."""


def _first_int(meta: dict, keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` that ``meta`` carries as a number (one SGLang version's spelling)."""
    for key in keys:
        value = _int_or_none(meta.get(key))
        if value is not None:
            return value
    return None


class _Fail(Exception):
    """Internal: ends one request with an error record."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Response:
    """Accumulates one response (streamed events or a whole body) into record fields."""

    __slots__ = (
        "api", "keep_output", "t0", "ttft_ms", "num_chunks", "last_tokens", "finished", "done",
        "output_tokens", "prompt_tokens", "verify_ct", "spec_accept", "correct_drafts", "proposed_drafts", "histogram",
        "server_e2e", "finish_reason", "text", "pieces", "output_ids",
    )

    def __init__(self, api: ApiKind, keep_output: bool, t0: float) -> None:
        self.api = api
        self.keep_output = keep_output
        self.t0 = t0
        self.ttft_ms: float | None = None
        self.num_chunks = 0
        self.last_tokens = 0
        self.finished = False
        self.done = False
        self.output_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.verify_ct: int | None = None
        self.spec_accept: float | None = None
        self.correct_drafts: int | None = None
        self.proposed_drafts: int | None = None
        self.histogram: list[int] | None = None
        self.server_e2e: float | None = None
        self.finish_reason: str | None = None
        self.text: str | None = None
        self.pieces: list[str] = []
        self.output_ids: list[int] | None = None

    def _chunk(self, now: float) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = (now - self.t0) * 1000.0
        self.num_chunks += 1

    def _error_in(self, obj: dict) -> None:
        error = obj.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            raise _Fail("server_error", str(message))

    def _native_meta(self, meta: dict) -> None:
        tokens = _int_or_none(meta.get("completion_tokens"))
        if tokens is not None:
            self.output_tokens = tokens
        prompt = _int_or_none(meta.get("prompt_tokens"))
        if prompt is not None:
            self.prompt_tokens = prompt
        reason = meta.get("finish_reason")
        if reason is not None:
            self.finished = True
            self.finish_reason = _finish_type(reason)
            if self.finish_reason == "abort":
                message = reason.get("message") if isinstance(reason, dict) else None
                raise _Fail("server_error", f"request aborted by the server: {message or reason}")
            self._spec_counters(meta)
            e2e = meta.get("e2e_latency")
            self.server_e2e = float(e2e) if isinstance(e2e, (int, float)) else None

    def event(self, obj: Any, now: float) -> None:
        """One parsed SSE event."""
        if not isinstance(obj, dict):
            raise _Fail("bad_response", f"unexpected event {str(obj)[:200]!r}")
        self._error_in(obj)
        if self.api == "generate":
            meta = obj.get("meta_info") or {}
            tokens = _int_or_none(meta.get("completion_tokens"))
            text = obj.get("text")
            if tokens is not None:
                if tokens > self.last_tokens:
                    self._chunk(now)
                    self.last_tokens = tokens
            elif text:  # a server without completion_tokens: count chunks by text growth
                if self.text is None or len(text) > len(self.text):
                    self._chunk(now)
            if text is not None:
                self.text = text  # SGLang streams the cumulative text
            self._native_meta(meta)
            return
        for choice in obj.get("choices") or ():
            piece = choice.get("text") if self.api == "completions" else (choice.get("delta") or {}).get("content")
            if piece:
                self._chunk(now)
                if self.keep_output:
                    self.pieces.append(piece)
            if choice.get("finish_reason") is not None:
                self.finished = True
                self.finish_reason = _finish_type(choice.get("finish_reason"))
        self._usage(obj.get("usage"))
        self._sglext(obj.get("sglext"))

    def _sglext(self, ext: Any) -> None:
        """SGLang's ``sglext.spec_tokens_details`` (OpenAI APIs, asked for by ``return_spec_tokens_details``):
        the same counters as ``/generate``'s meta_info (one request, one choice: the first entry of a list)."""
        if not isinstance(ext, dict):
            return
        details = ext.get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        if isinstance(details, dict):
            self._spec_counters(details)

    def _spec_counters(self, fields: dict) -> None:
        """The request's speculative counters from /generate's meta_info or the OpenAI APIs'
        ``sglext.spec_tokens_details`` (the same names; an absent one is None, never 0)."""
        self.verify_ct = _int_or_none(fields.get("spec_verify_ct"))
        accept = fields.get("spec_accept_length")
        self.spec_accept = float(accept) if isinstance(accept, (int, float)) else None
        self.correct_drafts = _first_int(fields, CORRECT_DRAFTS_KEYS)
        self.proposed_drafts = _first_int(fields, PROPOSED_DRAFTS_KEYS)
        histogram = fields.get("spec_correct_drafts_histogram")
        self.histogram = ([int(v) for v in histogram] if isinstance(histogram, list)
                          and all(_int_or_none(v) is not None for v in histogram) else None)

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            tokens = _int_or_none(usage.get("completion_tokens"))
            if tokens is not None:
                self.output_tokens = tokens
            prompt = _int_or_none(usage.get("prompt_tokens"))
            if prompt is not None:
                self.prompt_tokens = prompt

    def body(self, obj: Any) -> None:
        """A whole non-streamed response."""
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        if not isinstance(obj, dict):
            raise _Fail("bad_response", f"unexpected body {str(obj)[:200]!r}")
        self._error_in(obj)
        if self.api == "generate":
            self.text = obj.get("text")
            ids = obj.get("output_ids")
            if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
                self.output_ids = list(ids)
            self._native_meta(obj.get("meta_info") or {})
            if not self.finished:
                raise _Fail("bad_response", "response without meta_info.finish_reason")
            return
        choices = obj.get("choices") or []
        if not choices:
            raise _Fail("bad_response", "response without choices")
        choice = choices[0]
        self.text = choice.get("text") if self.api == "completions" else (choice.get("message") or {}).get("content")
        self.finished = True
        self.finish_reason = _finish_type(choice.get("finish_reason"))
        self._usage(obj.get("usage"))
        self._sglext(obj.get("sglext"))

    def output(self) -> str | None:
        if not self.keep_output:
            return None
        if self.api == "generate" or self.text is not None:
            return self.text
        return "".join(self.pieces)


async def _read_stream(resp: aiohttp.ClientResponse, state: _Response) -> None:
    """Split the SSE byte stream into ``data:`` lines and feed each event to ``state``."""
    pending = b""
    clock = time.perf_counter
    loads = json.loads
    async for data in resp.content.iter_any():
        if state.done:
            continue  # read to the end so the connection can be reused
        now = clock()
        pending += data
        if b"\n" not in data:
            continue
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                state.done = True
                break
            try:
                obj = loads(payload)
            except ValueError:
                raise _Fail("bad_response", f"invalid JSON in event: {payload[:200]!r}") from None
            state.event(obj, now)
    tail = pending.strip()
    if not state.done and tail.startswith(b"data:"):
        payload = tail[5:].strip()
        if payload == b"[DONE]":
            state.done = True
        elif payload:
            try:
                state.event(loads(payload), clock())
            except ValueError:
                raise _Fail("bad_response", f"invalid JSON in event: {payload[:200]!r}") from None


async def send_request(
    *,
    session: aiohttp.ClientSession,
    base_url: str,
    api: ApiKind,
    item: WorkItem,
    index: int,
    sampling: Sampling,
    stream: bool,
    model: str | None,
    timeout_s: float,
    keep_output: bool = False,
    run_start: float | None = None,
    scheduled: float | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> RequestRecord:
    """Send one request and describe its outcome. Never raises for a request that went wrong.

    Args:
        session: The shared client session.
        stream: Stream the response (needed for TTFT, TPOT and tokens per chunk).
        model: OpenAI ``model`` field (ignored by SGLang's native API).
        timeout_s: Whole-request timeout, from send to last byte.
        keep_output: Keep the generated text (and token ids where the server sends them whole).
        run_start: ``perf_counter`` origin for ``sent_s``; defaults to the send time.
        scheduled: ``perf_counter`` time the request was due (open loop); TTFT and e2e are
            measured from it. None measures from the send.
        chat_template_kwargs: Sent with every chat request (see :func:`build_payload`).
    """
    payload = build_payload(api=api, text=item.text, sampling=sampling, stream=stream, model=model, item=item,
                            chat_template_kwargs=chat_template_kwargs)
    url = base_url.rstrip("/") + _PATHS[api]
    t0 = time.perf_counter()
    start = t0 if scheduled is None else min(scheduled, t0)
    state = _Response(api, keep_output, start)
    status: int | None = None
    fail: _Fail | None = None
    try:
        async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
            if status >= 400:
                body = (await resp.text(errors="replace"))[:300]
                raise _Fail("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {body}")
            if stream:
                await _read_stream(resp, state)
                if not state.finished and not state.done:
                    raise _Fail("dropped_stream", "the stream ended before the request finished")
            else:
                try:
                    obj = await resp.json(content_type=None)
                except ValueError as exc:
                    raise _Fail("bad_response", f"invalid JSON body: {exc}") from None
                state.body(obj)
    except _Fail as exc:
        fail = exc
    except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
        fail = _Fail("timeout", f"no complete response within {timeout_s:g} s")
    except aiohttp.ClientConnectorError as exc:
        fail = _Fail("connection", f"cannot connect to {base_url}: {exc.os_error or exc}")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        kind: ErrorKind = "dropped_stream" if status is not None else "connection"
        fail = _Fail(kind, f"{type(exc).__name__}: {exc}")
    except aiohttp.ClientError as exc:
        fail = _Fail("connection" if status is None else "dropped_stream", f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        fail = _Fail("connection", f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    origin = run_start if run_start is not None else t0
    return RequestRecord(
        index=index,
        prompt_id=item.prompt_id,
        sent_s=t0 - origin,
        scheduled_s=None if scheduled is None else scheduled - origin,
        queue_delay_ms=None if scheduled is None else (t0 - start) * 1000.0,
        ttft_ms=state.ttft_ms if stream else None,
        e2e_ms=(end - start) * 1000.0,
        num_chunks=state.num_chunks if stream else None,
        output_tokens=state.output_tokens,
        prompt_tokens=state.prompt_tokens,
        spec_verify_ct=state.verify_ct,
        spec_accept_length=state.spec_accept,
        spec_correct_drafts=state.correct_drafts,
        spec_proposed_drafts=state.proposed_drafts,
        spec_correct_drafts_histogram=state.histogram,
        server_e2e_latency_s=state.server_e2e,
        finish_reason=state.finish_reason,
        status=status,
        error=None if fail is None else str(fail),
        error_kind=None if fail is None else fail.kind,
        output_text=state.output(),
        output_ids=state.output_ids if keep_output else None,
    )


class _Breaker:
    """Stops a run after ``limit`` connection errors or ``hang_limit`` timeouts in a row."""

    def __init__(self, limit: int, hang_limit: int) -> None:
        self.limit = limit
        self.hang_limit = hang_limit
        self.consecutive = 0
        self.timeouts = 0

    def note(self, record: RequestRecord) -> None:
        kind = record.error_kind
        if kind == "connection":
            self.consecutive += 1
        elif record.error is None or record.status is not None:
            self.consecutive = 0
        if kind == "timeout":
            self.timeouts += 1
        elif record.error is None or (record.status is not None and kind not in ("abandoned", "not_sent")):
            self.timeouts = 0

    @property
    def refusing(self) -> bool:
        return self.consecutive >= self.limit

    @property
    def hung(self) -> bool:
        return self.timeouts >= self.hang_limit

    @property
    def open(self) -> bool:
        return self.refusing or self.hung


def _not_sent(index: int, item: WorkItem, reason: str) -> RequestRecord:
    return RequestRecord(index=index, prompt_id=item.prompt_id, error=reason, error_kind="not_sent")


async def run_load(
    *,
    session: aiohttp.ClientSession,
    base_url: str,
    api: ApiKind,
    items: Sequence[WorkItem],
    concurrency: int,
    sampling: Sampling,
    timeout_s: float,
    stream: bool = True,
    model: str | None = None,
    request_rate: float | None = None,
    seed: int = 0,
    keep_output: bool = False,
    hang_limit: int | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> LoadResult:
    """Send every item and return one record each, in item order.

    Closed loop (``request_rate`` None): ``concurrency`` workers, latency from the send. Open
    loop: exponential gaps from ``random.Random(seed)`` at ``request_rate``/s, at most
    ``concurrency`` in flight, latency from each request's scheduled arrival.

    Args:
        hang_limit: Timeouts in a row, none completing in between, after which the engine is taken
            to be hung (in flight ``abandoned``, the rest ``not_sent``). Default:
            ``max(2, concurrency)``.
        on_record: Called with each record as it completes.

    Raises:
        ValueError: ``concurrency`` or ``hang_limit`` below 1.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if hang_limit is not None and hang_limit < 1:
        raise ValueError(f"hang_limit must be >= 1, got {hang_limit}")
    records: list[RequestRecord | None] = [None] * len(items)
    breaker = _Breaker(limit=max(3, min(concurrency, 16)), hang_limit=hang_limit or max(2, concurrency))
    in_flight: set[asyncio.Task] = set()
    abandoned: set[asyncio.Task] = set()
    start = time.perf_counter()

    def stop_reason() -> str:
        if breaker.hung:
            return (
                f"{base_url} looks hung: {breaker.timeouts} requests in a row got no complete response within "
                f"{timeout_s:g} s and none completed in between"
            )
        return f"{base_url} refused {breaker.consecutive} connections in a row"

    async def one(index: int, scheduled: float | None = None) -> None:
        item = items[index]
        if breaker.open:
            record = _not_sent(index, item, f"not sent: {stop_reason()}")
        else:
            task = asyncio.create_task(send_request(
                session=session, base_url=base_url, api=api, item=item, index=index, sampling=sampling,
                stream=stream, model=model, timeout_s=timeout_s, keep_output=keep_output, run_start=start,
                scheduled=scheduled, chat_template_kwargs=chat_template_kwargs,
            ))
            in_flight.add(task)
            try:
                record = await task
            except asyncio.CancelledError:
                if task not in abandoned:
                    raise
                record = RequestRecord(
                    index=index, prompt_id=item.prompt_id,
                    scheduled_s=None if scheduled is None else scheduled - start,
                    error=f"abandoned: {stop_reason()}", error_kind="abandoned",
                )
            finally:
                in_flight.discard(task)
            breaker.note(record)
            if breaker.hung and in_flight:
                for other in list(in_flight):  # the engine is hung: stop waiting for the rest
                    abandoned.add(other)
                    other.cancel()
        records[index] = record
        if on_record is not None:
            on_record(record)

    if request_rate is None:
        next_index = 0

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(items):
                index = next_index
                next_index += 1
                await one(index)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    else:
        rng = random.Random(seed)
        gate = asyncio.Semaphore(concurrency)

        async def gated(index: int, due: float) -> None:
            async with gate:
                await one(index, scheduled=due)

        tasks = []
        due = start
        for index in range(len(items)):
            due += rng.expovariate(request_rate)
            delay = due - time.perf_counter()
            if delay > 0 and not breaker.open:
                await asyncio.sleep(delay)  # the arrival schedule itself, not synchronisation
            tasks.append(asyncio.create_task(gated(index, due)))
        await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    done = [r for r in records if r is not None]
    if len(done) != len(items):  # pragma: no cover - every index is filled above
        raise RuntimeError("load generator lost records")
    return LoadResult(records=done, duration_s=duration, hung=stop_reason() if breaker.hung else None)
