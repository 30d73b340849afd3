"""Decode graphs' replay logic on the CPU: static buffers, padding to the captured size, key-length
buckets and the eager fallback, run through the same code as on CUDA with every "replay"
executed eagerly (``use_cuda_graphs=False``). The real capture is tested on a GPU
(tests/gpu/test_reference_cuda_graphs.py)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from serving.cuda_graph_rules import plan_decode_graphs
from serving.reference.cuda_graphs import key_length_buckets
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.scheduler import Scheduler
from serving.reference.server_args import parse_args
from serving.reference.speculative import SpecConfig

from helpers.reference_core import PRESET, PROMPTS, TOKENIZER

CAPTURED = [1, 2, 4]
MAX_RUNNING = 6  # batches of 5 and 6 are above the largest captured size: eager


def _scheduler(models, spec, *, graphs: bool, pad: bool = True) -> Scheduler:
    plan = None
    if graphs:
        plan = plan_decode_graphs(speculative=spec is not None, gpu_memory_mib=None, tp_size=1,
                                  request_pool=MAX_RUNNING, cuda_graph_bs_decode=CAPTURED,
                                  disable_cuda_graph_padding=not pad)
    return Scheduler(
        model=models[0],
        spec=SpecConfig(*spec, draft_layers=PRESET.draft_layers) if spec else None,
        max_running_requests=MAX_RUNNING,
        context_length=PRESET.context_length,
        decode_log_interval=10**9,
        log_stats=False,
        decode_graphs=plan,
        use_cuda_graphs=False,
    )


def _requests(n: int) -> list[GenerateReq]:
    # Uneven lengths: the batch shrinks 6 -> 5 -> ... -> 1 as requests finish, through every
    # captured size, a padded size (3 -> 4) and the eager sizes above 4.
    return [
        GenerateReq(rid=f"r{i}", input_ids=tuple(TOKENIZER.encode(PROMPTS[i % len(PROMPTS)])),
                    params=SamplingParams(max_new_tokens=6 + 7 * i, temperature=0.0), seed=i)
        for i in range(n)
    ]


@pytest.mark.parametrize("spec", [None, (3, 1, 4), (3, 2, 6), (1, 1, 2)])
def test_graph_path_emits_what_eager_emits(tp1_models, spec) -> None:
    """Every batch size on the way down: replayed (padded up where needed) or eager above the
    largest captured size, the tokens are the eager scheduler's."""
    eager = _scheduler(tp1_models, spec, graphs=False).run(_requests(MAX_RUNNING))
    graphed = _scheduler(tp1_models, spec, graphs=True)
    got = graphed.run(_requests(MAX_RUNNING))
    assert got == eager
    assert graphed.graphs is not None
    assert graphed.graphs.counts.graph > 0 and graphed.graphs.counts.eager > 0  # both paths ran


def test_padding_off_replays_exact_sizes_only(tp1_models) -> None:
    """--disable-cuda-graph-padding: a batch of 3 (no size 3 captured) runs eagerly."""
    sched = _scheduler(tp1_models, (3, 1, 4), graphs=True, pad=False)
    assert sched.graphs is not None and not sched.graphs.pad
    assert sched.graphs.speculate(roots=[1, 2, 3], prefix=[5, 5, 5]) is None
    assert sched.graphs.speculate(roots=[1, 2], prefix=[5, 5]) is not None
    assert (sched.graphs.counts.graph, sched.graphs.counts.eager) == (1, 1)


def test_a_step_replays_the_shortest_key_length_that_holds_it(tp1_models) -> None:
    sched = _scheduler(tp1_models, None, graphs=True)
    graphs = sched.graphs
    assert graphs is not None
    assert graphs.key_lengths == key_length_buckets(sched.cache.max_cols)
    assert graphs._shape(3, 255) == (4, 256)  # noqa: SLF001 - the choice under test
    assert graphs._shape(3, 256) == (4, 256)  # noqa: SLF001
    assert graphs._shape(1, 257) == (1, 512)  # noqa: SLF001
    assert graphs._shape(2, sched.cache.max_cols) == (2, sched.cache.max_cols)  # noqa: SLF001
    assert graphs._shape(5, 10) is None  # noqa: SLF001 - above the largest size: eager


def test_key_length_buckets() -> None:
    assert key_length_buckets(4109) == [256, 512, 1024, 2048, 4096, 4109]
    assert key_length_buckets(256) == [256]
    assert key_length_buckets(100) == [100]


def test_graphs_allocate_the_cache_whole_and_report_the_sizes(tp1_models) -> None:
    sched = _scheduler(tp1_models, (3, 1, 4), graphs=True)
    assert (sched.cache.rows, sched.cache.cols) == (sched.cache.max_rows, sched.cache.max_cols)
    assert sched.decode_cuda_graph_bs == CAPTURED
    state = sched.internal_state()
    assert state["decode_cuda_graph_bs"] == CAPTURED
    assert state["cuda_graph_passes"] == {"decode_cuda_graph": 0, "decode_none": 0}
    assert _scheduler(tp1_models, (3, 1, 4), graphs=False).internal_state()["decode_cuda_graph_bs"] == []


