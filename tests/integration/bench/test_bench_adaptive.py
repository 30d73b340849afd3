"""Warm-up per level, adaptive repetitions and drift, against the HTTP-level test double.

Every assertion is a count (requests, repetitions, callbacks) or a figure the fake server makes
deterministic (its accept length), never a wall time. The cold-engine double pauses 50 ms per
chunk where a warm request pauses 5 ms: ten times slower, so the warm-up's 50% tolerance is far
from either side whatever the machine's load. The adaptive tests watch ``accept_length``, which
the fake sets exactly (``accept_lengths_per_flush``), so their intervals are known in advance.
"""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from orchestrator.bench import BenchResult, BenchSettings, run_benchmark
from orchestrator.bench.metrics import RepetitionMetrics
from orchestrator.bench.report import summary_table
from orchestrator.cli.bench import bench as bench_command, probe as probe_command

from helpers.bench import FakeServer, expected_accept_length

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

COLD = 6
"""Cold requests per new level of the cold-engine double."""


def _settings(**overrides) -> BenchSettings:
    values = dict(num_prompts=12, output_len=16, concurrency=[1, 4], repetitions=2, warmup_requests=1,
                  request_timeout_s=10, target_ci_rel=None,
                  warmup={"tolerance": 0.5, "max_windows": 8})
    values.update(overrides)
    return BenchSettings(**values)


def _adaptive(**overrides) -> BenchSettings:
    """One level, a fixed one-request warm-up (so the first flush is seen to reset the counters and
    each repetition gets the next of ``accept_lengths_per_flush``), repetitions judged on accept_length."""
    values = dict(concurrency=[2], warmup_requests=1, warmup={"tolerance": None}, target_metric="accept_length")
    return _settings(**{**values, **overrides})


def _cold_engine(server: FakeServer) -> FakeServer:
    server.behaviour.cold_requests_per_level = COLD
    server.behaviour.cold_delay_s = 0.05
    server.behaviour.token_delay_s = 0.005
    return server


def _phases(result: BenchResult) -> list[tuple[str, int, range]]:
    """(phase, concurrency, request numbers) in the order sent: the fake numbers requests 1, 2, ..."""
    spans, start = [], 1
    for level in result.levels:
        assert level.warmup is not None
        for phase, count in (("warmup", level.warmup.num_requests),
                             ("measure", level.repetitions_used * result.settings.num_prompts)):
            spans.append((phase, level.concurrency, range(start, start + count)))
            start += count
    return spans


def _cold_by_phase(result: BenchResult, server: FakeServer) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for phase, concurrency, numbers in _phases(result):
        counts[(phase, concurrency)] = sum(n in numbers for n in server.counters.cold_requests)
    return counts


# --- warm-up that warms ------------------------------------------------------------------------


def test_each_level_is_warmed_at_its_own_concurrency_past_its_cold_requests(fake_server: FakeServer) -> None:
    server = _cold_engine(fake_server)
    result = run_benchmark(base_url=server.url, settings=_settings())
    total = sum(level.warmup.num_requests + level.repetitions_used * 12 for level in result.levels)
    assert server.counters.requests == total  # every request is in one phase or another
    cold = _cold_by_phase(result, server)
    assert cold[("measure", 1)] == 0 and cold[("measure", 4)] == 0  # nothing measured was cold
    assert cold[("warmup", 1)] == COLD  # level 1's cold requests, all in its own warm-up
    assert cold[("warmup", 4)] >= COLD  # level 4 went cold again when 4 were first in flight
    for level in result.levels:
        warmup = level.warmup
        assert warmup.converged is True and warmup.num_errors == 0
        assert warmup.window_requests == max(4, 2 * level.concurrency)
        assert warmup.num_requests == 1 + len(warmup.window_tok_per_s) * warmup.window_requests
        assert warmup.duration_s is not None and warmup.duration_s > 0
    # at c=1: window 1 all cold, window 2 one cold request (still 3x slower), then two warm ones agree
    assert len(result.level(1).warmup.window_tok_per_s) >= 4
    assert result.warmup.num_requests == sum(level.warmup.num_requests for level in result.levels)
    # one flush per stability window and per repetition
    windows = sum(len(level.warmup.window_tok_per_s) for level in result.levels)
    assert server.counters.flushes == windows + 2 * 2


