"""The batching scheduler: admits requests, runs prefill, decode or speculative cycles, and
keeps the counters behind ``/server_info`` and ``/metrics``.

Every TP rank runs an identical ``Scheduler`` on identical inputs; only rank 0 reports. Batching
and counters are described in docs/reference-engine.md ("Decoding", "Accept length").
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable, Optional

import torch

from serving.cuda_graph_rules import DecodeGraphPlan
from serving.reference.cuda_graphs import DecodeGraphs
from serving.reference.faults import perturb_verify_logits
from serving.reference.kv_cache import cache_cols
from serving.reference.model import Attention, Model, PrefillSpan
from serving.reference.protocol import GenerateReq, TokenOut, TopLogprobs
from serving.reference.sampling import SamplingParams, output_logprobs, target_probs
from serving.reference.speculative import SpecConfig, draft_tree, verify_tree, walk_greedy, walk_sampled
from serving.reference.tokenizer import EOS_ID, NUM_BYTE_TOKENS

__all__ = ["Request", "Scheduler"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Request:
    """A request inside the scheduler."""

    rid: str
    prompt: tuple[int, ...]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: Optional[torch.Generator]
    is_health_check: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    output: list[int] = dataclasses.field(default_factory=list)
    committed: int = 0  # KV positions written for good
    pending: int = -1  # last emitted token; its KV is written by the next step
    verify_ct: int = 0
    accepted_drafts: int = 0
    correct_drafts_histogram: list[int] = dataclasses.field(default_factory=list)
    finish: Optional[dict[str, Any]] = None
    _stop_tail_len: int = 0
    queued_at: float = dataclasses.field(default_factory=time.monotonic)
    queue_time_s: Optional[float] = None

    @classmethod
    def from_req(cls, req: GenerateReq) -> "Request":
        params = req.params
        stop_ids = set(params.stop_token_ids) | set(req.extra_stop_ids)
        if not params.ignore_eos:
            stop_ids.add(EOS_ID)
        gen = None
        if not params.greedy:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(req.seed)
        return cls(
            rid=req.rid,
            prompt=tuple(req.input_ids),
            params=params,
            stop_ids=frozenset(stop_ids),
            generator=gen,
            is_health_check=req.is_health_check,
            return_logprob=req.return_logprob,
            top_logprobs_num=req.top_logprobs_num if req.return_logprob else 0,
            logprob_start_len=req.logprob_start_len if req.return_logprob else -1,
            _stop_tail_len=max((len(s.encode("utf-8")) for s in params.stop), default=0) + 3,
        )

    @property
    def input_logprob_start(self) -> Optional[int]:
        """First prompt position whose log-probability is reported, or None (the default)."""
        if self.logprob_start_len < 0 or self.logprob_start_len >= len(self.prompt):
            return None
        return self.logprob_start_len

    def count_correct_drafts(self, accepted: int) -> None:
        """SGLang's ``update_spec_correct_drafts_histogram``: ``[k]`` counts cycles with k accepted."""
        hist = self.correct_drafts_histogram
        if len(hist) <= accepted:
            hist.extend([0] * (accepted + 1 - len(hist)))
        hist[accepted] += 1

    def emit(self, tokens: list[int]) -> list[int]:
        """Append tokens until a stop condition; return those actually emitted."""
        taken = []
        for token in tokens:
            self.output.append(token)
            taken.append(token)
            self.finish = self._finished_by(token)
            if self.finish is not None:
                break
        return taken

    def _finished_by(self, token: int) -> Optional[dict[str, Any]]:
        if token in self.stop_ids:
            return {"type": "stop", "matched": token}
        if self.params.stop:
            tail = bytes(t for t in self.output[-self._stop_tail_len :] if t < NUM_BYTE_TOKENS)
            text = tail.decode("utf-8", errors="ignore")
            for stop in self.params.stop:
                if stop in text:
                    return {"type": "stop", "matched": stop}
        if len(self.output) >= self.params.max_new_tokens:
            return {"type": "length", "length": self.params.max_new_tokens}
        return None


