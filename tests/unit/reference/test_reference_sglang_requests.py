"""SGLang's request shapes in the reference engine, without a server: batched ``/generate``
normalisation (``GenerateReqInput.normalize_batch_and_arguments``), ``stream_interval``, and the
scheduler's logprobs and draft histogram (target-model values under speculation)."""

from __future__ import annotations

import pytest
import torch

from serving.reference.http_common import AppState, RequestError, StreamInterval
from serving.reference.model import Attention, PrefillSpan
from serving.reference.native_api import MAX_BATCH_SIZE, parse_generate
from serving.reference.protocol import GenerateReq, TokenOut
from serving.reference.sampling import SamplingParams
from serving.reference.scheduler import Scheduler
from serving.reference.server_args import parse_args
from serving.reference.speculative import SpecConfig

from helpers.reference_core import PRESET, TOKENIZER

STATE = AppState(args=parse_args(["--model-path", "ref-tiny"]), tokenizer=TOKENIZER, metrics=None)


def parse(body: dict) -> tuple[list[GenerateReq], bool, bool]:
    return parse_generate(STATE, body)


# ------------------------------------------------------------------------------ batching
def test_text_list_is_a_batch_with_shared_or_per_item_sampling_params() -> None:
    # python/sglang/test/send_one.py --batch-size 2: "text" is [prompt] * batch_size, one dict of
    # sampling_params (with json_schema None), return_logprob False.
    reqs, single, stream = parse({
        "text": ["Human: hi", "Human: hi"], "image_data": None,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "frequency_penalty": 0.0,
                            "presence_penalty": 0.0, "json_schema": None, "stop": ["Question", "Assistant:"]},
        "return_logprob": False, "stream": False,
    })
    assert not single and not stream and len(reqs) == 2
    assert reqs[0].input_ids == reqs[1].input_ids == tuple(TOKENIZER.encode("Human: hi"))
    assert reqs[0].rid != reqs[1].rid and reqs[0].params.max_new_tokens == 8
    # One list entry per item (GenerateReqInput: sampling_params: Union[List[Dict], Dict]).
    reqs, _, _ = parse({"input_ids": [[256, 97], [256, 98, 99]],
                        "sampling_params": [{"max_new_tokens": 3}, {"max_new_tokens": 5, "temperature": 0}]})
    assert [r.input_ids for r in reqs] == [(256, 97), (256, 98, 99)]
    assert [r.params.max_new_tokens for r in reqs] == [3, 5]
    # A one-item list is still a batch (SGLang answers it with a list of one).
    reqs, single, _ = parse({"text": ["x"]})
    assert not single and len(reqs) == 1


def test_batch_rids_follow_sglang() -> None:
    """_normalize_rid: a string becomes <rid>_<i>; a list must match the batch, without repeats."""
    reqs, _, _ = parse({"text": ["a", "b", "c"], "rid": "job"})
    assert [r.rid for r in reqs] == ["job_0", "job_1", "job_2"]
    reqs, _, _ = parse({"text": ["a", "b"], "rid": ["x", "y"]})
    assert [r.rid for r in reqs] == ["x", "y"]
    reqs, _, _ = parse({"text": "a", "rid": "only"})
    assert [r.rid for r in reqs] == ["only"]