def test_a_fixed_warmup_leaves_the_first_repetition_of_each_level_cold(fake_server: FakeServer) -> None:
    """The failure the windows fix: a fixed warm-up that is too short for a level."""
    server = _cold_engine(fake_server)
    result = run_benchmark(base_url=server.url, settings=_settings(warmup_requests=2, warmup={"tolerance": None}))
    cold = _cold_by_phase(result, server)
    assert cold[("warmup", 1)] == 2 and cold[("measure", 1)] == COLD - 2
    assert cold[("measure", 4)] >= COLD  # two warm-up requests never put four in flight
    for level in result.levels:
        assert level.warmup.converged is None and level.warmup.window_tok_per_s == []
        assert level.warmup.num_requests == 2


def test_a_warmup_that_never_settles_stops_at_its_cap_and_says_so(fake_server: FakeServer) -> None:
    server = _cold_engine(fake_server)
    server.behaviour.cold_requests_per_level = 10_000  # never warms
    server.behaviour.cold_delay_s = 0.002
    # a tolerance no two windows can meet: relative_difference is 0 only for identical throughputs
    settings = _settings(concurrency=[2], warmup={"tolerance": 1e-12, "max_windows": 3})
    result = run_benchmark(base_url=server.url, settings=settings)
    warmup = result.level(2).warmup
    assert warmup.converged is False and len(warmup.window_tok_per_s) == 3
    assert warmup.num_requests == 1 + 3 * 4
    assert result.level(2).repetitions_used == 2  # measured anyway
    console = Console(record=True, width=240)
    console.print(summary_table(result))
    text = console.export_text()
    assert "13 req" in text and "NOT stable" in text and "warmup_not_converged" in text


def test_no_warmup_sends_nothing_before_measuring(fake_server: FakeServer) -> None:
    result = run_benchmark(base_url=fake_server.url, settings=_settings(warmup_requests=0, concurrency=[2]))
    warmup = result.level(2).warmup
    assert warmup.num_requests == 0 and warmup.converged is None
    assert fake_server.counters.requests == 2 * 12


# --- adaptive repetitions ----------------------------------------------------------------------


def test_repetitions_stop_once_the_interval_meets_the_target(fake_server: FakeServer) -> None:
    """accept_length is the same every repetition (the fake's): a zero-width interval, so the level stops
    at min_repetitions, long before the cap."""
    seen: list[RepetitionMetrics] = []
    settings = _adaptive(repetitions=10, min_repetitions=3, target_ci_rel=0.02)
    result = run_benchmark(base_url=fake_server.url, settings=settings, on_repetition=seen.append)
    level = result.level(2)
    assert [m.repetition for m in seen] == [0, 1, 2]  # once per measured repetition
    assert level.repetitions_used == 3 and fake_server.counters.requests == 1 + 3 * 12
    assert level.target_met is True and level.ci_rel == 0.0 and level.target_ci_rel == 0.02
    assert level.target_metric == "accept_length" and result.target_met is True


def test_repetitions_stop_at_the_cap_when_the_interval_stays_wide(fake_server: FakeServer) -> None:
    fake_server.behaviour.accept_lengths_per_flush = [2, 4]  # repetitions alternate: 1.875, 3.75 tokens/cycle
    seen: list[RepetitionMetrics] = []
    settings = _adaptive(repetitions=5, min_repetitions=2, target_ci_rel=0.02)
    result = run_benchmark(base_url=fake_server.url, settings=settings, on_repetition=seen.append)
    level = result.level(2)
    values = [m.accept_length for m in seen]
    assert values == pytest.approx([expected_accept_length(tokens=16, accept_length=a) for a in (2, 4, 2, 4, 2)])
    assert len(seen) == level.repetitions_used == 5  # the cap
    assert level.target_met is False and level.ci_rel is not None and level.ci_rel > 0.02
    assert result.target_met is False
    console = Console(record=True, width=240)
    console.print(summary_table(result))
    text = console.export_text()
    assert "target_not_met" in text and "NOT met" in text and "3-5 rep" in text  # min_repetitions 2 acts as 3


def test_without_a_target_exactly_the_repetitions_run(fake_server: FakeServer) -> None:
    result = run_benchmark(base_url=fake_server.url, settings=_adaptive(repetitions=4, target_ci_rel=None))
    level = result.level(2)
    assert level.repetitions_used == 4 and level.target_met is None and level.ci_rel == 0.0
    assert result.target_met is None


def test_a_callback_that_raises_stops_the_run(fake_server: FakeServer) -> None:
    """ASHA stops a trial by raising from the report: the run must end there."""
    seen: list[int] = []

    def stop_after_two(metrics: RepetitionMetrics) -> None:
        seen.append(metrics.repetition)
        if len(seen) == 2:
            raise RuntimeError("trial stopped")

    settings = _settings(concurrency=[1, 2], warmup_requests=0, repetitions=6, target_ci_rel=0.02)
    with pytest.raises(RuntimeError, match="trial stopped"):
        run_benchmark(base_url=fake_server.url, settings=settings, on_repetition=stop_after_two)
    assert seen == [0, 1] and fake_server.counters.requests == 2 * 12