class Scheduler:
    """Runs the model over many concurrent requests.

    Args:
        model: This rank's model shard.
        spec: Speculative settings, or None for plain decoding.
        max_running_requests: Most requests decoded together (KV-cache rows).
        context_length: Longest prompt + output, in tokens.
        max_prefill_tokens: Most prompt tokens prefilled in one iteration (at least one request).
        decode_log_interval: Decode batches between folds of the counter window into the totals
            (and log lines), counted since start or the last flush, as SGLang's ``forward_ct_decode``.
        log_stats: Whether this rank logs the decode lines (rank 0).
        on_stats: Called with the internal state after each fold.
        clock: Time source for throughput figures.
        decode_graphs: Decode CUDA graphs to capture, or None to decode eagerly.
        use_cuda_graphs: With ``decode_graphs``: capture real CUDA graphs (False: CPU tests).
        perturb_verify: The ``perturb_verify`` fault: scale every verify logit by ``1 +/- this``
            (``serving.reference.faults.perturb_verify_logits``); None leaves them exact.
    """

    def __init__(
        self,
        *,
        model: Model,
        spec: Optional[SpecConfig],
        max_running_requests: int,
        context_length: int,
        max_prefill_tokens: int = 16384,
        decode_log_interval: int = 40,
        log_stats: bool = True,
        on_stats: Optional[Callable[[dict[str, Any]], None]] = None,
        clock: Callable[[], float] = time.perf_counter,
        decode_graphs: Optional[DecodeGraphPlan] = None,
        use_cuda_graphs: bool = True,
        perturb_verify: Optional[float] = None,
    ) -> None:
        self.model = model
        self.perturb_verify = perturb_verify
        self.spec = spec
        self.max_running = max_running_requests
        self.context_length = context_length
        self.max_prefill_tokens = max_prefill_tokens
        self.decode_log_interval = max(1, decode_log_interval)
        self.log_stats = log_stats
        self.on_stats = on_stats
        self.clock = clock
        self.cache = model.new_cache(
            max_rows=max_running_requests, max_cols=cache_cols(context_length=context_length, scratch=self._scratch())
        )
        logger.info("Memory pool end. KV cache %d requests x %d columns", max_running_requests,
                    cache_cols(context_length=context_length, scratch=self._scratch()))  # SGLang's start-phase line
        self.device = model.device
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._reset_counters()
        self._window_start = clock()
        self._idle = True
        self.last_gen_throughput = 0.0
        self.last_spec_accept_length = 0.0
        self.last_spec_accept_rate = 0.0
        self.graphs: Optional[DecodeGraphs] = None
        if decode_graphs is not None and decode_graphs.enabled:
            self.graphs = DecodeGraphs(
                model=model, cache=self.cache, spec=spec, plan=decode_graphs, use_cuda_graphs=use_cuda_graphs
            )
            self.graphs.capture()

    def submit(self, req: GenerateReq) -> list[TokenOut]:
        """Queue a request; returns its final output (an abort) if this rank cannot take it."""
        try:
            request = Request.from_req(req)
        except (ValueError, OverflowError, RuntimeError) as exc:
            logger.error("request %s refused: %s", req.rid, exc)
            finish = {"type": "abort", "message": f"the engine could not take the request: {exc}"}
            return [TokenOut(rid=req.rid, token_ids=(), finish=finish, spec_verify_ct=0, spec_accepted_drafts=0)]
        self.waiting.append(request)
        return []

    def abort(self, rid: str) -> list[TokenOut]:
        """Drop a request wherever it is; returns its final output if it was known."""
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish = {"type": "abort", "message": "aborted by client"}
                return [self._out(req, [])]
        for row, req in enumerate(self.running):
            if req.rid == rid:
                req.finish = {"type": "abort", "message": "aborted by client"}
                self._remove_finished()
                return [self._out(req, [])]
        return []

    def run(self, reqs: list[GenerateReq]) -> dict[str, list[int]]:
        """Offline use (tests, tools): submit ``reqs``, step until done, return tokens by rid."""
        for req in reqs:
            self.submit(req)
        tokens: dict[str, list[int]] = {req.rid: [] for req in reqs}
        while self.has_work:
            for out in self.step():
                tokens[out.rid].extend(out.token_ids)
        return tokens

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def flush(self) -> tuple[bool, str]:
        """Reset the lifetime counters (``/flush_cache``); refused while requests are in flight."""
        if self.has_work:
            return False, (
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {len(self.waiting)}, #running-req: {len(self.running)}"
            )
        self._reset_counters()
        return True, "Cache flushed."

    def step(self) -> list[TokenOut]:
        """One iteration: prefill new requests if any fit, else decode / verify the batch."""
        if self._idle:  # throughput windows measure busy time only
            self._window_start = self.clock()
            self._idle = False
        if self.waiting and len(self.running) < self.max_running:
            outs = self._prefill()
        elif self.running:
            outs = self._spec_cycle() if self.spec else self._decode()
            # SGLang 0.5.23 folds only here, every decode_log_interval decode batches, never on idle:
            # batch_result_processor.py l.1102-1103 counts, metrics_reporter.py l.934 gates, l.999-1000 folds
            self.forward_ct_decode += 1
            if self.forward_ct_decode % self.decode_log_interval == 0:
                self._fold()
        else:
            return []
        self._remove_finished()
        if not self.running and not self.waiting:
            self._idle = True
        return outs

    def _prefill(self) -> list[TokenOut]:
        batch: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) + len(batch) < self.max_running:
            nxt = self.waiting[0]
            if batch and tokens + len(nxt.prompt) > self.max_prefill_tokens:
                break
            batch.append(self.waiting.popleft())
            nxt.queue_time_s = time.monotonic() - nxt.queued_at
            tokens += len(nxt.prompt)
        base = len(self.running)
        self.running.extend(batch)
        longest = max(len(r.prompt) for r in batch)
        self.cache.reserve(rows=len(self.running), cols=longest + self._scratch())
        ids, pos, rows, spans = [], [], [], []
        # Logits are read at each prompt's last token, and, for a request that asked for input
        # logprobs, also at every position from the one predicting its logprob_start_len on.
        at: list[int] = []
        last: list[int] = []  # index into ``at`` of each request's last prompt token
        first_at: list[Optional[tuple[int, int]]] = []  # (index into ``at``, its position)
        offset = 0
        for i, req in enumerate(batch):
            n = len(req.prompt)
            ids.extend(req.prompt)
            pos.extend(range(n))
            rows.extend([base + i] * n)
            spans.append(PrefillSpan(row=base + i, start=0, length=n, offset=offset))
            start = req.input_logprob_start
            if start is None:
                first_at.append(None)
                at.append(offset + n - 1)
            else:
                first = max(start - 1, 0)
                first_at.append((len(at), first))
                at.extend(range(offset + first, offset + n))
            last.append(len(at) - 1)
            offset += n
        dev = self.device
        pos_t = torch.tensor(pos, device=dev)
        logits = self.model.forward(
            input_ids=torch.tensor(ids, device=dev),
            positions=pos_t,
            kv_rows=torch.tensor(rows, device=dev),
            kv_cols=pos_t,
            attention=Attention(spans=spans),
            cache=self.cache,
            num_layers=self.model.num_layers,
            logits_at=torch.tensor(at, device=dev),
        )
        last_logits = logits[torch.tensor(last, device=dev)] if len(at) != len(batch) else logits
        picks = self._sample_rows(last_logits, batch)
        outs = []
        for i, (req, token) in enumerate(zip(batch, picks)):
            req.committed = len(req.prompt)
            inputs = self._input_logprobs(req, logits, first_at[i])
            if req.params.max_new_tokens == 0:
                req.finish = {"type": "length", "length": 0}
                outs.append(self._out(req, [], inputs=inputs))
                continue
            req.pending = token
            emitted = req.emit([token])
            self._gen_tokens += len(emitted)
            outs.append(self._out(req, emitted, last_logits[i : i + 1], inputs=inputs))
        return outs

    def _decode(self) -> list[TokenOut]:
        batch = self.running
        dev = self.device
        committed = [r.committed for r in batch]
        pending = [r.pending for r in batch]
        logits = self.graphs.decode(tokens=pending, prefix=committed) if self.graphs else None
        if logits is None:
            prefix = torch.tensor(committed, device=dev)
            self.cache.reserve(rows=len(batch), cols=max(committed) + 1)
            logits = self.model.forward(
                input_ids=torch.tensor(pending, device=dev),
                positions=prefix,
                kv_rows=torch.arange(len(batch), device=dev),
                kv_cols=prefix,
                attention=Attention.decode(prefix=prefix, visible=1, dtype=self.model.dtype),
                cache=self.cache,
                num_layers=self.model.num_layers,
            )
        picks = self._sample_rows(logits, batch)
        outs = []
        for i, (req, token) in enumerate(zip(batch, picks)):
            req.committed += 1
            req.pending = token
            emitted = req.emit([token])
            self._gen_tokens += len(emitted)
            outs.append(self._out(req, emitted, logits[i : i + 1]))
        return outs

    def _spec_cycle(self) -> list[TokenOut]:
        spec = self.spec
        assert spec is not None
        batch = self.running
        dev = self.device
        committed = [r.committed for r in batch]
        pending = [r.pending for r in batch]
        replayed = self.graphs.speculate(roots=pending, prefix=committed) if self.graphs else None
        if replayed is not None:
            tree, logits = replayed
        else:
            prefix = torch.tensor(committed, device=dev)
            roots = torch.tensor(pending, device=dev)
            self.cache.reserve(rows=len(batch), cols=max(committed) + spec.scratch_cols)
            tree = draft_tree(model=self.model, cache=self.cache, roots=roots, prefix=prefix, config=spec)
            logits = verify_tree(model=self.model, cache=self.cache, tree=tree, prefix=prefix)
        tokens = tree.tokens.tolist()
        if self.perturb_verify is not None:  # the perturb_verify fault: rounding-sized numerics
            logits = perturb_verify_logits(logits, size=self.perturb_verify, key=(committed, tokens))
        parents = tree.parents.tolist()
        greedy_pick = logits.argmax(dim=-1).tolist()
        move_rows, move_src, move_dst = [], [], []
        outs = []
        for b, req in enumerate(batch):
            if req.params.greedy:
                path, bonus = walk_greedy(tokens=tokens[b], parents=parents[b], target=greedy_pick[b])
            else:
                path, bonus = walk_sampled(
                    tokens=tokens[b], parents=parents[b], logits=logits[b], params=req.params, generator=req.generator
                )
            for depth, node in enumerate(path, start=1):
                if node != depth:
                    move_rows.append(b)
                    move_src.append(req.committed + node)
                    move_dst.append(req.committed + depth)
            req.committed += 1 + len(path)
            req.pending = bonus
            emitted = req.emit([tokens[b][node] for node in path] + [bonus])
            req.verify_ct += 1
            req.accepted_drafts += min(len(path), len(emitted))
            req.count_correct_drafts(min(len(path), len(emitted)))
            self._win_verify_ct += 1
            self._win_accept_tokens += len(emitted)
            self._win_accepted_drafts += min(len(path), len(emitted))
            self._gen_tokens += len(emitted)
            # Logprobs come from the target's verify rows that predicted each token.
            predicted_at = [0, *path][: len(emitted)]
            outs.append(self._out(req, emitted, logits[b, predicted_at] if req.return_logprob else None))
        if move_rows:
            self.cache.move_cols(
                rows=torch.tensor(move_rows, device=dev),
                src=torch.tensor(move_src, device=dev),
                dst=torch.tensor(move_dst, device=dev),
            )
        return outs

    def _sample_rows(self, logits: torch.Tensor, batch: list[Request]) -> list[int]:
        picks = logits.argmax(dim=-1).tolist()
        for i, req in enumerate(batch):
            if not req.params.greedy:
                probs = target_probs(logits[i], req.params).cpu()
                picks[i] = int(torch.multinomial(probs, 1, generator=req.generator))
        return picks

    def _scratch(self) -> int:
        return self.spec.scratch_cols if self.spec else 1

    def _remove_finished(self) -> None:
        for row in range(len(self.running) - 1, -1, -1):
            if self.running[row].finish is None:
                continue
            last = len(self.running) - 1
            if row != last:
                moved = self.running[last]
                self.cache.move_row(src=last, dst=row, length=moved.committed)
                self.running[row] = moved
            self.running.pop()

    def _out(
        self,
        req: Request,
        emitted: list[int],
        logits: Optional[torch.Tensor] = None,
        *,
        inputs: Optional[tuple[tuple[Optional[float], ...], tuple[Optional[TopLogprobs], ...]]] = None,
    ) -> TokenOut:
        """The request's output of this iteration; ``logits`` are the rows that predicted ``emitted``."""
        logprobs: tuple[float, ...] = ()
        top: tuple[TopLogprobs, ...] = ()
        if req.return_logprob and emitted and logits is not None:
            logp = output_logprobs(logits, req.params)
            logprobs, top = _gather(logp, emitted, req.top_logprobs_num)
        return TokenOut(
            rid=req.rid,
            token_ids=tuple(emitted),
            finish=req.finish,
            spec_verify_ct=req.verify_ct,
            spec_accepted_drafts=req.accepted_drafts,
            spec_correct_drafts_histogram=tuple(req.correct_drafts_histogram) if req.finish is not None else (),
            logprobs=logprobs,
            top_logprobs=top,
            input_logprobs=inputs[0] if inputs else (),
            input_top_logprobs=inputs[1] if inputs else (),
            queue_time_s=self._take_queue_time(req),
        )

    @staticmethod
    def _take_queue_time(req: Request) -> Optional[float]:
        """The queue wait, on the request's first output only (one observation per request)."""
        wait, req.queue_time_s = req.queue_time_s, None
        return wait

    def _input_logprobs(
        self, req: Request, logits: torch.Tensor, first: Optional[tuple[int, int]]
    ) -> Optional[tuple[tuple[Optional[float], ...], tuple[Optional[TopLogprobs], ...]]]:
        """Prompt logprobs from ``logprob_start_len`` on (raw logits; none at position 0)."""
        start = req.input_logprob_start
        if first is None or start is None:
            return None
        index, first_pos = first
        n = len(req.prompt)
        positions = [p for p in range(start, n) if p > 0]
        values: list[Optional[float]] = [None] if start == 0 else []
        tops: list[Optional[TopLogprobs]] = [None] if start == 0 else []
        if positions:
            rows = torch.tensor([index + (p - 1 - first_pos) for p in positions], device=logits.device)
            logp = torch.log_softmax(logits[rows].double(), dim=-1).cpu()
            got, top = _gather(logp, [req.prompt[p] for p in positions], req.top_logprobs_num)
            values.extend(got)
            tops.extend(top if top else [()] * len(got))
        return tuple(values), (tuple(tops) if req.top_logprobs_num else ())

    def _reset_counters(self) -> None:
        """SGLang's ``reset_metrics`` (``metrics_reporter.py`` l.708-717): the decode-batch count, the
        window and the totals."""
        self.forward_ct_decode = 0
        self._win_verify_ct = 0
        self._win_accept_tokens = 0
        self._win_accepted_drafts = 0
        self._gen_tokens = 0
        self.cum_spec_verify_ct = 0
        self.cum_spec_accept_tokens = 0
        self.cum_spec_accepted_drafts = 0

    def _fold(self) -> None:
        now = self.clock()
        elapsed = max(now - self._window_start, 1e-9)
        self.last_gen_throughput = self._gen_tokens / elapsed
        if self._win_verify_ct:
            self.last_spec_accept_length = self._win_accept_tokens / self._win_verify_ct
            proposed = self._win_verify_ct * (self.spec.num_draft_tokens - 1) if self.spec else 0
            self.last_spec_accept_rate = self._win_accepted_drafts / proposed if proposed else 0.0
        self.cum_spec_verify_ct += self._win_verify_ct
        self.cum_spec_accept_tokens += self._win_accept_tokens
        self.cum_spec_accepted_drafts += self._win_accepted_drafts
        if self.log_stats:
            msg = (
                f"Decode batch. #running-req: {len(self.running)}, "
                f"#token: {sum(r.committed for r in self.running)}, "
                f"#queue-req: {len(self.waiting)}, "
            )
            if self.spec:
                msg += f"accept len: {self.last_spec_accept_length:.2f}, accept rate: {self.last_spec_accept_rate:.2f}, "
            graph = self.graphs is not None and self.graphs.last_pass_was_graph
            logger.info(msg + f"cuda graph: {graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}")
        self._win_verify_ct = self._win_accept_tokens = self._win_accepted_drafts = 0
        self._gen_tokens = 0
        self._window_start = now
        if self.on_stats is not None:
            self.on_stats(self.internal_state())

    @property
    def decode_cuda_graph_bs(self) -> list[int]:
        """The decode sizes captured (SGLang's ``internal_states[i].decode_cuda_graph_bs``)."""
        return list(self.graphs.sizes) if self.graphs is not None else []

    def internal_state(self) -> dict[str, Any]:
        """What ``/server_info`` reports as ``internal_states[0]``."""
        used = sum(r.committed for r in self.running)
        capacity = self.max_running * self.context_length
        state: dict[str, Any] = {
            "last_gen_throughput": self.last_gen_throughput,
            "num_running_reqs": len(self.running),
            "num_queue_reqs": len(self.waiting),
            "num_used_tokens": used,
            "token_usage": used / capacity if capacity else 0.0,
            "memory_usage": {"kvcache_rows": self.cache.rows, "kvcache_cols": self.cache.cols},
            "decode_cuda_graph_bs": self.decode_cuda_graph_bs,
        }
        if self.graphs is not None:
            # SGLang's sglang:cuda_graph_passes_total modes.
            state["cuda_graph_passes"] = {"decode_cuda_graph": self.graphs.counts.graph,
                                          "decode_none": self.graphs.counts.eager}
        if self.spec is not None:
            state["spec_verify_ct_total"] = self.cum_spec_verify_ct
            state["spec_accept_tokens_total"] = self.cum_spec_accept_tokens
            state["spec_accepted_drafts_total"] = self.cum_spec_accepted_drafts
            state["last_spec_accept_length"] = self.last_spec_accept_length
            state["last_spec_accept_rate"] = self.last_spec_accept_rate
            if self.cum_spec_verify_ct > 0:
                state["avg_spec_accept_length"] = self.cum_spec_accept_tokens / self.cum_spec_verify_ct
        return state


def _gather(logp: torch.Tensor, tokens: list[int], k: int) -> tuple[tuple[float, ...], tuple[TopLogprobs, ...]]:
    """Each row's logprob of its token, and (if ``k``) its ``k`` most likely (logprob, id) pairs."""
    logp = logp.cpu()
    values = tuple(logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist())
    if not k:
        return values, ()
    top_v, top_i = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
    return values, tuple(tuple(zip(v, i)) for v, i in zip(top_v.tolist(), top_i.tolist()))
