"""The harness against the real reference engine (started through EngineProcess).

The acceptance properties: token counts are the server's completion_tokens; the server's and the
per-request accept lengths agree; speculation really sends several tokens per chunk; the probe
passes for speculative vs plain decoding and fails, naming the position, for different weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from orchestrator.bench import BenchmarkAborted, BenchSettings, read_json, run_benchmark, run_probe
from orchestrator.bench.datasets import load_builtin
from orchestrator.bench.loadgen import Sampling, WorkItem, run_load
from orchestrator.bench.metrics import RepetitionMetrics
from orchestrator.errors import BenchmarkError

from helpers.bench import running_engine
from helpers.engine import reference_config

pytestmark = [pytest.mark.integration]

OUTPUT_LEN = 48


def _records(url: str, *, stream: bool, prompts: int = 4):
    items = [WorkItem(prompt_id=p.id, text=p.text) for p in load_builtin()[:prompts]]

    async def go():
        async with aiohttp.ClientSession() as session:
            return await run_load(
                session=session, base_url=url, api="generate", items=items, concurrency=2,
                sampling=Sampling(max_new_tokens=OUTPUT_LEN), timeout_s=120, stream=stream, keep_output=True,
            )

    return asyncio.run(go()).records


@pytest.mark.timeout(180)
def test_token_counts_are_completion_tokens(reference_engine) -> None:
    whole = _records(reference_engine.url, stream=False)
    streamed = _records(reference_engine.url, stream=True)
    for one, other in zip(whole, streamed):
        assert one.error is None and other.error is None, (one.error, other.error)
        assert one.output_ids is not None and len(one.output_ids) == one.output_tokens == OUTPUT_LEN
        assert other.output_tokens == OUTPUT_LEN
        assert other.output_text == one.output_text  # the stream's cumulative text is the whole text
        assert other.num_chunks is not None and 1 < other.num_chunks < OUTPUT_LEN  # several tokens a chunk
        assert other.spec_verify_ct is not None and other.spec_verify_ct > 0


@pytest.mark.timeout(240)
def test_benchmark_accept_length_sources_agree(reference_engine) -> None:
    seen: list[RepetitionMetrics] = []
    settings = BenchSettings(num_prompts=8, output_len=OUTPUT_LEN, concurrency=[1, 4], repetitions=2,
                             warmup_requests=2, request_timeout_s=120)
    result = run_benchmark(base_url=reference_engine.url, settings=settings, on_repetition=seen.append)
    assert len(seen) == 4 and result.num_errors == 0
    assert result.flush_cache_supported and result.server["speculative_num_steps"] == 3
    assert result.server_accept_length_scope == "repetition"  # the reference engine resets on flush
    for rep in seen:
        assert rep.output_tokens == rep.num_ok * OUTPUT_LEN == 8 * OUTPUT_LEN
        assert rep.accept_length_requests is not None
        # As SGLang 0.5.23: the server's figure exists once 40 decode batches ran since the flush
        # (--decode-log-interval; a verify round is one batch). One at a time, 8 requests run more;
        # four at a time, fewer: absent, and nothing to cross-check (not a mismatch).
        if rep.concurrency == 1:
            assert rep.accept_length_server is not None and rep.accept_length_mismatch is False
            assert rep.accept_length_server == pytest.approx(rep.accept_length_requests, rel=0.05)
        else:
            assert rep.accept_length_server is None and rep.accept_length_mismatch is None
        assert 1.0 < rep.accept_length_requests <= 4.0  # at most num_draft_tokens per cycle
        assert rep.accepted_drafts_per_cycle == pytest.approx(rep.accept_length - 1)
        assert rep.spec_accept_length_meta > rep.accept_length_requests  # counts the prefill token
        assert rep.tokens_per_chunk is not None and rep.tokens_per_chunk > 1.0
        assert rep.cycle_ms is not None and rep.cycle_ms > 0
        assert rep.tpot_ms.median is not None and rep.tpot_ms.median > 0
    assert not result.accept_length_mismatch


@pytest.mark.timeout(180)
def test_openai_apis_give_the_per_request_speculative_fields_through_sglext(reference_engine) -> None:
    """SGLang 0.5.23's ``return_spec_tokens_details``: the OpenAI APIs (chat applies the chat template)
    report each request's verify count, accept length and accepted-draft histogram as /generate does."""
    for api in ("completions", "chat"):
        settings = BenchSettings(api=api, num_prompts=4, output_len=16, concurrency=[2], repetitions=1,
                                 warmup_requests=0, request_timeout_s=120)
        rep = run_benchmark(base_url=reference_engine.url, settings=settings).level(2).repetitions[0]
        assert rep.num_errors == 0 and rep.output_tokens == 4 * 16  # from usage
        assert rep.spec_verify_ct and rep.spec_verify_ct > 0 and rep.cycle_ms is not None, api
        assert rep.accept_length_requests is not None and rep.accept_length_requests > 1.0, api
        assert rep.accept_histogram and sum(rep.accept_histogram) == rep.spec_verify_ct, (api, rep.accept_histogram)
        # 16 tokens, 2 at a time: fewer than 40 decode batches since the flush, so (as SGLang) no server figure
        assert rep.accept_length_server is None and rep.accept_length_mismatch is None, (api, rep.accept_length_server)