# --- drift -------------------------------------------------------------------------------------


def test_a_monotone_trend_across_repetitions_is_flagged(fake_server: FakeServer) -> None:
    fake_server.behaviour.accept_lengths_per_flush = [2, 3, 4, 5, 8]  # each repetition accepts more
    result = run_benchmark(base_url=fake_server.url, settings=_adaptive(repetitions=5, target_ci_rel=None))
    values = [rep.accept_length for rep in result.level(2).repetitions]
    assert values == pytest.approx([15 / 8, 15 / 5, 15 / 4, 15 / 3, 15 / 2])  # 15 decode tokens / cycles
    drift = result.level(2).drift
    assert drift is not None and drift.direction == "up" and drift.metric == "accept_length"
    assert drift.num_values == 5 and drift.tau == pytest.approx(1.0)
    assert drift.p_value == pytest.approx(2 / 120)  # the two monotone orders of 5! permutations
    assert result.drift and result.level(2).drifts
    console = Console(record=True, width=240)
    console.print(summary_table(result))
    assert "up (p=0.017)" in console.export_text()


def test_a_steady_level_is_not_flagged(fake_server: FakeServer) -> None:
    result = run_benchmark(base_url=fake_server.url, settings=_adaptive(repetitions=5, target_ci_rel=None))
    drift = result.level(2).drift
    assert drift is not None and drift.direction is None and drift.p_value == 1.0
    assert not result.drift


# --- the CLI -----------------------------------------------------------------------------------


def test_bench_command_prints_the_new_facts(fake_server: FakeServer) -> None:
    import typer

    fake_server.behaviour.accept_lengths_per_flush = [2, 4]
    app = typer.Typer()
    app.command()(bench_command)
    app.command()(probe_command)  # two commands: typer then expects the command's name
    result = CliRunner().invoke(app, [
        "bench", fake_server.url, "-c", "2", "-r", "3", "--min-repetitions", "2", "--target-metric", "accept_length",
        "--num-prompts", "4", "--output-len", "8", "--warmup", "1", "--warmup-tolerance", "0.9",
        "--warmup-max-windows", "3",
    ])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "warm-up" in out and "repetitions" in out and "95% interval, accept_length" in out and "drift" in out
    assert "target not met at c=2: accept_length 95% interval" in out
    bad = CliRunner().invoke(app, ["bench", fake_server.url, "-r", "2", "--min-repetitions", "3"])
    assert bad.exit_code == 2 and "min_repetitions (3) is above repetitions (2)" in " ".join(bad.output.split())
    both = CliRunner().invoke(app, ["bench", fake_server.url, "--fixed-repetitions", "--target-ci", "0.01"])
    assert both.exit_code == 2 and "drop --target-ci" in both.output


# --- the steps, one by one -----------------------------------------------------------------------


def test_the_steps_can_be_taken_one_by_one(fake_server: FakeServer) -> None:
    """A caller composing its own procedure (benchmarks/bench_noise.py's old one): one warm-up at the
    highest level, then levels without their own; the run's total counts that warm-up too."""
    import asyncio

    from orchestrator.bench import open_benchmark, run_level, run_repetition, warm_up_level

    fake_server.behaviour.token_delay_s = 0.005  # 30 ms a request: the three sent at once overlap
    settings = _settings(warmup_requests=3, warmup={"tolerance": None})
    measured_only = _settings(warmup_requests=0)
    seen: list[RepetitionMetrics] = []

    async def go():
        async with open_benchmark(base_url=fake_server.url, settings=settings) as run:
            warmup = await warm_up_level(run, concurrency=4)
            single = await run_repetition(run, concurrency=2, repetition=0)
            assert run.result().warmup.num_requests == 3 and run.result().levels == []
        async with open_benchmark(base_url=fake_server.url, settings=measured_only) as run:
            levels = [await run_level(run, concurrency=c, on_repetition=seen.append) for c in (1, 4)]
            return warmup, single, levels, run.result()

    warmup, single, levels, result = asyncio.run(go())
    assert warmup.num_requests == 3 and warmup.converged is None and fake_server.counters.max_in_flight >= 3
    assert single.num_ok == 12 and single.concurrency == 2  # measured, not part of any level
    assert [level.repetitions_used for level in levels] == [2, 2] and len(seen) == 4
    assert [level.warmup.num_requests for level in result.levels] == [0, 0]
    assert result.num_requests == 4 * 12 and fake_server.counters.requests == 3 + 12 + 4 * 12
