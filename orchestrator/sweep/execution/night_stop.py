"""When the night stops spending starts: a failure that would repeat on every later trial.

Three cases, read from the trials' final records as they end (:func:`night_stop`):

* ``engine_contract``: an engine answered nothing a measurement needs (``serving.engine.contract``):
  every later trial would measure nothing. The sweep stops with exit 2.
* ``probe_on_default``: the correctness probe failed SGLang's own choice of speculative numbers,
  the configuration SGLang ships: on a model it fits, a probe threshold that fails it says the
  thresholds (the spec's ``probe``) do not fit this model, and every speculative trial would fail.
* ``repeated_failure``: ``budget.max_same_failures`` trials failed the same way (reason, and
  message with its numbers taken out: :func:`failure_signature`), e.g. an out-of-memory at CUDA-graph
  capture on every speculative start.

The Tune stopper (:func:`night_stopper`) ends every trial at the first such record; the driver then
writes the morning files with the diagnosis (``finish.finish_sweep``'s ``stopped``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from orchestrator.space import BASELINE_AUTO
from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import TrialRecord
from serving.errors import SpectuneError

__all__ = ["ENGINE_CONTRACT", "EngineContractError", "NightStop", "failure_signature", "night_stop", "night_stopper",
           "probe_words"]

ENGINE_CONTRACT = "engine_contract"
"""The failure reason (``results.FAILURE_REASONS``) that stops the sweep with exit 2."""

PROBE_FAILURES = ("probe_mismatch",)
"""Reasons that say the probe judged the outputs wrong (not that it could not run)."""

NOT_REPEATABLE = ("interrupted", "early_stopped", "slo_violated")
"""Reasons that say nothing about the next trial (the sweep's own stop, ASHA, a latency limit)."""

_WITH_DIGITS = re.compile(r"\S*\d\S*")


class EngineContractError(SpectuneError):
    """The engine does not answer what a measurement needs; the sweep stopped (exit 2)."""


def failure_signature(reason: str, message: str) -> str:
    """What two trials failing the same way share: the reason, the message's first line (what
    happened) and its last two (where an engine log's tail ends: the error), with every word that
    holds a digit (ports, pids, times, sizes, trial ids, log paths, flag values) as ``#``; the lines
    between (an engine's command line and server args: each trial's own) are left out."""
    lines = [line for line in (message or "").splitlines() if line.strip()]
    kept = lines if len(lines) <= 3 else [lines[0], *lines[-2:]]
    text = " ".join(_WITH_DIGITS.sub("#", " ".join(kept)).split())
    return f"{reason}: {text}"


@dataclass(frozen=True)
class NightStop:
    """Why the search stopped spending starts.

    Attributes:
        kind: ``engine_contract``, ``probe_on_default`` or ``repeated_failure``.
        trials: The trials (numbers) that show it.
        diagnosis: What was seen and what to do, in words (the summary's and the job log's line).
    """

    kind: Literal["engine_contract", "probe_on_default", "repeated_failure"]
    trials: tuple[int, ...]
    diagnosis: str

    def error(self) -> EngineContractError | None:
        """The exit-2 error of an engine-contract stop; None for the others (exit 1)."""
        return EngineContractError(self.diagnosis) if self.kind == ENGINE_CONTRACT else None


def probe_words(spec: SweepSpec) -> str:
    """The correctness probe's thresholds in words (a ``probe_on_default`` stop's diagnosis)."""
    probe = spec.probe
    if probe.rule == "exact":
        return "rule exact: token for token"
    return f"rule near_tie, max_logprob_gap {probe.max_logprob_gap:g} nats, max_flip_rate {probe.max_flip_rate:g}"


def night_stop(records: Iterable[TrialRecord], *, max_same_failures: int,
               probe_thresholds: str = "") -> NightStop | None:
    """The first reason in ``records`` (ended trials) to stop the search, or None to go on.

    Args:
        max_same_failures: Failed trials sharing a :func:`failure_signature` that stop the search.
        probe_thresholds: The probe's thresholds in words, for the ``probe_on_default`` diagnosis.
    """
    ended = [r for r in records if r.status != "running"]
    broken = next((r for r in ended if r.reason == ENGINE_CONTRACT), None)
    if broken is not None:
        return NightStop(ENGINE_CONTRACT, (broken.number,), (
            f"trial {broken.number} ({broken.label}): {broken.message}. The sweep stopped after that start: without "
            "these no trial can be measured. spectune reads SGLang 0.5.23's fields (pip install 'spectune[sglang]' "
            "pins it); check the engine's version; the folder named above holds what it answered"))
    default = next((r for r in ended if r.kind == BASELINE_AUTO and r.reason in PROBE_FAILURES), None)
    if default is not None:
        return NightStop("probe_on_default", (default.number,), (
            f"the correctness probe failed SGLang's own default speculative configuration (trial {default.number}, "
            f"{default.label}): {default.message}. SGLang ships that configuration, so the probe's thresholds"
            f"{' (' + probe_thresholds + ')' if probe_thresholds else ''} likely do not fit this model (they were "
            "calibrated on a small bf16 model), and every speculative trial would fail the same way; the search "
            "stopped before spending more starts. Read the flips in that trial's probe.json (MLflow), then raise "
            "probe.max_logprob_gap / probe.max_flip_rate in the spec, or set probe.rule: exact to see every "
            "divergence, and resume"))
    signed = [(failure_signature(r.reason or "", r.message), r) for r in ended
              if r.status == "failed" and r.reason and r.reason not in NOT_REPEATABLE]
    signature, count = next(iter(Counter(sig for sig, _ in signed).most_common(1)), ("", 0))
    if count < max_same_failures:
        return None
    same = [r for sig, r in signed if sig == signature]
    numbers = tuple(r.number for r in same)
    first = same[0]
    return NightStop("repeated_failure", numbers, (
        f"{count} trials failed the same way ({', '.join(map(str, numbers))}; budget.max_same_failures "
        f"{max_same_failures}): {first.reason}: {first.message[:600]}. Every later start would likely fail so too; "
        "the search stopped. Fix the cause (the first trial's engine log is in its MLflow run), then "
        "spectune sweep --resume the results directory"))


def night_stopper(*, max_same_failures: int, probe_thresholds: str = "") -> Any:
    """A Ray Tune stopper whose ``stop_all`` turns true once the trials' final records show a
    :func:`night_stop`; its ``stopped`` holds it."""
    from ray.tune import Stopper

    class NightStopper(Stopper):
        def __init__(self) -> None:
            self.records: dict[str, TrialRecord] = {}
            self.stopped: NightStop | None = None

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            record = result.get("record")
            if result.get("final") and isinstance(record, str) and self.stopped is None:
                self.records[trial_id] = TrialRecord.model_validate(json.loads(record))
                self.stopped = night_stop(self.records.values(), max_same_failures=max_same_failures,
                                          probe_thresholds=probe_thresholds)
            return False

        def stop_all(self) -> bool:
            return self.stopped is not None

    return NightStopper()
