"""Decode in CUDA graphs, as SGLang does: capture the decode step (under speculation, the draft
loop and the target's verify forward) per batch size and key length at start, then replay.

Sizes and padding follow ``serving.cuda_graph_rules``; the rationale and the differences from
SGLang are in docs/reference-engine.md ("Decode CUDA graphs").
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import logging
import time
from typing import Callable, Optional, Sequence

import torch

from serving.cuda_graph_rules import DecodeGraphPlan, graph_batch_size
from serving.reference.kv_cache import KVCache
from serving.reference.model import Attention, Model
from serving.reference.speculative import SpecConfig, VerifyTree, draft_tree, verify_tree

__all__ = ["DecodeGraphs", "key_length_buckets"]

logger = logging.getLogger(__name__)

SMALLEST_KEY_LENGTH = 256
WARMUP_RUNS = 2  # SGLang: two warm-up forwards per shape before its capture


def key_length_buckets(max_cols: int) -> list[int]:
    """Powers of two from 256 below ``max_cols``, then ``max_cols`` itself."""
    buckets = []
    length = SMALLEST_KEY_LENGTH
    while length < max_cols:
        buckets.append(length)
        length *= 2
    buckets.append(max_cols)
    return buckets


@dataclasses.dataclass
class _Recorded:
    """One captured shape: its graph (None on the CPU test path: replay reruns ``run``) and output."""

    run: Callable[[], object]
    graph: Optional["torch.cuda.CUDAGraph"]
    out: object

    def replay(self) -> object:
        if self.graph is None:
            self.out = self.run()
        else:
            self.graph.replay()
        return self.out


@dataclasses.dataclass
class GraphPassCounts:
    """Decode passes by how they ran (SGLang's ``sglang:cuda_graph_passes_total`` modes)."""

    graph: int = 0
    eager: int = 0


class DecodeGraphs:
    """Captured decode shapes of one scheduler, and their replay.

    Args:
        model: The target (the draft is its early exit).
        cache: The scheduler's KV cache; allocated whole here.
        spec: Speculative settings, or None for plain decoding.
        plan: The sizes to capture (``ServerArgs.decode_graph_plan``).
        use_cuda_graphs: Capture real CUDA graphs (CUDA only); False runs every "replay" eagerly
            through the same static buffers (the CPU tests of this logic).
    """

    def __init__(
        self,
        *,
        model: Model,
        cache: KVCache,
        spec: Optional[SpecConfig],
        plan: DecodeGraphPlan,
        use_cuda_graphs: bool = True,
    ) -> None:
        if not plan.enabled:
            raise ValueError("DecodeGraphs needs a plan with sizes to capture")
        self.model = model
        self.cache = cache
        self.spec = spec
        self.plan = plan
        self.sizes = sorted(plan.captured)
        self.pad = plan.pad
        self.use_cuda_graphs = use_cuda_graphs
        self.counts = GraphPassCounts()
        self.last_pass_was_graph = False
        self.capture_seconds = 0.0
        self.memory_gb = 0.0
        cache.allocate_whole()
        self.key_lengths = key_length_buckets(cache.max_cols)
        max_bs = self.sizes[-1]
        dev = model.device
        self._ids = torch.zeros(max_bs, dtype=torch.long, device=dev)  # decode inputs / draft roots
        self._prefix = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self._rows = torch.arange(max_bs, device=dev)
        if spec is not None:
            n = spec.num_draft_tokens
            self._tree_tokens = torch.zeros(max_bs, n, dtype=torch.long, device=dev)
            self._tree_depth = torch.zeros(max_bs, n, dtype=torch.long, device=dev)
            # Each node sees itself: a padded or warm-up row never has an all-masked query.
            self._tree_ancestors = torch.eye(n, dtype=torch.bool, device=dev).expand(max_bs, n, n).clone()
        self._recorded: dict[tuple[str, int, int], _Recorded] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_cuda_graphs else None

    @property
    def draft_graph_name(self) -> Optional[str]:
        """Which of SGLang's draft graphs carries the draft loop (None: not speculating).

        SGLang 0.5.23 (``eagle_worker_v2.py``) builds its draft *decode* runner only for
        ``--speculative-num-steps`` > 1: with one step ``draft_forward`` only samples, the one draft
        token coming from the draft-extend forward after verify, which has its own graph runner
        (``EAGLEDraftExtendCudaGraphRunner``, captured for every step count). The reference engine's
        draft has no separate extend (it shares the target's early layers, whose KV the verify
        writes), so its whole draft loop is one graph: "draft decode" for more than one step, "draft
        extend" for one, where SGLang's only draft forward is the extend (before 2026-12-06 the
        one-step draft ran eagerly here, which made a one-step chain's cycle slower than a two-step
        chain's on an H100: docs/measurements/chain-prediction-h100x1)."""
        if self.spec is None:
            return None
        return "draft decode" if self.spec.num_steps > 1 else "draft extend"

    def capture(self) -> None:
        """Capture every (size, key length) shape, largest first, logging as SGLang does."""
        if self.spec is None:
            self._capture_phase("target decode", "decode", num_tokens_per_req=1)
        else:
            self._capture_phase(self.draft_graph_name or "draft decode", "draft", num_tokens_per_req=self.spec.topk)
            self._capture_phase("target verify", "verify", num_tokens_per_req=self.spec.num_draft_tokens)
        logger.info(
            "reference engine: each size captured at key lengths %s (dense attention reads a fixed length; "
            "a step replays the shortest that holds its longest request)", self.key_lengths,
        )

    def _capture_phase(self, name: str, phase: str, *, num_tokens_per_req: int) -> None:
        before = self._avail_gb()
        bs_note = f", bs={self.sizes}" if phase == "draft" else ""
        logger.info(
            "Capture %s CUDA graph begin. backend=%s, num_tokens_per_req=%d%s, avail mem=%.2f GB",
            name, self.plan.backend, num_tokens_per_req, bs_note, before,
        )
        started = time.perf_counter()
        frozen = gc.isenabled()
        gc.disable()  # SGLang freezes GC during capture (--enable-cudagraph-gc off)
        try:
            for bs in reversed(self.sizes):
                for key_len in reversed(self.key_lengths):
                    self._recorded[phase, bs, key_len] = self._record(self._body(phase, bs, key_len))
        except RuntimeError as exc:
            raise RuntimeError(
                f"Capture cuda graph failed: {exc}\nPossible solutions:\n"
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
                "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge "
                "performance loss)"
            ) from exc
        finally:
            if frozen:
                gc.enable()
        elapsed = time.perf_counter() - started
        after = self._avail_gb()
        self.capture_seconds += elapsed
        self.memory_gb += max(before - after, 0.0)
        if phase == "draft":
            logger.info("Capture %s CUDA graph end. elapsed=%.2f s, mem usage=%.2f GB, avail mem=%.2f GB.",
                        name, elapsed, before - after, after)
        else:
            logger.info("Capture %s CUDA graph end. bs=%s, elapsed=%.2f s, mem usage=%.2f GB, avail mem=%.2f GB.",
                        name, self.sizes, elapsed, before - after, after)

    def _body(self, phase: str, bs: int, key_len: int) -> Callable[[], object]:
        """The work one shape replays, reading only the static buffers' first ``bs`` rows."""
        model, cache, spec = self.model, self.cache, self.spec
        ids, prefix, rows = self._ids[:bs], self._prefix[:bs], self._rows[:bs]
        if phase == "decode":
            return lambda: model.forward(
                input_ids=ids, positions=prefix, kv_rows=rows, kv_cols=prefix,
                attention=Attention.decode(prefix=prefix, visible=1, dtype=model.dtype, key_len=key_len),
                cache=cache, num_layers=model.num_layers,
            )
        assert spec is not None
        if phase == "draft":
            return lambda: draft_tree(model=model, cache=cache, roots=ids, prefix=prefix, config=spec, key_len=key_len)
        tree = VerifyTree(
            tokens=self._tree_tokens[:bs], parents=self._tree_tokens[:bs],  # parents are not read by verify
            depth=self._tree_depth[:bs], ancestors=self._tree_ancestors[:bs],
        )
        return lambda: verify_tree(model=model, cache=cache, tree=tree, prefix=prefix, key_len=key_len)

    def _record(self, run: Callable[[], object]) -> _Recorded:
        if not self.use_cuda_graphs:
            return _Recorded(run=run, graph=None, out=None)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = run()
        return _Recorded(run=run, graph=graph, out=out)

    def _avail_gb(self) -> float:
        if not self.use_cuda_graphs:
            return 0.0
        free, _total = torch.cuda.mem_get_info(self.model.device)
        return free / 2**30

    def _shape(self, batch: int, longest: int) -> Optional[tuple[int, int]]:
        """(captured size, key length) for a batch, or None: run it eagerly."""
        bs = graph_batch_size(batch, self.sizes, pad=self.pad)
        if bs is None:
            self.counts.eager += 1
            self.last_pass_was_graph = False
            return None
        self.counts.graph += 1
        self.last_pass_was_graph = True
        return bs, self.key_lengths[bisect.bisect_left(self.key_lengths, longest)]

    def _load(self, buffer: torch.Tensor, values: Sequence[int], bs: int) -> None:
        padded = list(values) + [0] * (bs - len(values))
        buffer[:bs].copy_(torch.tensor(padded, dtype=buffer.dtype), non_blocking=False)

    def decode(self, *, tokens: Sequence[int], prefix: Sequence[int]) -> Optional[torch.Tensor]:
        """Logits ``[B, vocab]`` of one decode step from a graph, or None (run it eagerly)."""
        shape = self._shape(len(tokens), max(prefix) + 1)
        if shape is None:
            return None
        bs, key_len = shape
        self._load(self._ids, tokens, bs)
        self._load(self._prefix, prefix, bs)
        out = self._recorded["decode", bs, key_len].replay()
        assert isinstance(out, torch.Tensor)
        return out[: len(tokens)]

    def speculate(
        self, *, roots: Sequence[int], prefix: Sequence[int]
    ) -> Optional[tuple[VerifyTree, torch.Tensor]]:
        """One draft-and-verify cycle from graphs: (the tree, ``[B, N, vocab]`` logits), or None."""
        spec = self.spec
        assert spec is not None
        batch = len(roots)
        shape = self._shape(batch, max(prefix) + spec.scratch_cols)
        if shape is None:
            return None
        bs, key_len = shape
        self._load(self._ids, roots, bs)
        self._load(self._prefix, prefix, bs)
        tree = self._recorded["draft", bs, key_len].replay()
        assert isinstance(tree, VerifyTree)
        self._tree_tokens[:bs].copy_(tree.tokens)
        self._tree_depth[:bs].copy_(tree.depth)
        self._tree_ancestors[:bs].copy_(tree.ancestors)
        logits = self._recorded["verify", bs, key_len].replay()
        assert isinstance(logits, torch.Tensor)
        real = VerifyTree(
            tokens=tree.tokens[:batch], parents=tree.parents[:batch], depth=tree.depth[:batch],
            ancestors=tree.ancestors[:batch],
        )
        return real, logits[:batch]
