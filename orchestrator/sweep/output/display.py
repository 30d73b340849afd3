"""The sweep's console: one readable line per event on the job log, and never a silent one.

* :class:`Display`: trial n/N, each repetition, the current best, time left, the cost in engine starts.
* :class:`QuietWatch`: a driver thread that says what the sweep is waiting for when the log is quiet.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import (
    cost_line, format_duration, measured_start_times, planned_starts, start_time, visit_estimate_s,
)
from orchestrator.sweep.output.night_plan import night_plan
from orchestrator.sweep.records.results import OBJECTIVE_KEY, TrialRecord
from orchestrator.space import TrialPlan
from serving.environ import ENV

__all__ = ["Display", "QuietWatch", "job_console"]


def job_console() -> Console:
    """stdout; a job log is no terminal, and rich would wrap it at 80 columns: use 140 there."""
    console = Console()
    return console if console.is_terminal else Console(width=140)


class Display:
    """One readable line per event on the job log: trial n/N, its config, the current best, time."""

    def __init__(self, *, console: Console, spec: SweepSpec, total: int) -> None:
        self.console = console
        self.spec = spec
        self.total = total
        self.started = time.monotonic()
        self.finished = 0
        self.best: tuple[float, str] | None = None
        self.last_line = time.monotonic()
        self.running: dict[int, tuple[str, float]] = {}
        """Trial number -> (label, when it started): what a quiet job log is waiting for."""
        self.activity: tuple[str, float] | None = None
        """What the driver itself is doing outside the search (a confirmation visit), and since when."""
        self.records: list[TrialRecord] = []
        """The trials that ended with a record: their start times and pace feed the time left."""
        self.confirmation: list[int] | None = None
        """[most visits, visits done] once the confirmation has started."""

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with Tune's callbacks: the console is made anew where they are restored.
        state = dict(self.__dict__)
        state["console"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.console = job_console()

    def time_left_s(self) -> float | None:
        """Seconds the sweep is expected to run on: the trials left at the pace so far plus the most
        confirmation visits left (``cost.visit_estimate_s``); None before anything has ended."""
        if self.confirmation is not None:
            most, done = self.confirmation
            return max(0, most - done) * visit_estimate_s(self.spec, self.records)
        if not self.finished:
            return None
        spent = time.monotonic() - self.started
        trials = max(0, self.total - self.finished) * spent / self.finished
        return trials + planned_starts(self.spec).visits * visit_estimate_s(self.spec, self.records)

    def _elapsed(self) -> str:
        spent = time.monotonic() - self.started
        rest = self.time_left_s()
        left = f", ~{_duration(rest)} left" if rest is not None else ""
        return f"elapsed {_duration(spent)}{left}"

    def confirmation_started(self, contenders: int, *, done: int = 0, max_visits: int | None = None) -> None:
        """The confirmation begins with ``contenders`` (``done`` visits resumed; ``max_visits``: an extension's
        last look, default ``confirmation.max_visits``): its cost in engine starts."""
        visits = max_visits or self.spec.confirmation.max_visits
        most = contenders * visits
        self.confirmation = [most, min(done, most)]
        seconds, basis = start_time(self.spec, self.records)
        self.line(f"confirmation cost: up to {most - self.confirmation[1]} engine starts ({contenders} contenders x "
                  f"{visits} visits{f', {done} done' if done else ''}) x "
                  f"{_duration(seconds)} per start ({basis}); ~{_duration(visit_estimate_s(self.spec, self.records))} "
                  f"per visit with its repetitions")

    def visit_ended(self) -> None:
        """One confirmation visit ended (whatever its outcome)."""
        if self.confirmation is not None:
            self.confirmation[1] += 1

    def line(self, text: str) -> None:
        self.last_line = time.monotonic()
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def started_trial(self, number: int, plan: TrialPlan) -> None:
        self.running[number] = (plan.label(), time.monotonic())
        self.line(f"[trial {number}/{self.total}] start  {plan.label()}  ({self._elapsed()})")

    def waiting_line(self, free: str) -> str:
        """What the sweep is waiting for, in one line (printed when the log has been quiet)."""
        now = time.monotonic()
        if self.activity is not None:
            what, since = self.activity
            return f"[still waiting] {what} (for {_duration(now - since)}; {self._elapsed()})"
        if self.running:
            parts = [f"trial {n} {label} running for {_duration(now - since)}"
                     for n, (label, since) in sorted(self.running.items())]
            return f"[still waiting] {'; '.join(parts)} (engine start, probe or benchmark; {self._elapsed()})"
        return (f"[still waiting] for Ray to start the next trial: it needs {free} ({self._elapsed()}); "
                "`ray status` shows what holds the cluster")

    def repetition(self, number: int, result: dict[str, Any]) -> None:
        value = result.get(OBJECTIVE_KEY)
        if isinstance(value, (int, float)):
            self.line(f"[trial {number}/{self.total}] rep {int(result.get('repetition', 0)) + 1}/"
                      f"{self.spec.benchmark.repetitions}: {self.spec.objective.metric} {value:.4g}")

    def ended(self, record: TrialRecord | None, number: int, fallback: str) -> None:
        self.finished += 1
        self.running.pop(number, None)
        if record is None:
            self.line(f"[trial {number}/{self.total}] {fallback}  ({self._elapsed()})")
            return
        first_measured = bool(measured_start_times([record])) and not measured_start_times(self.records)
        self.records.append(record)
        direction = self.spec.objective.direction
        if record.status == "ok" and record.complete and record.value is not None:
            if self.best is None or (record.value > self.best[0] if direction == "max" else record.value < self.best[0]):
                self.best = (record.value, f"trial {record.number} {record.label}")
        value = f"{record.value:.4g}" if record.value is not None else "-"
        reason = f" ({record.reason}: {record.message[:160]})" if record.reason else ""
        best = f"{self.best[0]:.4g} ({self.best[1]})" if self.best else "none yet"
        self.line(f"[trial {record.number}/{self.total}] {record.status}{reason}  {self.spec.objective.metric} {value}"
                  f"  | best {best}  | {self._elapsed()}")
        if first_measured:
            self.line(cost_line(self.spec, self.records, fits=night_plan(self.spec, self.records).fits))


def _duration(seconds: float) -> str:
    return format_duration(seconds)


class QuietWatch:
    """Once nothing has been printed for ``SPECTUNE_QUIET_LIMIT_S`` (default 30 s), print what the
    sweep is waiting for, and again after as long. A driver thread that only reads the display."""

    def __init__(self, display: Display, *, needs: str) -> None:
        self.display = display
        self.needs = needs
        self.limit_s = max(0.5, ENV.SPECTUNE_QUIET_LIMIT_S.get())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="spectune-quiet-watch", daemon=True)

    def __enter__(self) -> "QuietWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _free(self) -> str:
        import ray

        try:
            free = ray.available_resources()
        except Exception:  # noqa: BLE001 - a progress line must never break the sweep
            return self.needs
        return f"{self.needs} on one node; free now: {free.get('CPU', 0.0):g} CPUs, {free.get('GPU', 0.0):g} GPUs"

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.limit_s / 2)):
            if time.monotonic() - self.display.last_line >= self.limit_s:
                self.display.line(self.display.waiting_line(self._free()))

