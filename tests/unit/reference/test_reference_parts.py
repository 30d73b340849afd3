"""Tokenizer, sampling parameters, fault switches, the env registry and the metrics text."""

from __future__ import annotations

import pytest
import torch

from serving.environ import ENV, EnvVar, parse_bool
from serving.reference.faults import Faults, parse_faults
from serving.reference.metrics import ReferenceMetrics
from serving.reference.sampling import SamplingParams, target_probs
from serving.reference.tokenizer import (
    ASSISTANT_ID,
    BOS_ID,
    END_OF_TURN_ID,
    USER_ID,
    ByteTokenizer,
    IncrementalDecoder,
    render_chat,
)

TOK = ByteTokenizer(vocab_size=264)


def test_tokenizer_round_trip() -> None:
    text = "héllo, wörld ✓ 🚀"
    ids = TOK.encode(text)
    assert ids[0] == BOS_ID and len(ids) == 1 + len(text.encode())
    assert TOK.decode(ids) == text
    assert TOK.decode(ids, skip_special_tokens=False).startswith("<|bos|>")


def test_check_ids_names_the_bad_entry() -> None:
    with pytest.raises(ValueError, match=r"input_ids\[1\]=999"):
        TOK.check_ids([1, 999], field="input_ids")
    with pytest.raises(ValueError, match=r"input_ids\[0\] must be an integer"):
        TOK.check_ids(["a"], field="input_ids")


def test_incremental_decoder_never_splits_a_character() -> None:
    data = "a✓🚀b".encode()
    dec = IncrementalDecoder()
    pieces = [dec.push([byte]) for byte in data]
    assert "".join(pieces) == "a✓🚀b"
    assert all("\ufffd" not in p for p in pieces)
    dec = IncrementalDecoder()
    assert dec.push(list("✓".encode())[:2]) == ""
    assert dec.push([], final=True) == "\ufffd"


def test_chat_template() -> None:
    ids = render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert ids[0] == BOS_ID and ids[-1] == ASSISTANT_ID
    assert USER_ID in ids and END_OF_TURN_ID in ids
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        render_chat([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="text part"):
        render_chat([{"role": "user", "content": [{"type": "image_url"}]}])


def test_sampling_params_checks() -> None:
    p = SamplingParams.from_request({"max_new_tokens": 5, "temperature": 0, "stop": "x", "n": 1})
    assert p.greedy and p.stop == ("x",) and p.max_new_tokens == 5
    assert SamplingParams.from_request({"top_k": 1, "temperature": 0.9}).greedy
    for raw, needle in [
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0"),
        ({"temperature": -0.1}, "temperature must be non-negative"),
        ({"top_p": 0}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"max_new_tokens": "3"}, "must be an integer"),
        ({"unknown": 1}, "unexpected keyword argument 'unknown'"),
        ({"frequency_penalty": 0.5}, "not supported"),
        ([1], "must be an object"),
    ]:
        with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            SamplingParams.from_request(raw)  # type: ignore[arg-type]


def test_target_probs_filters() -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert p[2] == 0 and p[3] == 0 and float(p.sum()) == pytest.approx(1.0)
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert p[0] == pytest.approx(1.0)
    p = target_probs(logits, SamplingParams(temperature=1.0, min_p=0.3))
    assert p[2] == 0 and p[1] > 0


def test_fault_switches() -> None:
    assert parse_faults("") == Faults()
    assert parse_faults("crash_on_start").crash_on_start
    assert parse_faults("hang_on_start").hang_on_start
    assert parse_faults("die_after_tokens:12").die_after_tokens == 12
    assert parse_faults("late_env:NCCL_ALGO, NCCL_PROTO").late_env == ("NCCL_ALGO", "NCCL_PROTO")
    both = parse_faults("late_env:NCCL_ALGO;die_after_tokens:3")
    assert both.late_env == ("NCCL_ALGO",) and both.die_after_tokens == 3
    for bad in ("explode", "die_after_tokens:x", "die_after_tokens:0", "late_env:"):
        with pytest.raises(ValueError, match="SPECTUNE_REFERENCE_FAULT"):
            parse_faults(bad)


def test_env_registry_reads_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    var = ENV.SPECTUNE_REFERENCE_FAULT
    monkeypatch.delenv(var.name, raising=False)
    assert var.get() == "" and not var.is_set()
    monkeypatch.setenv(var.name, "hang_on_start")
    assert var.get() == "hang_on_start" and parse_faults().hang_on_start
    threads = ENV.SPECTUNE_REFERENCE_TORCH_THREADS
    assert threads.get({threads.name: "3"}) == 3
    with pytest.raises(ValueError, match="SPECTUNE_REFERENCE_TORCH_THREADS='x'"):
        threads.get({threads.name: "x"})
    with pytest.raises(AttributeError, match="no spectune environment variable"):
        ENV.SPECTUNE_NOPE  # noqa: B018
    assert EnvVar(name="X", parse=parse_bool, default=False, doc="").get({"X": "yes"}) is True
    assert all(v.doc for v in ENV)


def test_metrics_text_uses_sglang_names() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    m = ReferenceMetrics(model_name="ref-tiny")
    m.observe_finished_request(prompt_tokens=3, generation_tokens=5, cached_tokens=0, e2e_latency=0.5,
                               spec_verify_ct=2, finish_type="length", decode_seconds=0.4, is_streaming=False)
    m.observe_time_to_first_token(0.03, is_streaming=False)
    m.set_scheduler_state({"num_running_reqs": 2, "last_spec_accept_length": 2.5, "last_gen_throughput": 10.0})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(m.render()) for s in f.samples}
    req = (("engine_type", "unified"), ("is_streaming", "false"), ("model_name", "ref-tiny"))
    assert samples[("sglang:generation_tokens_total", req)] == 5.0
    assert samples[("sglang:time_to_first_token_seconds_bucket", tuple(sorted(req + (("le", "0.1"),))))] == 1.0
    sched = (("engine_type", "unified"), ("model_name", "ref-tiny"), ("moe_ep_rank", "0"), ("pp_rank", "0"),
             ("tp_rank", "0"))
    assert samples[("sglang:spec_accept_length", sched)] == 2.5
    assert samples[("sglang:num_running_reqs", sched)] == 2.0
