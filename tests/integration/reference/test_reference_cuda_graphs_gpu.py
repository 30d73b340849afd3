"""Decode CUDA graphs on a GPU: captured as SGLang captures them, and the same tokens as eager.

Two GPU servers of ``ref-gpu-comm`` (EAGLE3, 3 steps, top-k 1 and 4 draft tokens: the chain; and
top-k 2 with 6: the tree): one with decode graphs of sizes 1, 2 and 4, one with
``--disable-decode-cuda-graph``. Six greedy requests of
uneven lengths at once take the batch from 6 down to 1: eager above 4, padded at 3, replayed at
4, 2 and 1. Skipped without CUDA (CI); run on the lent H200.
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest

from serving.engine.process import EngineProcess

from helpers.reference_server import generate_concurrently, http, running_server

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.timeout(600)]

COMMON = ("--model-path", "ref-gpu-comm", "--device", "cuda", "--speculative-algorithm", "EAGLE3",
          "--speculative-draft-model-path", "ref-gpu-comm-draft", "--context-length", "1024",
          "--max-running-requests", "8", "--mem-fraction-static", "0.3")
CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
PROMPTS = ["Write a short story about a robot", "def quicksort(items):", "The history of the printing press",
           "List five uses for a paperclip:", "SELECT customer_id FROM", "In the year 2150, the first colony"]


def _bodies() -> list[dict]:
    return [{"text": p, "sampling_params": {"max_new_tokens": 16 + 12 * i, "temperature": 0, "ignore_eos": True}}
            for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def graphed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    with running_server(*COMMON, *CHAIN, "--cuda-graph-bs-decode", "1", "2", "4",
                        log_dir=tmp_path_factory.mktemp("graphs")) as engine:
        yield engine


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    with running_server(*COMMON, *CHAIN, "--disable-decode-cuda-graph",
                        log_dir=tmp_path_factory.mktemp("eager")) as engine:
        yield engine


def test_tree_drafts_replay_to_the_same_outputs_as_eager(tmp_path) -> None:
    """Top-k 2: the general draft loop (candidate bookkeeping on the device) is captured too."""
    with running_server(*COMMON, *TREE, "--cuda-graph-bs-decode", "1", "2", "4", log_dir=tmp_path) as graphed_tree:
        got = [r["output_ids"] for r in generate_concurrently(graphed_tree, _bodies())]
        assert http(graphed_tree, "/server_info")[1]["internal_states"][0]["decode_cuda_graph_bs"] == [1, 2, 4]
    with running_server(*COMMON, *TREE, "--disable-decode-cuda-graph", log_dir=tmp_path) as eager_tree:
        want = [r["output_ids"] for r in generate_concurrently(eager_tree, _bodies())]
    assert got == want


def test_greedy_outputs_are_identical_to_eager(graphed: EngineProcess, eager: EngineProcess) -> None:
    got = [r["output_ids"] for r in generate_concurrently(graphed, _bodies())]
    want = [r["output_ids"] for r in generate_concurrently(eager, _bodies())]
    assert got == want
    passes = http(graphed, "/server_info")[1]["internal_states"][0]["cuda_graph_passes"]
    assert passes["decode_cuda_graph"] > 0 and passes["decode_none"] > 0, passes  # both paths ran


def test_server_info_reports_the_captured_sizes(graphed: EngineProcess, eager: EngineProcess) -> None:
    info = http(graphed, "/server_info")[1]
    assert info["internal_states"][0]["decode_cuda_graph_bs"] == [1, 2, 4]
    assert info["cuda_graph_config"]["decode"] == {"backend": "full", "max_bs": 4, "bs": [1, 2, 4]}
    assert info["internal_states"][0]["memory_usage"]["graph"] >= 0
    assert http(eager, "/server_info")[1]["internal_states"][0]["decode_cuda_graph_bs"] == []


def test_capture_is_logged_as_sglang_logs_it(graphed: EngineProcess) -> None:
    log = graphed.log_path.read_text(errors="replace")
    assert re.search(r"Capture draft decode CUDA graph begin\. backend=full, num_tokens_per_req=1, bs=\[1, 2, 4\], "
                     r"avail mem=[\d.]+ GB", log)
    assert re.search(r"Capture target verify CUDA graph end\. bs=\[1, 2, 4\], elapsed=[\d.]+ s, mem usage=[\d.-]+ GB",
                     log)
