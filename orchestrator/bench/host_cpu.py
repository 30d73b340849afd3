"""The share of this host's CPU time the hypervisor gave to other guests (steal), over one repetition.

Read from ``/proc/stat``: 0 on bare metal, None without ``/proc/stat``. Why it is recorded: see
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuTimes", "read_cpu_times", "steal_fraction"]

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The ``cpu`` line of ``/proc/stat``: all CPUs' time in clock ticks since boot.

    Attributes:
        total: user + nice + system + idle + iowait + irq + softirq + steal (guest time is already
            inside user and nice, so it is not added again).
        steal: Time runnable vCPUs waited while the hypervisor ran another guest.
    """

    total: int
    steal: int


def parse_cpu_line(text: str) -> CpuTimes | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` text, or None when it is missing or short."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(f) for f in fields[1:9] if f.isdigit()]
            if len(ticks) < 8:
                return None
            return CpuTimes(total=sum(ticks), steal=ticks[7])
    return None


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """This host's CPU times now, or None where there is no ``/proc/stat`` (not Linux)."""
    try:
        return parse_cpu_line(path.read_text())
    except OSError:
        return None


def steal_fraction(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Steal as a fraction of all CPU time between two readings (0-1), or None without both."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    return min(1.0, max(0.0, (after.steal - before.steal) / total))
