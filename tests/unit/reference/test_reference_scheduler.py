"""Scheduler behaviour: batching, compaction, stops, aborts, flush and counters (in-process)."""

from __future__ import annotations

import pytest

from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.scheduler import Scheduler
from serving.reference.speculative import SpecConfig
from serving.reference.tokenizer import EOS_ID

from helpers.reference_core import PRESET, PROMPTS, TOKENIZER, greedy_requests, run_tp


def _scheduler(models, spec=None, **kw) -> Scheduler:
    return Scheduler(
        model=models[0],
        spec=SpecConfig(*spec, draft_layers=PRESET.draft_layers) if spec else None,
        max_running_requests=kw.pop("max_running_requests", 64),
        context_length=PRESET.context_length,
        decode_log_interval=kw.pop("decode_log_interval", 10**9),
        log_stats=False,
        **kw,
    )


@pytest.mark.parametrize("spec", [None, (3, 1, 4), (3, 2, 6)])
def test_batched_equals_one_at_a_time_with_uneven_lengths(tp1_models, spec) -> None:
    """Requests of different lengths finish at different times; the rows left behind are
    compacted. Every request must still get exactly what it gets alone."""
    reqs = [
        GenerateReq(rid=f"r{i}", input_ids=tuple(TOKENIZER.encode(p)),
                    params=SamplingParams(max_new_tokens=4 + 5 * (i % 7), temperature=0.0), seed=i)
        for i, p in enumerate(PROMPTS)
    ]
    together = run_tp(tp1_models, reqs, spec=spec, max_running_requests=6)
    for req in reqs[:8]:
        alone = run_tp(tp1_models, [req], spec=spec)
        assert together[req.rid] == alone[req.rid]
        assert len(alone[req.rid]) == req.params.max_new_tokens


def test_stop_string_and_stop_token(tp1_models) -> None:
    base = run_tp(tp1_models, greedy_requests(["The capital of France is"], max_new_tokens=40))["r0"]
    text = TOKENIZER.decode(base)
    stop = text[10:12]
    cut = run_tp(tp1_models, greedy_requests(["The capital of France is"], max_new_tokens=40, stop=(stop,)), spec=(3, 1, 4))
    got = TOKENIZER.decode(cut["r0"])
    assert got.endswith(stop) and stop not in got[:-len(stop)] and base[: len(cut["r0"])] == cut["r0"]
    token = base[7]
    cut = run_tp(tp1_models, greedy_requests(["The capital of France is"], max_new_tokens=40, stop_token_ids=(token,)),
                 spec=(5, 4, 8))
    assert cut["r0"] == base[: base.index(token) + 1]


def test_eos_stops_unless_ignored(tp1_models) -> None:
    sched = _scheduler(tp1_models)
    req = GenerateReq(rid="e", input_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=5, temperature=0.0,
                      stop_token_ids=()), seed=0)
    sched.submit(req)
    request = sched.waiting[0]
    assert EOS_ID in request.stop_ids
    ignore = GenerateReq(rid="i", input_ids=(1,), params=SamplingParams(ignore_eos=True), seed=0)
    sched.submit(ignore)
    assert EOS_ID not in sched.waiting[1].stop_ids


def test_zero_new_tokens_and_finish_reasons(tp1_models) -> None:
    sched = _scheduler(tp1_models)
    sched.submit(GenerateReq(rid="z", input_ids=(1, 2), params=SamplingParams(max_new_tokens=0, temperature=0), seed=0))
    sched.submit(GenerateReq(rid="l", input_ids=(1, 2), params=SamplingParams(max_new_tokens=3, temperature=0), seed=0))
    finishes = {}
    while sched.has_work:
        for out in sched.step():
            if out.finish:
                finishes[out.rid] = out.finish
    assert finishes == {"z": {"type": "length", "length": 0}, "l": {"type": "length", "length": 3}}


def test_abort_and_flush(tp1_models) -> None:
    sched = _scheduler(tp1_models, spec=(3, 1, 4), decode_log_interval=2)
    for req in greedy_requests(PROMPTS[:3], max_new_tokens=50):
        sched.submit(req)
    sched.step()  # prefill
    sched.step()  # one cycle
    ok, message = sched.flush()
    assert not ok and "pending requests" in message
    outs = sched.abort("r1")
    assert outs and outs[0].finish == {"type": "abort", "message": "aborted by client"}
    assert [r.rid for r in sched.running] == ["r0", "r2"]
    assert sched.abort("nope") == []
    while sched.has_work:
        sched.step()
    state = sched.internal_state()
    assert state["spec_verify_ct_total"] > 0 and state["avg_spec_accept_length"] >= 1
    ok, _ = sched.flush()
    assert ok
    state = sched.internal_state()
    assert state["spec_verify_ct_total"] == 0 and "avg_spec_accept_length" not in state


def test_counters_fold_every_decode_log_interval_never_on_idle(tp1_models) -> None:
    """As SGLang 0.5.23 (metrics_reporter.py l.934, l.999-1000): the totals behind
    ``avg_spec_accept_length`` grow only when the decode-batch count since start or the last flush is
    a multiple of decode_log_interval (40 by default), and never when the engine goes idle. So one
    short request on a fresh engine leaves the key absent, and 40 decode batches make it present."""
    pushed = []
    sched = Scheduler(model=tp1_models[0], spec=SpecConfig(3, 1, 4, PRESET.draft_layers), max_running_requests=8,
                      context_length=PRESET.context_length, decode_log_interval=40, log_stats=True,
                      on_stats=pushed.append)
    sched.run(greedy_requests(PROMPTS[:1], max_new_tokens=8))  # the contract's one short request
    assert not sched.has_work and 0 < sched.forward_ct_decode < 40
    assert "avg_spec_accept_length" not in sched.internal_state() and pushed == []
    while sched.forward_ct_decode < 40:  # more decode batches, one short request at a time
        sched.run(greedy_requests(PROMPTS[:1], max_new_tokens=8))
    state = sched.internal_state()
    assert len(pushed) == 1 and state["avg_spec_accept_length"] >= 1
    assert state["spec_verify_ct_total"] == 40  # the 40 batches before the fold, one request each
    ok, _ = sched.flush()  # reset_metrics: the count starts again, the key is gone until the next fold
    assert ok and sched.forward_ct_decode == 0 and "avg_spec_accept_length" not in sched.internal_state()


def test_prefill_token_budget_splits_batches(tp1_models) -> None:
    sched = _scheduler(tp1_models, max_prefill_tokens=20)
    for req in greedy_requests(["x" * 15, "y" * 15, "z" * 15], max_new_tokens=2):
        sched.submit(req)
    sched.step()
    assert len(sched.running) == 1 and len(sched.waiting) == 2


def test_a_request_the_worker_cannot_take_is_aborted_not_fatal(tp1_models) -> None:
    """A seed torch cannot unpack (a check missed upstream) must not take the rank down: the
    request ends as an abort and the scheduler serves the next one as before."""
    sched = _scheduler(tp1_models)
    bad = GenerateReq(rid="bad", input_ids=(1, 2), params=SamplingParams(max_new_tokens=4, temperature=0.7), seed=2**64)
    outs = sched.submit(bad)
    assert [(o.rid, o.finish["type"]) for o in outs] == [("bad", "abort")]
    assert "Overflow" in outs[0].finish["message"] and not sched.has_work
    good = greedy_requests(["after the bad one"], max_new_tokens=6)
    assert sched.submit(good[0]) == []
    tokens = []
    while sched.has_work:
        tokens.extend(t for o in sched.step() for t in o.token_ids)
    assert tokens == run_tp(tp1_models, good)["r0"]
