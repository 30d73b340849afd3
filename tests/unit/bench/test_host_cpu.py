"""The host's CPU steal over a repetition, read from /proc/stat."""

from __future__ import annotations

from pathlib import Path

from orchestrator.bench.host_cpu import CpuTimes, parse_cpu_line, read_cpu_times, steal_fraction

STAT = """cpu  100 5 50 800 10 1 2 32 7 0
cpu0 50 2 25 400 5 0 1 16 3 0
intr 12345
"""


def test_the_aggregate_line_sums_the_eight_time_columns_and_reads_steal() -> None:
    assert parse_cpu_line(STAT) == CpuTimes(total=100 + 5 + 50 + 800 + 10 + 1 + 2 + 32, steal=32)


def test_a_kernel_without_a_steal_column_or_no_cpu_line_gives_none() -> None:
    assert parse_cpu_line("cpu  1 2 3 4 5 6 7\n") is None
    assert parse_cpu_line("intr 1\n") is None


def test_steal_is_the_share_of_cpu_time_between_two_readings() -> None:
    before, after = CpuTimes(total=1000, steal=10), CpuTimes(total=1400, steal=130)
    assert steal_fraction(before, after) == 120 / 400
    assert steal_fraction(before, before) is None, "no time passed: no share"
    assert steal_fraction(None, after) is None and steal_fraction(before, None) is None


def test_a_host_without_proc_stat_reports_none(tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path / "missing") is None
    (tmp_path / "stat").write_text(STAT)
    assert read_cpu_times(tmp_path / "stat") == CpuTimes(total=1000, steal=32)