def test_batch_logprob_fields_may_be_per_item() -> None:
    reqs, _, _ = parse({"text": ["ab", "cd"], "return_logprob": [True, False], "top_logprobs_num": [2, 0],
                        "logprob_start_len": [0, -1]})
    assert [(r.return_logprob, r.top_logprobs_num, r.logprob_start_len) for r in reqs] == [(True, 2, 0), (False, 0, -1)]


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"text": []}, "'text' is an empty list"),
        ({"text": ["a"] * (MAX_BATCH_SIZE + 1)}, f"at most {MAX_BATCH_SIZE}"),
        ({"text": ["a", 3]}, "'text[1]' must be a string, got int"),
        ({"input_ids": [[256, 97], []]}, "input_ids[1] must be a non-empty list of token ids"),
        ({"input_ids": [[256, 97], [1, 99999]]}, "input_ids[1][1]=99999 is outside the vocabulary"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "'sampling_params' has 1 entries for a batch of 2"),
        ({"text": "a", "sampling_params": [{}]}, "'sampling_params' is a list, which needs a batch"),
        ({"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": -1}]}, "sampling_params[1].max_new_tokens"),
        ({"text": ["a", "b"], "rid": ["x"]}, "'rid' has 1 entries for a batch of 2"),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "Duplicate request IDs detected within the request: ['x']"),
        ({"text": ["a", "b"], "rid": ["x", 7]}, "'rid[1]' must be a non-empty string, got 7"),
        ({"text": "a", "rid": ["x"]}, "'rid' must be a non-empty string, got ['x']"),
        ({"text": ["a", "b"], "return_logprob": [True]}, "'return_logprob' has 1 entries"),
        ({"text": "a", "return_logprob": "yes"}, "'return_logprob' must be true or false, got 'yes'"),
        ({"text": "a", "return_logprob": True, "top_logprobs_num": -1}, "'top_logprobs_num' must be an integer in [0, "),
        ({"text": "abc", "return_logprob": True, "logprob_start_len": 4}, "'logprob_start_len' must be an integer in [-1, 3], got 4"),
        ({"text": ["ab", "c"], "return_logprob": True, "logprob_start_len": [0, 5]},
         "'logprob_start_len[1]' must be an integer in [-1, 1], got 5"),
        ({"text": "a", "lora_path": "sql-expert"}, "LoRA adapter 'sql-expert' was requested, but LoRA is not enabled"),
    ],
)
def test_bad_batches_are_refused_with_the_field_and_value(body: dict, needle: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(body)
    assert info.value.status == 400 and needle in str(info.value)


# ------------------------------------------------------------------------------ stream_interval
def test_stream_interval_is_accepted_and_bounded() -> None:
    assert SamplingParams.from_request({"stream_interval": 4}).stream_interval == 4
    assert SamplingParams.from_request({"stream_interval": None}).stream_interval is None
    for bad, needle in ((0, "must be an integer in [1, 1073741824], got 0"), ("4", "must be an integer"),
                        (True, "must be an integer"), (2**31, "got 2147483648")):
        with pytest.raises(ValueError, match=r"sampling_params\.stream_interval") as info:
            SamplingParams.from_request({"stream_interval": bad})
        assert needle in str(info.value)


class _State:
    def __init__(self, n: int) -> None:
        self.output_ids = list(range(n))


def test_stream_interval_rule_is_sglangs() -> None:
    """Earlier SGLang's scheduler_output_processor_mixin (StreamInterval's docstring says how 0.5.23
    differs): out when len(output_ids) % interval == 1 (every time for
    1), always at the end; an update without new tokens is not a chunk."""
    every5 = StreamInterval(5)
    assert [n for n in range(1, 17) if every5.due(_State(n), (0,), False)] == [1, 6, 11, 16]
    assert every5.due(_State(3), (0,), True)
    assert not StreamInterval(None).due(_State(3), (), False)
    assert all(StreamInterval(None).due(_State(n), (0,), False) for n in range(1, 5))


# ------------------------------------------------------------------------------ logprobs
def _scheduler(models, spec=None) -> Scheduler:
    return Scheduler(
        model=models[0],
        spec=SpecConfig(*spec, draft_layers=PRESET.draft_layers) if spec else None,
        max_running_requests=8,
        context_length=PRESET.context_length,
        decode_log_interval=10**9,
        log_stats=False,
    )


def _run(models, reqs, spec=None) -> dict[str, list[TokenOut]]:
    sched = _scheduler(models, spec)
    outs: dict[str, list[TokenOut]] = {r.rid: [] for r in reqs}
    for r in reqs:
        sched.submit(r)
    while sched.has_work:
        for out in sched.step():
            outs[out.rid].append(out)
    return outs


def _flat(outs: list[TokenOut]) -> tuple[list[int], list[float], list]:
    return ([t for o in outs for t in o.token_ids], [v for o in outs for v in o.logprobs],
            [row for o in outs for row in o.top_logprobs])


def _reference_logprobs(model, prompt: tuple[int, ...], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax of one full causal forward of prompt + output: row i predicts token i + 1."""
    ids = list(prompt) + output
    cache = model.new_cache(max_rows=1, max_cols=len(ids) + 1)
    cache.reserve(rows=1, cols=len(ids))
    pos = torch.arange(len(ids))
    logits = model.forward(
        input_ids=torch.tensor(ids), positions=pos, kv_rows=torch.zeros(len(ids), dtype=torch.long), kv_cols=pos,
        attention=Attention(spans=[PrefillSpan(row=0, start=0, length=len(ids), offset=0)]), cache=cache,
        num_layers=model.num_layers,
    )
    return torch.log_softmax(logits.double() / temperature, dim=-1)


@pytest.mark.parametrize("spec", [None, (3, 1, 4), (3, 2, 6)])
def test_output_logprobs_are_the_targets_under_speculation(tp1_models, spec) -> None:
    """Every emitted token's logprob (and top-k) is the target model's at that position, whether
    the token came from decode or from a verify cycle: equal to one full forward's."""
    prompt = tuple(TOKENIZER.encode("The capital of France is"))
    req = GenerateReq(rid="g", input_ids=prompt, params=SamplingParams(max_new_tokens=24, temperature=0.0), seed=0,
                      return_logprob=True, top_logprobs_num=3)
    tokens, values, tops = _flat(_run(tp1_models, [req], spec)["g"])
    assert len(tokens) == len(values) == len(tops) == 24
    ref = _reference_logprobs(tp1_models[0], prompt, tokens)
    expect = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]
    assert values == pytest.approx(expect, abs=1e-4)
    for i, row in enumerate(tops):
        assert [t for _, t in row] == torch.topk(ref[len(prompt) - 1 + i], 3).indices.tolist()
        assert row[0][1] == tokens[i] and row[0][0] == pytest.approx(values[i])  # greedy: the argmax


def test_sampled_logprobs_use_the_temperature_scaled_distribution(tp1_models) -> None:
    """SGLang's sampler returns log(softmax(logits / T)) for a sampled request (before top-p)."""
    prompt = tuple(TOKENIZER.encode("Roll"))
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9)
    req = GenerateReq(rid="s", input_ids=prompt, params=params, seed=3, return_logprob=True)
    tokens, values, _ = _flat(_run(tp1_models, [req], (3, 1, 4))["s"])
    ref = _reference_logprobs(tp1_models[0], prompt, tokens, temperature=0.7)
    assert values == pytest.approx([float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)], abs=1e-4)


