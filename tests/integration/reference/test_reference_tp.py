"""TP=2 over real worker processes (gloo), end to end over HTTP, and 32 concurrent requests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from serving.engine.process import EngineProcess
from serving.reference.config import PRESETS
from serving.reference.model import Model, dtype_from_name
from serving.reference.parallel import SingleRank
from serving.reference.protocol import GenerateReq
from serving.reference.sampling import SamplingParams
from serving.reference.scheduler import Scheduler
from serving.reference.tokenizer import ByteTokenizer

from helpers.reference_server import generate_concurrently, http, running_server, worker_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMPTS = [f"Request {i}: {topic}" for i, topic in enumerate(
    ["weather", "a poem about cats", "SELECT * FROM t", "def main():", "Dear Sir,", "1, 2, 3,", "The capital of",
     "Once upon a time", "import os", "Hello, world", "<html>", "Roses are red", "Q: 2+2?\\nA:", "The end",
     "Speculative decoding", "fn main() {", "Lorem ipsum", "To be or not", "x = [1, 2,", "Breaking news:",
     "All work and no play", "Mary had a little", "It was a dark and", "#include <stdio.h>", "git commit -m",
     "The mitochondria is", "In the beginning", "Knock knock.", "Why did the chicken", "Call me Ishmael.",
     "It is a truth", "Happy families"])]
assert len(PROMPTS) == 32


def body(prompt: str, n: int) -> dict:
    return {"text": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}}


@pytest.fixture(scope="module")
def expected() -> dict[str, list[int]]:
    """Greedy outputs computed in this process, plain decoding on one rank (the reference)."""
    preset = PRESETS["ref-tiny"]
    model = Model(preset=preset, seed=preset.seed, comm=SingleRank(), device=__import__("torch").device("cpu"),
                  dtype=dtype_from_name(preset.dtype))
    tok = ByteTokenizer(vocab_size=preset.vocab_size)
    reqs = [GenerateReq(rid=p, input_ids=tuple(tok.encode(p)), params=SamplingParams(max_new_tokens=24, temperature=0.0), seed=0)
            for p in PROMPTS]
    return Scheduler(model=model, spec=None, max_running_requests=64, context_length=preset.context_length,
                     log_stats=False).run(reqs)


SECRETS = {"SPECTUNE_API_TOKEN": "tok-3141-secret", "NCCL_IB_SECRET_KEY": "ib-2718-secret"}
CORRUPT_LL128 = "corrupt_allreduce_when:NCCL_PROTO=LL128"


@pytest.fixture(scope="module")
def tp2_spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """TP 2 with a tree (5/4/8), secrets in its env, and the LL128 corruption fault switched on
    but not armed (NCCL_PROTO is Simple here), so every test below also proves it harmless."""
    flags = ("--tp-size", "2", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5",
             "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8")
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "SPECTUNE_REFERENCE_FAULT": CORRUPT_LL128, **SECRETS}
    with running_server(*flags, log_dir=tmp_path_factory.mktemp("ref-tp2"), env=env) as engine:
        yield engine


def test_tp2_has_exactly_two_workers_each_in_a_world_of_two(tp2_spec_server: EngineProcess) -> None:
    workers = worker_processes(tp2_spec_server)
    assert sorted(w.name() for w in workers) == ["ref::tp0", "ref::tp1"]
    _, info = http(tp2_spec_server, "/server_info")
    ranks = info["reference_engine"]["workers"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in ranks)
    assert {r["pid"] for r in ranks} == {w.pid for w in workers}
    log = tp2_spec_server.log_path.read_text()
    for rank in (0, 1):
        line = re.search(rf"worker ref::tp{rank} starting: rank={rank} world_size=2 .*", log)
        assert line, f"no start-up line for rank {rank}"
        assert "NCCL_ALGO=Ring" in line.group(0) and "NCCL_PROTO=Simple" in line.group(0)
        assert "SPECTUNE_API_TOKEN=<redacted>" in line.group(0) and "NCCL_IB_SECRET_KEY=<redacted>" in line.group(0)
    for secret in SECRETS.values():
        assert secret not in log, "a secret value was logged verbatim"


def test_tp2_speculative_greedy_matches_plain_tp1_over_http(tp2_spec_server: EngineProcess, expected) -> None:
    outs = generate_concurrently(tp2_spec_server, [body(p, 24) for p in PROMPTS[:20]])
    for prompt, out in zip(PROMPTS, outs):
        assert out["output_ids"] == expected[prompt], prompt
        assert 1 <= out["meta_info"]["spec_accept_length"] <= 6 + 1


def test_32_concurrent_requests_complete_correctly(tp2_spec_server: EngineProcess, expected) -> None:
    outs = generate_concurrently(tp2_spec_server, [body(p, 24) for p in PROMPTS])
    assert len(outs) == 32
    for prompt, out in zip(PROMPTS, outs):
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
        assert out["output_ids"] == expected[prompt], prompt


def test_32_concurrent_plain_tp1(tmp_path: Path, expected) -> None:
    with running_server("--max-running-requests", "8", log_dir=tmp_path) as engine:
        outs = generate_concurrently(engine, [body(p, 24) for p in PROMPTS])
    for prompt, out in zip(PROMPTS, outs):
        assert out["output_ids"] == expected[prompt], prompt


def test_tp2_corrupted_all_reduce_changes_greedy_output_and_stays_healthy(tmp_path: Path, expected) -> None:
    """``corrupt_allreduce_when:NCCL_PROTO=LL128`` with NCCL_PROTO=LL128: the engine serves
    every request to its full length, healthy, but greedy output is not the baseline's (which the
    tests above get from the same switch unarmed): what a sweep's correctness probe must reject."""
    env = {"NCCL_PROTO": "LL128", "SPECTUNE_REFERENCE_FAULT": CORRUPT_LL128}
    flags = ("--tp-size", "2", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    with running_server(*flags, log_dir=tmp_path, env=env) as engine:
        outs = generate_concurrently(engine, [body(p, 24) for p in PROMPTS[:8]])
        assert http(engine, "/health_generate")[0] == 200
        assert engine._popen.poll() is None  # noqa: SLF001
        log = engine.log_path.read_text()
    assert all(out["meta_info"]["finish_reason"] == {"type": "length", "length": 24} for out in outs)
    differing = [p for p, out in zip(PROMPTS, outs) if out["output_ids"] != expected[p]]
    assert len(differing) >= 6, f"only {differing} differ from the baseline"
    assert log.count("holds in this rank's environment: all-reduce results are corrupted") == 2