def test_a_one_step_draft_is_captured_as_sglang_captures_its_draft_extend(tp1_models, caplog) -> None:
    """SGLang's draft decode runner exists only for --speculative-num-steps > 1, but a one-step draft's
    forward (the draft extend) has a graph of its own: the reference engine's one-step draft loop is
    captured too, under the extend's name, and replayed (it used to run eagerly, slower on a GPU)."""
    assert _scheduler(tp1_models, (3, 1, 4), graphs=True).graphs.draft_graph_name == "draft decode"
    caplog.clear()  # the three-step engine's lines are caught too where an earlier test left the logger at INFO
    with caplog.at_level(logging.INFO, logger="serving.reference.cuda_graphs"):
        one_step = _scheduler(tp1_models, (1, 1, 2), graphs=True).graphs
    assert one_step.draft_graph_name == "draft extend"
    assert {phase for phase, _bs, _len in one_step._recorded} == {"draft", "verify"}  # noqa: SLF001
    assert any(r.getMessage().startswith("Capture draft extend CUDA graph begin.") for r in caplog.records)
    assert not any("draft decode" in r.getMessage() for r in caplog.records)


def test_decode_log_line_says_whether_the_graph_ran(tp1_models, caplog) -> None:
    """SGLang's decode line carries ``cuda graph: <bool>`` before the throughput."""
    sched = Scheduler(model=tp1_models[0], spec=None, max_running_requests=MAX_RUNNING,
                      context_length=PRESET.context_length, decode_log_interval=2,
                      decode_graphs=plan_decode_graphs(speculative=False, gpu_memory_mib=None, tp_size=1,
                                                       request_pool=MAX_RUNNING, cuda_graph_bs_decode=CAPTURED),
                      use_cuda_graphs=False)
    with caplog.at_level(logging.INFO, logger="serving.reference.scheduler"):
        sched.run(_requests(1))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Decode batch.")]
    assert lines and all(", cuda graph: True, gen throughput (token/s): " in line for line in lines)


# ----------------------------------------------------------------------------- flags


def test_graph_flags_are_sglangs_and_reported_as_given() -> None:
    args = parse_args(["--model-path", "ref-tiny", "--cuda-graph-bs-decode", "1", "2", "4",
                       "--cuda-graph-backend-decode", "full", "--disable-cuda-graph-padding"], cuda_available=False,
                      cuda_device_count=0)
    assert args.to_dict()["cuda_graph_bs_decode"] == [1, 2, 4]
    plan = args.decode_graph_plan()
    assert (plan.bs, plan.captured, plan.pad) == ((1, 2, 4), (1, 2, 4), False)
    assert "gpu_memory_mib" not in args.to_dict() and "graph_flags" not in args.to_dict()


def test_disable_cuda_graph_is_deprecated_and_turns_decode_graphs_off(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        args = parse_args(["--model-path", "ref-tiny", "--disable-cuda-graph"], cuda_available=False, cuda_device_count=0)
    assert "'--disable-cuda-graph' is deprecated and will be removed in a future release. " \
           "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead." in caplog.text
    assert not args.decode_graph_plan().enabled and args.eager_decode_reason is None


def test_why_decode_runs_eagerly() -> None:
    cpu = parse_args(["--model-path", "ref-tiny"], cuda_available=False, cuda_device_count=0)
    assert cpu.eager_decode_reason == "decode CUDA graphs need --device cuda; decode runs eagerly on the CPU"
    assert not cpu.captures_decode_graphs
    tp2 = dataclasses.replace(cpu, device="cuda", tp_size=2)
    assert "not captured at --tp-size 2" in tp2.eager_decode_reason and "eagerly" in tp2.eager_decode_reason
    assert dataclasses.replace(cpu, device="cuda").captures_decode_graphs


def test_the_request_pool_shrinks_to_the_static_cache_that_fits(caplog) -> None:
    """ref-gpu-comm's cache is 1 MiB per token: 48 rows of 4096+ positions do not fit an H200."""
    from serving.reference.config import get_preset
    from serving.reference.server_args import _fit_static_cache

    args = parse_args(["--model-path", "ref-gpu-comm", "--speculative-algorithm", "EAGLE3"],
                      cuda_available=False, cuda_device_count=0)
    on_h200 = dataclasses.replace(args, device="cuda", gpu_memory_mib=143771.0)
    with caplog.at_level(logging.WARNING):
        fitted = _fit_static_cache(on_h200, preset=get_preset("ref-gpu-comm"))
    assert fitted.max_running_requests == 26  # (0.85 x 140.4 GiB - 12.9 GiB weights) / 4.0 GiB a row
    assert "max_running_requests is reduced from 48 to 26" in caplog.text
    assert max(fitted.decode_graph_plan().captured) == 26
    short = dataclasses.replace(on_h200, context_length=1024)
    assert _fit_static_cache(short, preset=get_preset("ref-gpu-comm")).max_running_requests == 48
    with pytest.raises(ValueError, match="lower --context-length, raise --mem-fraction-static, or pass "
                                         "--disable-decode-cuda-graph"):
        _fit_static_cache(dataclasses.replace(on_h200, gpu_memory_mib=16000.0), preset=get_preset("ref-gpu-comm"))
    off = dataclasses.replace(on_h200, graph_flags={**on_h200.graph_flags, "disable_decode_cuda_graph": True})
    assert _fit_static_cache(off, preset=get_preset("ref-gpu-comm")).max_running_requests == 48
