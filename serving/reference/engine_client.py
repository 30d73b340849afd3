"""The HTTP process's side of the engine (SGLang's TokenizerManager, minus the tokenizer work).

Sends requests to rank 0, receives token batches on a reader thread and hands each request's
tokens to its waiting coroutine; keeps what ``/server_info`` and ``/metrics`` report, and
reports a dead worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, AsyncGenerator, Callable, Optional

from serving.reference.launcher import WorkerGroup
from serving.reference.metrics import ReferenceMetrics
from serving.reference.protocol import (
    AbortReq,
    FlushDone,
    FlushReq,
    GenerateReq,
    Stats,
    TokenBatch,
    TokenOut,
    TopLogprobs,
    WorkerFailed,
)

__all__ = ["WEIGHT_VERSION", "EngineClient", "RequestState"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RequestState:
    """One in-flight request as the HTTP side sees it."""

    req: GenerateReq
    created: float
    queue: "asyncio.Queue[tuple[int, ...]]"
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finish: Optional[dict[str, Any]] = None
    spec_verify_ct: int = 0
    spec_accepted_drafts: int = 0
    spec_correct_drafts_histogram: tuple[int, ...] = ()
    output_logprobs: list[float] = dataclasses.field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = dataclasses.field(default_factory=list)
    input_logprobs: list[Optional[float]] = dataclasses.field(default_factory=list)
    input_top_logprobs: list[Optional[TopLogprobs]] = dataclasses.field(default_factory=list)
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    is_streaming: bool = False  # set by the SSE responder: SGLang's is_streaming metric label

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def finished(self) -> bool:
        return self.finish is not None


class EngineClient:
    """Talks to the TP workers on behalf of the HTTP handlers.

    Args:
        workers: The started worker group.
        num_draft_tokens: ``--speculative-num-draft-tokens`` (None without speculation).
        metrics: Where to record request metrics (None without ``--enable-metrics``).
        die_after_tokens: Fault switch: exit hard after this many tokens in total.
        on_fatal: Called (on the event loop) when a worker dies or fails.
    """

    def __init__(
        self,
        *,
        workers: WorkerGroup,
        num_draft_tokens: Optional[int],
        metrics: Optional[ReferenceMetrics],
        die_after_tokens: Optional[int] = None,
        on_fatal: Callable[[str], None],
        drop_fields: tuple[str, ...] = (),
    ) -> None:
        self.workers = workers
        self.drop_fields = drop_fields  # the drop_field fault: meta_info keys never sent
        self.num_draft_tokens = num_draft_tokens
        self.metrics = metrics
        self.die_after_tokens = die_after_tokens
        self.on_fatal = on_fatal
        self.internal_state: dict[str, Any] = {}
        self.num_running_reqs = 0
        self.num_queue_reqs = 0
        self._states: dict[str, RequestState] = {}
        self._flush_waiters: list[asyncio.Future[FlushDone]] = []
        self._tokens_total = 0
        self.last_output_at = 0.0  # time.monotonic() of the last token batch from the workers
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the reader thread (after the workers are ready)."""
        self._loop = loop
        self._thread = threading.Thread(target=self._read_loop, name="engine-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Mark shutdown (worker exits are expected from now on) and end every waiting request."""
        self._stopping = True
        for state in list(self._states.values()):
            self._finish(state, {"type": "abort", "message": "server is shutting down"})

    @property
    def in_flight(self) -> int:
        return len(self._states)

    def is_in_flight(self, rid: str) -> bool:
        return rid in self._states

    def submit(self, req: GenerateReq) -> RequestState:
        """Send ``req`` to the workers; its tokens arrive through ``updates``.

        Raises:
            ValueError: the request id is already in flight.
            RuntimeError: the server is shutting down.
        """
        if req.rid in self._states:
            raise ValueError(f"request id {req.rid!r} is already in flight")
        if self._stopping:
            raise RuntimeError("server is shutting down")
        state = RequestState(req=req, created=time.perf_counter(), queue=asyncio.Queue())
        self._states[req.rid] = state
        try:
            self.workers.rank0.send(req)
        except (OSError, EOFError):  # rank 0 is gone; the reader thread reports it as fatal
            self._finish(state, {"type": "abort", "message": "the engine is gone"})
        return state

    async def updates(self, state: RequestState) -> AsyncGenerator[tuple[RequestState, tuple[int, ...], bool], None]:
        """Yield (state, new token ids, is_last) of a submitted request until it finishes.

        If the consumer stops early (client gone, handler cancelled), the request is aborted in
        the workers.
        """
        try:
            while True:
                new_ids = await state.queue.get()
                if state.finished:
                    # Fold what is still queued into the last update.
                    while not state.queue.empty():
                        new_ids = (*new_ids, *state.queue.get_nowait())
                    yield state, new_ids, True
                    return
                yield state, new_ids, False
        finally:
            if not state.finished:
                self.abort(state.rid)

    async def generate(self, req: GenerateReq) -> AsyncGenerator[tuple[RequestState, tuple[int, ...], bool], None]:
        """``submit`` then ``updates``: submitted on the first iteration."""
        updates = self.updates(self.submit(req))
        try:
            async for item in updates:
                yield item
        finally:
            await updates.aclose()

    def abort(self, rid: str) -> None:
        """Abort an in-flight request (no-op if unknown)."""
        state = self._states.get(rid)
        if state is None:
            return
        try:
            self.workers.rank0.send(AbortReq(rid=rid))
        except (OSError, EOFError):
            pass  # rank 0 is gone; the reader thread reports it as fatal
        self._finish(state, {"type": "abort", "message": "aborted by client"})

    async def flush(self) -> tuple[bool, str]:
        """Reset the speculative counters; refused while requests are in flight (SGLang's rule)."""
        if self._states:
            return False, (
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {self.num_queue_reqs}, #running-req: {self.num_running_reqs}"
            )
        assert self._loop is not None
        fut: asyncio.Future[FlushDone] = self._loop.create_future()
        self._flush_waiters.append(fut)
        self.workers.rank0.send(FlushReq())
        done = await asyncio.wait_for(fut, timeout=60.0)
        return done.success, done.message

    def _read_loop(self) -> None:
        conn = self.workers.rank0
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.workers.processes)}
        other_conns = {c: rank for rank, c in enumerate(self.workers.conns) if rank != 0}
        while True:
            try:
                ready = wait([conn, *sentinels, *other_conns])
            except OSError:
                return
            for obj in ready:
                if obj is conn:
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        self._call(self._worker_gone, 0, "closed its pipe")
                        return
                    self._call(self._on_message, msg)
                elif obj in other_conns:
                    rank = other_conns[obj]
                    try:
                        msg = obj.recv()
                    except (EOFError, OSError):
                        del other_conns[obj]
                        continue
                    if isinstance(msg, WorkerFailed):
                        self._call(self._worker_gone, rank, f"failed: {msg.message}")
                else:
                    rank = sentinels[obj]
                    code = self.workers.processes[rank].exitcode
                    self._call(self._worker_gone, rank, f"exited with code {code}")
                    return

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _worker_gone(self, rank: int, what: str) -> None:
        if self._stopping:
            return
        message = f"TP worker rank {rank} {what}; the server cannot continue"
        self.stop()
        self.on_fatal(message)

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, TokenBatch):
            self.last_output_at = time.monotonic()
            self.num_running_reqs = msg.num_running_reqs
            self.num_queue_reqs = msg.num_queue_reqs
            if self.metrics is not None:
                self.metrics.set_queue_sizes(running=msg.num_running_reqs, queued=msg.num_queue_reqs)
            for out in msg.outputs:
                self._on_output(out)
            if self.die_after_tokens is not None and self._tokens_total >= self.die_after_tokens:
                logger.error(
                    "fault die_after_tokens:%d: %d tokens emitted; exiting hard",
                    self.die_after_tokens,
                    self._tokens_total,
                )
                logging.shutdown()
                sys.stderr.flush()
                os._exit(1)
        elif isinstance(msg, Stats):
            self.internal_state = msg.internal_state
            if self.metrics is not None:
                self.metrics.set_scheduler_state(msg.internal_state)
        elif isinstance(msg, FlushDone):
            self.internal_state = msg.internal_state
            if self._flush_waiters:
                waiter = self._flush_waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(msg)
        elif isinstance(msg, WorkerFailed):
            self._worker_gone(msg.rank, f"failed: {msg.message}")

    def _on_output(self, out: TokenOut) -> None:
        state = self._states.get(out.rid)
        if state is None:  # aborted here already
            return
        now = time.perf_counter()
        new = out.token_ids
        self._tokens_total += len(new)
        if out.queue_time_s is not None and self.metrics is not None and not state.req.is_health_check:
            self.metrics.observe_queue_time(out.queue_time_s)
        if new:
            if state.first_token_at is None:
                state.first_token_at = now
                if self.metrics is not None and not state.req.is_health_check:
                    self.metrics.observe_time_to_first_token(now - state.created, is_streaming=state.is_streaming)
            elif self.metrics is not None and not state.req.is_health_check and state.last_token_at is not None:
                self.metrics.observe_inter_token_latency(
                    now - state.last_token_at, len(new), is_streaming=state.is_streaming
                )
            state.last_token_at = now
            state.output_ids.extend(new)
        state.spec_verify_ct = out.spec_verify_ct
        state.spec_accepted_drafts = out.spec_accepted_drafts
        if out.spec_correct_drafts_histogram:
            state.spec_correct_drafts_histogram = out.spec_correct_drafts_histogram
        if state.req.return_logprob:
            state.output_logprobs.extend(out.logprobs)
            state.output_top_logprobs.extend(out.top_logprobs)
            state.input_logprobs.extend(out.input_logprobs)
            state.input_top_logprobs.extend(out.input_top_logprobs)
        if out.finish is not None:
            self._finish(state, out.finish, new)
        else:
            state.queue.put_nowait(new)

    def _finish(self, state: RequestState, finish: dict[str, Any], new: tuple[int, ...] = ()) -> None:
        if state.finished:
            return
        state.finish = finish
        state.finished_at = time.perf_counter()
        self._states.pop(state.rid, None)
        if self.metrics is not None and not state.req.is_health_check:
            self.metrics.observe_finished_request(
                prompt_tokens=len(state.req.input_ids),
                generation_tokens=len(state.output_ids),
                cached_tokens=0,
                e2e_latency=state.finished_at - state.created,
                spec_verify_ct=state.spec_verify_ct,
                finish_type=finish.get("type"),
                decode_seconds=(
                    state.finished_at - state.first_token_at if state.first_token_at is not None else None
                ),
                is_streaming=state.is_streaming,
            )
        state.queue.put_nowait(new)

    def meta_info(self, state: RequestState, *, decode: Optional[Callable[[int], str]] = None) -> dict[str, Any]:
        """SGLang's ``meta_info`` for a request (``TokenizerManager._handle_batch_output``).

        The keys are listed in docs/reference-engine.md ("HTTP API").

        Args:
            state: The request.
            decode: Token id -> text for the logprob triples (``return_text_in_logprobs``);
                None puts None there.
        """
        completion = len(state.output_ids)
        req = state.req
        meta: dict[str, Any] = {
            "id": state.rid,
            "finish_reason": state.finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": WEIGHT_VERSION,
            "num_retractions": 0,
        }
        if req.return_logprob:
            meta.update(_logprob_meta(state, decode))
        meta.update({"reasoning_tokens": 0, "completion_tokens": completion, "cached_tokens": 0})
        if not state.finished:
            return meta
        end = state.finished_at if state.finished_at is not None else time.perf_counter()
        meta["e2e_latency"] = end - state.created
        ct = state.spec_verify_ct
        if self.num_draft_tokens is not None and ct > 0:
            proposed = ct * (self.num_draft_tokens - 1)
            correct = state.spec_accepted_drafts
            if proposed > 0:
                meta["spec_accept_rate"] = correct / proposed
                meta["spec_accept_length"] = completion / ct
                meta["spec_num_correct_drafts"] = correct
                meta["spec_num_proposed_drafts"] = proposed
                meta["spec_verify_ct"] = ct
                meta["spec_accepted_drafts"] = correct
                meta["spec_proposed_drafts"] = proposed
            if state.spec_correct_drafts_histogram:
                meta["spec_correct_drafts_histogram"] = list(state.spec_correct_drafts_histogram)
                meta["spec_accept_histogram"] = list(state.spec_correct_drafts_histogram)
        for name in self.drop_fields:
            meta.pop(name, None)
        return meta


