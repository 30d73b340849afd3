"""In-process harness for the reference engine's decoding core (no servers, no processes).

TP=2 runs as two threads, one model shard each, whose all-reduce meets at a barrier and sums the
shards in rank order, so both ranks see bit-identical results, as with gloo or NCCL. That tests
the sharding math and the lockstep scheduling cheaply; the real gloo path is covered by the
integration tests.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import torch

from serving.reference.config import PRESETS, ModelPreset
from serving.reference.model import Model, dtype_from_name
from serving.reference.parallel import SingleRank
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.scheduler import Scheduler
from serving.reference.speculative import SpecConfig
from serving.reference.tokenizer import ByteTokenizer

PRESET = PRESETS["ref-tiny"]
TOKENIZER = ByteTokenizer(vocab_size=PRESET.vocab_size)

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "SELECT name, age FROM users WHERE",
    "1, 2, 3, 4, 5,",
    "import torch\nimport numpy as np\n",
    "Dear Sir or Madam,",
    "The capital of France is",
    "To be or not to be",
    "{\"key\": \"value\", \"list\": [",
    "Speculative decoding drafts tokens",
    "a",
    "ZZZZZZZZZZ",
    "The weather today is sunny with",
    "In 1492, Columbus",
    "<html><body>",
    "Roses are red, violets are",
    "Ünïcödé tëxt wïth äccents",
    "The end.",
    "Q: What is 2+2?\nA:",
    "#!/bin/bash\nset -euo pipefail\n",
]


class _ThreadGroup:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size)
        self.slots: list[Optional[torch.Tensor]] = [None] * world_size


class ThreadComm:
    """One rank of an in-process TP group (see module docstring)."""

    def __init__(self, group: _ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def all_reduce(self, tensor: torch.Tensor) -> None:
        g = self.group
        g.slots[self.rank] = tensor.clone()
        g.barrier.wait()
        total = g.slots[0].clone()  # type: ignore[union-attr]
        for other in g.slots[1:]:
            total += other  # type: ignore[operator]
        g.barrier.wait()
        tensor.copy_(total)

    def broadcast_object(self, obj: Any) -> Any:
        return obj


def make_models(
    tp_size: int, *, preset: ModelPreset = PRESET, wrap_comm: Optional[Callable[[Any], Any]] = None
) -> list[Model]:
    """One model shard per rank; ``wrap_comm`` wraps each rank's TP group (e.g. a fault)."""
    torch.set_num_threads(1)
    if tp_size == 1:
        comms: Sequence[Any] = [SingleRank()]
    else:
        group = _ThreadGroup(tp_size)
        comms = [ThreadComm(group, r) for r in range(tp_size)]
    if wrap_comm is not None:
        comms = [wrap_comm(c) for c in comms]
    return [
        Model(preset=preset, seed=preset.seed, comm=c, device=torch.device("cpu"), dtype=dtype_from_name(preset.dtype))
        for c in comms
    ]


def greedy_requests(prompts: Sequence[str], *, max_new_tokens: int = 32, **params: Any) -> list[GenerateReq]:
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **params)
    return [
        GenerateReq(rid=f"r{i}", input_ids=tuple(TOKENIZER.encode(p)), params=sp, seed=i) for i, p in enumerate(prompts)
    ]


def run_tp(
    models: Sequence[Model],
    reqs: Sequence[GenerateReq],
    *,
    spec: Optional[tuple[int, int, int]] = None,
    max_running_requests: int = 64,
    inspect: Optional[Callable[[Scheduler], None]] = None,
) -> dict[str, list[int]]:
    """Run ``reqs`` to completion on every rank (threads for TP > 1); return rank 0's tokens.

    Asserts that all ranks produced the same tokens (they decide independently).
    """
    spec_cfg = SpecConfig(*spec, draft_layers=PRESET.draft_layers) if spec else None
    results: list[Optional[dict[str, list[int]]]] = [None] * len(models)
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            sched = Scheduler(
                model=models[rank],
                spec=spec_cfg,
                max_running_requests=max_running_requests,
                context_length=PRESET.context_length,
                decode_log_interval=10**9,
                log_stats=False,
            )
            results[rank] = sched.run(list(reqs))
            if inspect is not None and rank == 0:
                inspect(sched)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
            for other in models:
                comm = getattr(other.comm, "inner", other.comm)  # a wrapped group (wrap_comm)
                if isinstance(comm, ThreadComm):
                    comm.group.barrier.abort()

    if len(models) == 1:
        rank_main(0)
    else:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(models))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    if errors:
        raise errors[0]
    assert all(r == results[0] for r in results), "TP ranks disagree"
    assert results[0] is not None
    return results[0]
