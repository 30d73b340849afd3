"""SGLang 0.5.23's decode CUDA-graph rule: the capture list, its defaults and cuts, and padding."""

from __future__ import annotations

import pytest

from serving.cuda_graph_rules import (
    decode_batch_sizes,
    default_decode_max_bs,
    graph_batch_size,
    plan_decode_graphs,
)

H200_MIB = 143771


def test_the_lists_follow_sglangs_patterns() -> None:
    spec = decode_batch_sizes(256, speculative=True)
    assert spec[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16] and spec[-2:] == [248, 256] and len(spec) == 51
    plain = decode_batch_sizes(256, speculative=False)
    assert plain[:6] == [1, 2, 4, 8, 12, 16] and len(plain) == 36
    assert decode_batch_sizes(9, speculative=True) == [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_bs appended"
    assert decode_batch_sizes(5, speculative=False, disable_padding=True) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("mib", "tp", "max_bs"), [
    (16 * 1024, 1, 8), (24 * 1024, 1, 48), (24 * 1024, 8, 160), (48 * 1024, 2, 32), (80 * 1024, 1, 256),
    (H200_MIB, 8, 512), (192 * 1024, 1, 512), (None, 1, 160),
])
def test_max_bs_defaults_by_gpu_memory_and_tp(mib, tp, max_bs) -> None:
    assert default_decode_max_bs(mib, tp) == max_bs


def test_one_h200_under_eagle_captures_23_sizes_up_to_48_but_reports_the_list_to_256() -> None:
    plan = plan_decode_graphs(speculative=True, gpu_memory_mib=H200_MIB, tp_size=1)
    assert plan.captured == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48)
    assert plan.max_bs == 256 and plan.bs[-1] == 256 and plan.config_dict()["backend"] == "full"


def test_an_explicit_list_wins_over_the_max_and_the_pool_cut_appends_the_pool() -> None:
    plan = plan_decode_graphs(speculative=True, gpu_memory_mib=H200_MIB, tp_size=1, cuda_graph_bs_decode=[8, 1, 4],
                              cuda_graph_max_bs_decode=64)
    assert plan.bs == (1, 4, 8) and plan.max_bs == 8 and plan.captured == (1, 4, 8)
    cut = plan_decode_graphs(speculative=False, gpu_memory_mib=H200_MIB, tp_size=1, max_running_requests=20)
    assert cut.max_bs == 20 and cut.captured[-1] == 20


@pytest.mark.parametrize("flags", [{"disable_decode_cuda_graph": True}, {"disable_cuda_graph": True},
                                   {"cuda_graph_backend_decode": "disabled"}])
def test_off_switches_capture_nothing(flags) -> None:
    plan = plan_decode_graphs(speculative=True, gpu_memory_mib=H200_MIB, tp_size=1, **flags)
    assert plan.backend == "disabled" and plan.captured == () and not plan.enabled


def test_the_backend_flag_wins_over_the_deprecated_off_switch() -> None:
    plan = plan_decode_graphs(speculative=True, gpu_memory_mib=H200_MIB, tp_size=1, disable_cuda_graph=True,
                              cuda_graph_backend_decode="full")
    assert plan.enabled


def test_a_batch_pads_up_to_the_next_captured_size_and_runs_eagerly_above_the_largest() -> None:
    captured = [1, 2, 4, 8]
    assert [graph_batch_size(b, captured) for b in (1, 3, 5, 8, 9)] == [1, 4, 8, 8, None]
    assert graph_batch_size(3, captured, pad=False) is None and graph_batch_size(4, captured, pad=False) == 4
    assert graph_batch_size(1, []) is None
