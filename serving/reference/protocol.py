"""Messages between the HTTP process and the TP workers (pickled over multiprocessing pipes).

The HTTP process talks to rank 0 only; rank 0 broadcasts what it received to the other ranks,
so all ranks see the same events in the same scheduler iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from serving.reference.sampling import SamplingParams

TopLogprobs = tuple[tuple[float, int], ...]
"""The most likely tokens at one position, as ``(logprob, token_id)``, most likely first."""

__all__ = [
    "AbortReq",
    "FlushReq",
    "FlushDone",
    "GenerateReq",
    "Shutdown",
    "Stats",
    "TokenBatch",
    "TokenOut",
    "TopLogprobs",
    "WorkerFailed",
    "WorkerReady",
]


@dataclasses.dataclass(frozen=True)
class GenerateReq:
    """A tokenized, validated request.

    Attributes:
        rid: Request id (unique while in flight).
        input_ids: Prompt tokens.
        params: Sampling parameters.
        seed: Seed of the request's random stream (sampling only).
        extra_stop_ids: Stop tokens the endpoint adds (e.g. chat's end-of-turn).
        is_health_check: Excluded from metrics, like SGLang's HEALTH_CHECK requests.
        return_logprob: Report the log-probability of every output token.
        top_logprobs_num: Also report this many most likely tokens per position.
        logprob_start_len: First prompt position with an input log-probability (-1: none).
    """

    rid: str
    input_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    extra_stop_ids: tuple[int, ...] = ()
    is_health_check: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1


@dataclasses.dataclass(frozen=True)
class AbortReq:
    rid: str


@dataclasses.dataclass(frozen=True)
class FlushReq:
    """Reset the speculative counters (``/flush_cache``); refused unless idle."""


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """Leave the loop and exit."""


@dataclasses.dataclass(frozen=True)
class TokenOut:
    """New tokens of one request from one scheduler iteration.

    Attributes:
        rid: Request id.
        token_ids: Tokens emitted this iteration (up to N under speculation).
        finish: SGLang's ``finish_reason`` once done, else None.
        spec_verify_ct: Verify cycles so far.
        spec_accepted_drafts: Draft tokens accepted so far, bonus tokens excluded.
        spec_correct_drafts_histogram: ``[k]`` = verify cycles that accepted k drafts (final
            output only).
        logprobs: Log-probability of each of ``token_ids`` (``return_logprob`` only).
        top_logprobs: Per token, the ``top_logprobs_num`` most likely pairs.
        input_logprobs: Prefill only: prompt logprobs from ``logprob_start_len`` on (None at 0).
        input_top_logprobs: Prefill only: the top pairs per prompt position (None at 0).
        queue_time_s: Prefill only: seconds the request waited in the queue.
    """

    rid: str
    token_ids: tuple[int, ...]
    finish: Optional[dict[str, Any]]
    spec_verify_ct: int
    spec_accepted_drafts: int
    spec_correct_drafts_histogram: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[TopLogprobs, ...] = ()
    input_logprobs: tuple[Optional[float], ...] = ()
    input_top_logprobs: tuple[Optional[TopLogprobs], ...] = ()
    queue_time_s: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """Everything one iteration produced, plus the queue sizes after it."""

    outputs: tuple[TokenOut, ...]
    num_running_reqs: int
    num_queue_reqs: int


@dataclasses.dataclass(frozen=True)
class Stats:
    """The scheduler's internal state (``internal_states[0]``), pushed when counters are folded."""

    internal_state: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class FlushDone:
    success: bool
    message: str
    internal_state: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class WorkerReady:
    """Sent once by every rank when its model is loaded."""

    rank: int
    world_size: int
    pid: int
    device: str
    backend: str
    process_name: str
    env: dict[str, str]
    max_total_num_tokens: int
    decode_cuda_graph_bs: tuple[int, ...] = ()  # sizes captured ((): eager decode)
    graph_memory_gb: float = 0.0
    graph_capture_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class WorkerFailed:
    rank: int
    message: str
