"""The sweep's SIGTERM handler: inside Tune's loop the stop goes to Tune's own stop (which saves
Tune's state once more); elsewhere, or at a second signal, it is the Ctrl-C path."""

from __future__ import annotations

import signal

import pytest

from orchestrator.sweep.execution.driver import _Interrupted, _StopSignal


@pytest.fixture
def tune_stop() -> list[int]:
    """A SIGUSR1 handler standing where Tune's is while its loop runs; the signals it got."""
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    yield got
    signal.signal(signal.SIGUSR1, previous)


def test_inside_tunes_loop_the_first_signal_goes_to_tunes_stop(tune_stop: list[int]) -> None:
    stop = _StopSignal()
    stop.in_tune = True
    stop(signal.SIGTERM, None)
    assert tune_stop == [signal.SIGTERM] and stop.received == "SIGTERM"
    with pytest.raises(_Interrupted, match="SIGTERM"):  # a second signal does not wait for Tune
        stop(signal.SIGTERM, None)


def test_outside_tunes_loop_it_interrupts_at_once(tune_stop: list[int]) -> None:
    stop = _StopSignal()
    with pytest.raises(_Interrupted, match="SIGTERM"):
        stop(signal.SIGTERM, None)
    assert tune_stop == [] and stop.received is None
