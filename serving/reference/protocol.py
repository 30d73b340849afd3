"""Messages between the HTTP process and the TP workers (pickled over multiprocessing pipes).

The HTTP process talks to rank 0 only; rank 0 broadcasts what it received to the other ranks,
so all ranks see the same events in the same scheduler iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from serving.reference.sampling import SamplingParams

__all__ = [
    "AbortReq",
    "FlushReq",
    "FlushDone",
    "GenerateReq",
    "Shutdown",
    "Stats",
    "TokenBatch",
    "TokenOut",
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
    """

    rid: str
    input_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    extra_stop_ids: tuple[int, ...] = ()
    is_health_check: bool = False


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
        token_ids: Tokens emitted this iteration (1 for prefill/decode, up to N under speculation).
        finish: SGLang's finish_reason once done (``{"type": "length", "length": n}``,
            ``{"type": "stop", "matched": token_or_str}``, ``{"type": "abort", ...}``), else None.
        spec_verify_ct: Verify cycles this request has gone through so far.
        spec_accepted_drafts: Draft tokens accepted so far (bonus tokens excluded).
    """

    rid: str
    token_ids: tuple[int, ...]
    finish: Optional[dict[str, Any]]
    spec_verify_ct: int
    spec_accepted_drafts: int


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """Everything one iteration produced, plus the queue sizes after it."""

    outputs: tuple[TokenOut, ...]
    num_running_reqs: int
    num_queue_reqs: int


@dataclasses.dataclass(frozen=True)
class Stats:
    """The scheduler's internal state (``/server_info`` ``internal_states[0]``), pushed when the
    decode-log window is folded into the lifetime counters."""

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


@dataclasses.dataclass(frozen=True)
class WorkerFailed:
    rank: int
    message: str