@pytest.mark.timeout(300)
def test_probe_speculative_equals_plain_and_catches_other_weights(reference_engine, tmp_path: Path) -> None:
    baseline = tmp_path / "probe-baseline.json"
    with running_engine(reference_config(enable_metrics=True), tmp_path / "plain") as plain:
        written = run_probe(base_url=plain.url, baseline_path=baseline, num_prompts=6, max_new_tokens=24)
        assert written.status == "baseline_written"
    same = run_probe(base_url=reference_engine.url, baseline_path=baseline)
    assert same.status == "match" and same.unit == "token", same.message
    seeded = reference_config(speculative=True, enable_metrics=True, extra_args={"random_seed": 4321})
    with running_engine(seeded, tmp_path / "seeded") as other:
        changed = run_probe(base_url=other.url, baseline_path=baseline)
    assert changed.status == "mismatch"
    first = changed.first_mismatch
    assert first is not None and first.unit == "token" and 0 <= first.position < 24
    assert f"prompt {first.prompt_index} ({first.prompt_id!r}) differs at token {first.position}" in changed.message


@pytest.mark.timeout(240)
def test_engine_dying_mid_run_ends_the_run(tmp_path: Path) -> None:
    config = reference_config(
        speculative=True, enable_metrics=True, env={"SPECTUNE_REFERENCE_FAULT": "die_after_tokens:400"}
    )
    settings = BenchSettings(num_prompts=6, output_len=32, concurrency=[2], repetitions=4, warmup_requests=1,
                             request_timeout_s=60, warmup={"tolerance": None}, target_ci_rel=None)
    seen: list[RepetitionMetrics] = []
    with running_engine(config, tmp_path) as engine:
        with pytest.raises(BenchmarkError, match="stopped serving during concurrency 2") as info:
            run_benchmark(base_url=engine.url, settings=settings, on_repetition=seen.append)
    assert len(seen) < 4
    assert isinstance(info.value, BenchmarkAborted)  # with what was measured attached
    assert info.value.partial.status == "failed" and info.value.partial.num_repetitions == len(seen)


@pytest.mark.timeout(240)
def test_bench_command_keeps_what_was_measured_when_the_engine_dies(tmp_path: Path) -> None:
    """``spectune bench --json-out`` against an engine that dies in its third repetition: exit 1, and
    the file holds the two finished repetitions with the failure stated."""
    import typer
    from typer.testing import CliRunner

    from orchestrator.cli.bench import bench as bench_command, probe as probe_command
    from orchestrator.exit_codes import EXIT_FAILED

    # warm-up 32 tokens + 2 repetitions x 4 x 32 = 288 (and a few one-token health checks) < 350 <
    # the 416 that a third repetition would need: the engine dies inside repetition 2
    config = reference_config(
        speculative=True, enable_metrics=True, env={"SPECTUNE_REFERENCE_FAULT": "die_after_tokens:350"}
    )
    out = tmp_path / "b.json"
    app = typer.Typer()
    app.command()(bench_command)
    app.command()(probe_command)
    with running_engine(config, tmp_path / "engine") as engine:
        result = CliRunner().invoke(app, [
            "bench", engine.url, "-c", "2", "-r", "4", "--num-prompts", "4", "--output-len", "32",
            "--warmup", "1", "--fixed-warmup", "--fixed-repetitions", "--timeout", "60", "--json-out", str(out),
        ])
    assert result.exit_code == EXIT_FAILED, result.output
    assert "stopped serving during concurrency 2, repetition 2" in result.output
    assert f"is in {out} with status failed" in " ".join(result.output.split())
    measured = read_json(out)
    assert measured.status == "failed" and measured.failure is not None
    assert (measured.failure.phase, measured.failure.concurrency, measured.failure.repetition) == ("measure", 2, 2)
    assert [rep.repetition for rep in measured.level(2).repetitions] == [0, 1]
    assert all(rep.num_errors == 0 and rep.output_tokens == 4 * 32 for rep in measured.level(2).repetitions)
    assert measured.failure.repetition_metrics is not None and measured.failure.repetition_metrics.num_errors > 0
    assert measured.num_requests == 8 and measured.warmup.num_requests == 1