def test_input_logprobs_from_logprob_start_len(tp1_models) -> None:
    prompt = tuple(TOKENIZER.encode("Hello there"))
    ref = _reference_logprobs(tp1_models[0], prompt, [])
    for start in (0, 3):
        req = GenerateReq(rid="i", input_ids=prompt, params=SamplingParams(max_new_tokens=2, temperature=0.0), seed=0,
                          return_logprob=True, top_logprobs_num=2, logprob_start_len=start)
        first = _run(tp1_models, [req])["i"][0]
        expect = [None if p == 0 else float(ref[p - 1, prompt[p]]) for p in range(start, len(prompt))]
        if start == 0:
            assert first.input_logprobs[0] is None  # nothing predicts the first prompt token
        assert [v for v in first.input_logprobs if v is not None] == pytest.approx([v for v in expect if v is not None], abs=1e-4)
        assert len(first.input_logprobs) == len(first.input_top_logprobs) == len(prompt) - start
        assert (first.input_top_logprobs[0] is None) == (start == 0)
    plain = GenerateReq(rid="p", input_ids=prompt, params=SamplingParams(max_new_tokens=2, temperature=0.0), seed=0)
    assert all(not o.logprobs and not o.input_logprobs for o in _run(tp1_models, [plain], (3, 1, 4))["p"])


def test_correct_drafts_histogram_counts_each_verify_cycle(tp1_models) -> None:
    req = GenerateReq(rid="h", input_ids=tuple(TOKENIZER.encode("Once upon a time")),
                      params=SamplingParams(max_new_tokens=30, temperature=0.0), seed=0)
    outs = _run(tp1_models, [req], (3, 1, 4))["h"]
    final = outs[-1]
    hist = final.spec_correct_drafts_histogram
    assert sum(hist) == final.spec_verify_ct > 0
    assert sum(k * n for k, n in enumerate(hist)) == final.spec_accepted_drafts
    assert len(hist) <= 4 and all(not o.spec_correct_drafts_histogram for o in outs[:-1])


def test_token_ids_logprob_is_refused_not_ignored() -> None:
    with pytest.raises(RequestError, match="'token_ids_logprob' is not supported"):
        parse({"text": "a", "return_logprob": True, "token_ids_logprob": [1, 2]})
