"""The harness against HTTP-level test doubles: every failure path, the lying server, plain OpenAI.

These need no engine, so they run in milliseconds; the same properties against the real
reference engine are in test_bench_reference.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from rich.console import Console
from typer.testing import CliRunner

from orchestrator.bench import BenchmarkAborted, BenchSettings, ProbeBaselineError, run_benchmark, run_probe
from orchestrator.bench.loadgen import Sampling, WorkItem, run_load
from orchestrator.bench.metrics import RepetitionMetrics
from orchestrator.bench.report import read_json, summary_table
from orchestrator.cli.bench import bench as bench_command, probe as probe_command
from orchestrator.errors import BenchmarkError
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED

from helpers.bench import FakeServer, expected_accept_length, logged

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _settings(**overrides) -> BenchSettings:
    """Small runs with a fixed warm-up and fixed repetitions, so request counts are known in advance
    (the stability windows and the interval target have tests of their own, in test_bench_adaptive.py)."""
    values = dict(num_prompts=12, output_len=16, concurrency=[1, 4], repetitions=2, warmup_requests=2,
                  request_timeout_s=10, warmup={"tolerance": None}, target_ci_rel=None)
    values.update(overrides)
    return BenchSettings(**values)


def _load(server: FakeServer, *, items: int = 8, concurrency: int = 4, timeout_s: float = 10, **kw):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await run_load(
                session=session, base_url=server.url, api=kw.pop("api", "generate"),
                items=[WorkItem(prompt_id=f"p{i}", text=f"prompt number {i}") for i in range(items)],
                concurrency=concurrency, sampling=Sampling(max_new_tokens=kw.pop("tokens", 16)),
                timeout_s=timeout_s, **kw,
            )

    return asyncio.run(go())


def test_token_counts_are_the_servers_and_chunks_carry_several(fake_server: FakeServer) -> None:
    seen: list[RepetitionMetrics] = []
    result = run_benchmark(base_url=fake_server.url, settings=_settings(), on_repetition=seen.append)
    assert [(m.concurrency, m.repetition) for m in seen] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    for rep in seen:
        assert rep.num_errors == 0 and rep.num_ok == 12
        assert rep.output_tokens == 12 * 16  # sum of completion_tokens, not chunks
        # 16 tokens = 1 (prefill) + 3+3+3+3+3: 6 chunks
        assert rep.tokens_per_chunk == pytest.approx(16 / 6)
        expected = expected_accept_length(tokens=16, accept_length=3)
        assert rep.accept_length_requests == pytest.approx(expected)
        assert rep.accept_length_server == pytest.approx(expected)
        assert rep.spec_accept_length_meta == pytest.approx(16 / 5)
        assert rep.accepted_drafts_per_cycle == pytest.approx(expected - 1)
        assert rep.accept_length_mismatch is False
        # decode time / verify cycles: each request spends (16 - 1) * TPOT decoding, in 5 cycles
        assert rep.cycle_ms is not None and rep.cycle_ms > 0
        assert rep.cycle_ms == pytest.approx(rep.tpot_ms.mean * 15 / 5)
    assert fake_server.counters.flushes == 4  # one per repetition
    assert result.server_accept_length_scope == "repetition"
    assert fake_server.counters.max_in_flight <= 4
    assert not result.accept_length_mismatch
    assert result.metric("output_tokens", concurrency=4) == 12 * 16
    assert result.server["speculative_algorithm"] == "EAGLE3"


def test_a_server_that_lies_about_accept_length_is_flagged(fake_server: FakeServer) -> None:
    fake_server.behaviour.reported_accept_length = 4.5  # the truth is 3.0
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2]))
    assert result.accept_length_mismatch
    level = result.level(2)
    assert level.accept_length_mismatch
    assert all(rep.accept_length_mismatch for rep in level.repetitions)
    assert all(rep.accept_length_server == 4.5 for rep in level.repetitions)
    # the reported accept_length is the one computed from the measured requests
    assert level.value("accept_length") == pytest.approx(expected_accept_length(tokens=16, accept_length=3))


def test_lifetime_counters_are_a_cross_check_not_the_repetitions_figure(fake_server: FakeServer) -> None:
    fake_server.behaviour.reset_on_flush = False  # /flush_cache keeps the spec counters (older SGLang)
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2]))
    assert result.server_accept_length_scope == "lifetime"
    expected = expected_accept_length(tokens=16, accept_length=3)
    for rep in result.level(2).repetitions:
        assert rep.accept_length_server is None  # not attributable to this repetition
        assert rep.accept_length_server_lifetime == pytest.approx(expected)
        assert rep.accept_length == pytest.approx(expected)  # from the requests
        assert rep.accept_length_mismatch is False
    assert not result.accept_length_mismatch


def test_server_errors_are_counted_by_kind(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 5
    fake_server.behaviour.drop_every = 7
    fake_server.behaviour.error_event_every = 11
    result = _load(fake_server, items=40, concurrency=4)
    kinds = [r.error_kind for r in result.records]
    assert kinds.count("http_5xx") == 8  # requests 5, 10, ..., 40 (by arrival)
    assert kinds.count("dropped_stream") == 4  # 7, 14, 21, 28 (35 is already a 5xx)
    assert kinds.count("server_error") == 3  # 11, 22, 33
    assert len(result.records) == 40
    ok = [r for r in result.records if r.error is None]
    assert all(r.output_tokens == 16 for r in ok)


def test_timeouts_are_records_not_exceptions(fake_server: FakeServer) -> None:
    fake_server.behaviour.hang_every = 3
    result = _load(fake_server, items=6, concurrency=6, timeout_s=0.5)
    kinds = [r.error_kind for r in result.records]
    assert kinds.count("timeout") == 2
    assert kinds.count(None) == 4


def test_errors_are_reported_in_the_benchmark_result(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 4
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2], repetitions=1))
    rep = result.level(2).repetitions[0]
    assert rep.num_errors == rep.errors_by_kind["http_5xx"] > 0
    assert rep.num_ok + rep.num_errors == rep.num_requests == 12
    assert rep.output_tokens == rep.num_ok * 16
    assert result.num_errors == rep.num_errors
    assert "HTTP 500" in rep.error_samples[0]


def test_dead_server_ends_the_run_with_a_clear_message(unused_url: str) -> None:
    with pytest.raises(BenchmarkError, match=r"cannot benchmark: cannot connect to http://127\.0\.0\.1:\d+ \(ConnectionRefusedError; is the server running\?\)"):
        run_benchmark(base_url=unused_url, settings=_settings())


def test_server_dying_mid_run_ends_the_run(dying_server: FakeServer) -> None:
    dying_server.behaviour.die_after = 2 + 12 + 5  # warm-up, one repetition, then 5 more
    reported: list[RepetitionMetrics] = []
    with pytest.raises(BenchmarkError, match="stopped serving during concurrency 1, repetition 1"):
        run_benchmark(base_url=dying_server.url, settings=_settings(concurrency=[1]), on_repetition=reported.append)
    assert len(reported) == 1 and reported[0].num_errors == 0


def test_dead_server_stops_the_load_quickly(dying_server: FakeServer) -> None:
    dying_server.behaviour.die_after = 0
    result = _load(dying_server, items=200, concurrency=2)
    kinds = {r.error_kind for r in result.records}
    assert kinds <= {"connection", "not_sent", "dropped_stream"}
    assert sum(r.error_kind == "not_sent" for r in result.records) > 150


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_plain_openai_server_reports_speculative_metrics_as_absent(fake_server: FakeServer, api: str) -> None:
    fake_server.behaviour.native = False
    result = run_benchmark(base_url=fake_server.url, settings=_settings(api=api, concurrency=[2], repetitions=1))
    assert result.api == api and result.model == "fake-model"
    assert not result.flush_cache_supported
    rep = result.level(2).repetitions[0]
    assert rep.num_errors == 0
    assert rep.output_tokens == 12 * 16  # from usage.completion_tokens
    assert rep.tokens_per_chunk == pytest.approx(1.0)
    for name in ("accept_length", "accept_length_requests", "accept_length_server", "accepted_drafts_per_cycle",
                 "cycle_ms", "spec_verify_ct", "spec_accept_length_meta", "accept_length_mismatch"):
        assert getattr(rep, name) is None, name
    assert result.level(2).summary["accept_length"].count == 0


def test_auto_detects_openai_when_server_info_is_absent(fake_server: FakeServer) -> None:
    fake_server.behaviour.native = False
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[1], repetitions=1, warmup_requests=0))
    assert result.api == "completions"


def test_non_speculative_native_server(fake_server: FakeServer) -> None:
    fake_server.behaviour.speculative = False
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[1], repetitions=1))
    rep = result.level(1).repetitions[0]
    assert rep.tokens_per_chunk == pytest.approx(1.0)
    assert rep.accept_length is None and rep.accept_length_mismatch is None


def test_open_loop_respects_the_concurrency_cap(fake_server: FakeServer) -> None:
    fake_server.behaviour.token_delay_s = 0.002
    result = run_benchmark(
        base_url=fake_server.url, settings=_settings(concurrency=[3], repetitions=1, request_rate=500.0)
    )
    assert result.level(3).repetitions[0].num_ok == 12
    assert fake_server.counters.max_in_flight <= 3
    assert result.level(3).repetitions[0].queue_delay_ms.count == 12
    console = Console(record=True, width=200)
    console.print(summary_table(result))
    assert "queue delay ms p50" in console.export_text()


def test_probe_writes_then_matches_then_names_the_difference(fake_server: FakeServer, tmp_path: Path) -> None:
    baseline = tmp_path / "probe.json"
    first = run_probe(base_url=fake_server.url, baseline_path=baseline, num_prompts=4, max_new_tokens=12)
    assert first.status == "baseline_written" and baseline.exists()
    again = run_probe(base_url=fake_server.url, baseline_path=baseline)
    assert again.status == "match" and again.unit == "token" and again.passed
    fake_server.behaviour.vary_output = 1  # "started with a different seed"
    changed = run_probe(base_url=fake_server.url, baseline_path=baseline)
    assert changed.status == "mismatch" and not changed.passed
    assert changed.first_mismatch is not None
    assert changed.first_mismatch.prompt_index == 0 and changed.first_mismatch.position == 0
    assert "prompt 0" in changed.message and "token 0" in changed.message


def test_probe_request_failure_is_an_error_not_a_verdict(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.behaviour.fail_every = 2
    with pytest.raises(BenchmarkError, match="correctness cannot be judged"):
        run_probe(base_url=fake_server.url, baseline_path=tmp_path / "p.json", num_prompts=4, max_new_tokens=4)


def test_bench_command_writes_json_and_exits_0(fake_server: FakeServer, tmp_path: Path) -> None:
    import typer

    app = typer.Typer()
    app.command()(bench_command)
    app.command()(probe_command)
    out = tmp_path / "result.json"
    runner = CliRunner()
    result = runner.invoke(app, ["bench", fake_server.url, "-c", "1,2", "-r", "2", "--num-prompts", "4",
                                 "--output-len", "8", "--warmup", "1", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = read_json(out)
    assert [level.concurrency for level in loaded.levels] == [1, 2]
    assert "output tok/s" in result.output and "accept_length (server)" in result.output

    bad = runner.invoke(app, ["bench", fake_server.url, "--dataset", "random"])
    assert bad.exit_code == 2 and "allow_random_prompts" in bad.output

    baseline = tmp_path / "b.json"
    assert runner.invoke(app, ["probe", fake_server.url, "--baseline", str(baseline), "--num-prompts", "2"]).exit_code == 0
    fake_server.behaviour.vary_output = 3
    mismatch = runner.invoke(app, ["probe", fake_server.url, "--baseline", str(baseline), "--json"])
    assert mismatch.exit_code == 1
    assert json.loads(mismatch.stdout)["mismatches"][0]["position"] == 0


def test_bench_command_dead_server_exits_1(unused_url: str) -> None:
    import typer

    app = typer.Typer()
    app.command()(bench_command)
    app.command()(probe_command)
    result = CliRunner().invoke(app, ["bench", unused_url, "--num-prompts", "2"])
    assert result.exit_code == 1
    assert "cannot connect" in result.output


# --- the lifetime cross-check (a server that keeps its counters across /flush_cache) ---------


def test_lying_server_with_lifetime_counters_is_flagged(fake_server: FakeServer) -> None:
    fake_server.behaviour.reset_on_flush = False
    fake_server.behaviour.reported_accept_length = 4.5  # the truth is 3.0, and 4.5 never moves
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2]))
    assert result.server_accept_length_scope == "lifetime"
    reps = result.level(2).repetitions
    assert all(rep.accept_length_server is None and rep.accept_length_server_lifetime == 4.5 for rep in reps)
    assert all(rep.accept_length_mismatch is True and rep.accept_length_check == "mismatch" for rep in reps)
    assert result.accept_length_mismatch


def test_lifetime_counters_that_cannot_be_checked_are_reported_so(fake_server: FakeServer) -> None:
    fake_server.behaviour.reset_on_flush = False
    fake_server.behaviour.reported_accept_length = 4.5
    fake_server.behaviour.decode_log_interval = None  # no way to know whether the server folded anything
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2]))
    reps = result.level(2).repetitions
    assert all(rep.accept_length_check == "not_checkable" and rep.accept_length_mismatch is None for rep in reps)
    assert result.accept_length_not_checkable and result.level(2).accept_length_not_checkable
    assert not result.accept_length_mismatch  # not claimed either way


def test_without_warmup_the_first_repetition_is_not_taken_for_a_per_repetition_figure(fake_server: FakeServer) -> None:
    fake_server.behaviour.reset_on_flush = False  # SGLang, fresh: nothing counted before repetition 0
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2], warmup_requests=0))
    assert result.server_accept_length_scope == "lifetime"
    expected = expected_accept_length(tokens=16, accept_length=3)
    for rep in result.level(2).repetitions:
        assert rep.accept_length_server is None
        assert rep.accept_length_server_lifetime == pytest.approx(expected)
        assert rep.accept_length_check == "agrees"


def test_without_warmup_a_flush_seen_to_reset_makes_the_figure_per_repetition(fake_server: FakeServer) -> None:
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2], warmup_requests=0))
    assert result.server_accept_length_scope == "repetition"
    assert all(rep.accept_length_server is not None for rep in result.level(2).repetitions)
    assert fake_server.counters.flushes == 2 + 1  # one per repetition, and one to see what a flush does


def test_lying_server_without_warmup_is_flagged_from_the_first_repetition(fake_server: FakeServer) -> None:
    fake_server.behaviour.reset_on_flush = False
    fake_server.behaviour.reported_accept_length = 4.5
    result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[2], warmup_requests=0))
    assert [rep.accept_length_check for rep in result.level(2).repetitions] == ["mismatch", "mismatch"]


# --- a hung engine ---------------------------------------------------------------------------


def test_hung_engine_stops_the_load_with_every_request_recorded(fake_server: FakeServer) -> None:
    fake_server.behaviour.hang_every = 1  # accepts every request, answers none
    result = _load(fake_server, items=20, concurrency=3, timeout_s=0.3, hang_limit=2)
    assert result.hung is not None and "looks hung" in result.hung and "none completed in between" in result.hung
    assert len(result.records) == 20 and [r.index for r in result.records] == list(range(20))
    kinds = [r.error_kind for r in result.records]
    assert kinds.count("timeout") >= 2 and set(kinds) <= {"timeout", "abandoned", "not_sent"}
    # three sent at once; a fourth only if the first timeout came a moment before the second
    assert kinds.count("not_sent") >= 16
    # one round of timeouts, not one per request: the three sent at once time out (or the third is
    # abandoned with the second's), and a fourth, sent after the first timeout, is abandoned when the
    # second trips the breaker instead of being waited for until its own timeout
    assert kinds.count("timeout") in (2, 3)
    assert kinds[3] in ("abandoned", "not_sent")
    assert fake_server.counters.requests <= 4


@pytest.mark.parametrize("warmup", [0, 2])
def test_hung_engine_ends_the_benchmark_with_a_clear_error(fake_server: FakeServer, warmup: int) -> None:
    fake_server.behaviour.hang_every = 1
    where = "warm-up stopped" if warmup else "stopped during concurrency 1, repetition 0"
    with pytest.raises(BenchmarkError, match=rf"{where}: http://127\.0\.0\.1:\d+ looks hung: 2 requests in a row"):
        run_benchmark(base_url=fake_server.url,
                      settings=_settings(concurrency=[1], warmup_requests=warmup, request_timeout_s=0.3))


def test_open_loop_timeouts_also_trip_the_hang_breaker(fake_server: FakeServer) -> None:
    fake_server.behaviour.hang_every = 1
    result = _load(fake_server, items=10, concurrency=2, timeout_s=0.3, request_rate=1000.0)
    assert result.hung is not None
    kinds = [r.error_kind for r in result.records]
    # two in flight time out; a third, let through if the first timed out a moment before the
    # second, is abandoned (or times out in the same instant); the rest are never sent
    assert set(kinds) <= {"timeout", "abandoned", "not_sent"} and kinds.count("not_sent") >= 7


# --- open-loop latency includes queueing -----------------------------------------------------


def test_open_loop_latency_counts_the_wait_behind_the_concurrency_cap(fake_server: FakeServer) -> None:
    import random

    fake_server.behaviour.token_delay_s = 0.01  # 8 tokens = 4 chunks: each request takes 40 ms or more
    result = _load(fake_server, items=5, concurrency=1, tokens=8, request_rate=1000.0)
    records = result.records
    assert all(r.error is None for r in records)
    # the arrivals are the seeded schedule (seed 0, exponential gaps at 1000/s), whatever the timing
    rng, due, schedule = random.Random(0), 0.0, []
    for _ in records:
        due += rng.expovariate(1000.0)
        schedule.append(due)
    assert [r.scheduled_s for r in records] == pytest.approx(schedule)
    assert schedule[-1] - schedule[0] < 0.040  # all five are due before the first can have finished
    for prev, r in zip(records, records[1:]):
        prev_end_s = min(prev.scheduled_s, prev.sent_s) + prev.e2e_ms / 1000  # latency runs from the due time
        assert r.sent_s >= prev_end_s - 1e-9  # one in flight: sent only once the one before finished
        assert r.queue_delay_ms == pytest.approx(max(0.0, r.sent_s - r.scheduled_s) * 1000)
        # the wait is inside the latencies: e2e and TTFT both run from the due time
        assert r.queue_delay_ms >= (prev_end_s - r.scheduled_s) * 1000 - 1e-6 > 0
        assert r.e2e_ms > r.queue_delay_ms and r.ttft_ms > r.queue_delay_ms
    assert [r.queue_delay_ms for r in records[1:]] == sorted(r.queue_delay_ms for r in records[1:])


# --- probe: markup-safe output, baseline ownership -------------------------------------------


def _cli():
    import typer

    app = typer.Typer()
    app.command()(bench_command)
    app.command()(probe_command)
    return app


def test_probe_mismatch_quoting_markup_like_text_is_printed(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.behaviour.native = False  # OpenAI completions: text is compared, and quoted
    baseline = tmp_path / "b.json"
    runner = CliRunner()
    fake_server.behaviour.output_text = "A [/INST] [bold] end"
    assert runner.invoke(_cli(), ["probe", fake_server.url, "--baseline", str(baseline), "--num-prompts", "2"]).exit_code == 0
    fake_server.behaviour.output_text = "B [/INST] [bold] end"
    mismatch = runner.invoke(_cli(), ["probe", fake_server.url, "--baseline", str(baseline)])
    assert mismatch.exit_code == 1, mismatch.output
    assert "mismatch" in mismatch.output and "'B [/INST] [bold] end'" in mismatch.output
    assert "'A [/INST] [bold] end'" in mismatch.output
    fake_server.behaviour.fail_every = 1
    fake_server.behaviour.fail_text = "bad template [/INST] [bold]"
    failed = runner.invoke(_cli(), ["probe", fake_server.url, "--baseline", str(baseline)])
    assert failed.exit_code == 1 and "HTTP 500: bad template [/INST] [bold]" in failed.output


def test_probe_never_overwrites_a_baseline_written_while_it_ran(fake_server: FakeServer, tmp_path: Path) -> None:
    baseline = tmp_path / "b.json"

    def someone_else_writes_it() -> None:
        if not baseline.exists():
            baseline.write_text('{"written": "by someone else"}')

    fake_server.behaviour.on_request = someone_else_writes_it
    with pytest.raises(BenchmarkError, match="created by someone else while this probe ran; not overwritten"):
        run_probe(base_url=fake_server.url, baseline_path=baseline, num_prompts=2, max_new_tokens=4)
    assert baseline.read_text() == '{"written": "by someone else"}'
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


def test_probe_can_be_told_not_to_create_the_baseline(fake_server: FakeServer, tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="does not exist; write it first"):
        run_probe(base_url=fake_server.url, baseline_path=tmp_path / "b.json", create_baseline=False)
    assert fake_server.counters.requests == 0 and not (tmp_path / "b.json").exists()


# --- a run that fails part-way keeps what it measured ----------------------------------------


def test_server_dying_mid_run_leaves_the_finished_repetitions_in_the_error(dying_server: FakeServer) -> None:
    dying_server.behaviour.die_after = 2 + 12 + 12 + 5  # warm-up, repetitions 0 and 1 of c=1, then 5 more
    with pytest.raises(BenchmarkAborted, match="stopped serving during concurrency 1, repetition 2") as info:
        run_benchmark(base_url=dying_server.url, settings=_settings(concurrency=[1, 4], repetitions=3))
    partial = info.value.partial
    assert partial.status == "failed" and partial.failure is not None
    assert (partial.failure.phase, partial.failure.concurrency, partial.failure.repetition) == ("measure", 1, 2)
    assert partial.failure.reason == str(info.value)
    assert [level.concurrency for level in partial.levels] == [1]  # c=4 never started
    assert [rep.repetition for rep in partial.level(1).repetitions] == [0, 1]
    assert all(rep.num_errors == 0 for rep in partial.level(1).repetitions)
    assert partial.num_requests == 24 and partial.num_errors == 0  # the failed repetition is not a level's
    failed = partial.failure.repetition_metrics
    assert failed is not None and failed.repetition == 2 and failed.num_ok == 5 and failed.num_errors == 7
    assert partial.warmup.num_requests == 2
    assert partial.level(1).value("output_tokens") == 12 * 16


def test_every_warmup_request_failing_is_a_failure_before_measuring(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 1
    with pytest.raises(BenchmarkAborted, match="every warm-up request .* failed") as info:
        run_benchmark(base_url=fake_server.url, settings=_settings())
    partial = info.value.partial
    assert partial.failure is not None and partial.failure.phase == "warmup"
    assert partial.failure.concurrency == 1 and partial.failure.repetition is None  # the first level's warm-up
    assert partial.levels == [] and partial.warmup.num_errors == 2
    with pytest.raises(KeyError, match="no concurrency level was measured"):
        partial.level()


def test_bench_command_writes_what_was_measured_when_the_server_dies(dying_server: FakeServer, tmp_path: Path) -> None:
    dying_server.behaviour.die_after = 1 + 4 + 4 + 1  # warm-up, two repetitions, one request of the third
    out = tmp_path / "b.json"
    result = CliRunner().invoke(_cli(), ["bench", dying_server.url, "-c", "2", "-r", "4", "--num-prompts", "4",
                                         "--output-len", "8", "--warmup", "1", "--fixed-warmup",
                                         "--fixed-repetitions", "--json-out", str(out)])
    assert result.exit_code == EXIT_FAILED, result.output
    said = " ".join(result.output.split())
    assert "stopped serving during concurrency 2, repetition 2" in said
    assert f"what was measured, 2 finished repetitions, is in {out} with status failed" in said
    data = json.loads(out.read_text())
    assert data["schema_version"] == "spectune.bench/3" and data["status"] == "failed"
    assert data["failure"]["concurrency"] == 2 and data["failure"]["repetition"] == 2
    assert "stopped serving" in data["failure"]["reason"]
    assert [rep["repetition"] for rep in data["levels"][0]["repetitions"]] == [0, 1]
    assert read_json(out).failure is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]  # written whole, no temporary file left


def test_bench_command_with_json_prints_the_partial_result(dying_server: FakeServer) -> None:
    dying_server.behaviour.die_after = 1 + 4 + 1
    result = CliRunner().invoke(_cli(), ["bench", dying_server.url, "-c", "2", "-r", "3", "--num-prompts", "4",
                                         "--output-len", "8", "--warmup", "1", "--fixed-warmup", "--json"])
    assert result.exit_code == EXIT_FAILED
    printed = json.loads(result.stdout)
    assert printed["status"] == "failed" and len(printed["levels"][0]["repetitions"]) == 1
    assert "1 finished repetition; --json-out keeps them" in " ".join(result.stderr.split())


# --- a failed /flush_cache is reported once --------------------------------------------------


def test_failed_flush_is_logged_once_and_not_retried(fake_server: FakeServer) -> None:
    fake_server.behaviour.flush_drops = True
    with logged("orchestrator") as records:
        result = run_benchmark(base_url=fake_server.url, settings=_settings(concurrency=[1], repetitions=3))
    flush_warnings = [r for r in records if "flush_cache" in r.getMessage()]
    assert len(flush_warnings) == 1, [r.getMessage() for r in flush_warnings]
    assert "not calling it again" in flush_warnings[0].getMessage()
    assert f"POST {fake_server.url}/flush_cache failed" in flush_warnings[0].getMessage()
    assert not result.flush_cache_supported and fake_server.counters.flushes == 0


# --- probe: a baseline that cannot be used is bad input -----------------------------------------


@pytest.mark.parametrize(
    "content",
    ['{"schema_version": "spectune.probe/1", "outputs": [', '{"schema_version": "spectune.probe/9"}', "[]"],
    ids=["truncated", "other-schema", "not-a-baseline"],
)
def test_probe_with_a_corrupt_baseline_exits_2_not_1(fake_server: FakeServer, tmp_path: Path, content: str) -> None:
    baseline = tmp_path / "b.json"
    baseline.write_text(content)
    result = CliRunner().invoke(_cli(), ["probe", fake_server.url, "--baseline", str(baseline)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"probe baseline {baseline}" in " ".join(result.output.split())
    assert fake_server.counters.requests == 0  # nothing was compared
    with pytest.raises(ProbeBaselineError):
        run_probe(base_url=fake_server.url, baseline_path=baseline)