WEIGHT_VERSION = "default"
"""SGLang's ``--weight-version`` default; the reference engine's weights never change."""

def _logprob_meta(state: RequestState, decode: Optional[Callable[[int], str]]) -> dict[str, Any]:
    """SGLang's logprob keys: ``(logprob, token_id, text-or-None)`` triples per position."""

    def triple(value: Optional[float], token: int) -> tuple[Optional[float], int, Optional[str]]:
        return (value, token, decode(token) if decode is not None else None)

    def tops(rows: list[Optional[TopLogprobs]]) -> list[Optional[list[Any]]]:
        return [None if row is None else [triple(v, t) for v, t in row] for row in rows]

    req = state.req
    start = req.logprob_start_len
    prompt_tokens = req.input_ids[start:] if 0 <= start < len(req.input_ids) else ()
    out_tokens = state.output_ids[: len(state.output_logprobs)]
    meta: dict[str, Any] = {
        "input_token_logprobs": [triple(v, t) for v, t in zip(state.input_logprobs, prompt_tokens)],
        "output_token_logprobs": [triple(v, t) for v, t in zip(state.output_logprobs, out_tokens)],
        "output_token_logprobs_length": len(out_tokens),
    }
    if req.top_logprobs_num > 0:
        meta["input_top_logprobs"] = tops(state.input_top_logprobs)
        meta["output_top_logprobs"] = tops(list(state.output_top_logprobs))
    return meta
