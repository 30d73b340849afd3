"""``spectune serve``'s stop signals: the first Ctrl-C / SIGTERM stops it, and one that arrives
before the teardown has begun (two Ctrl-C in quick succession, or a signal sent to both `timeout`
and spectune) must not interrupt what the first started."""

from __future__ import annotations

import signal

import pytest

from serving.serve import runner


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_stop_signal_before_the_teardown_only_says_to_wait(second: int, caplog) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with runner._signals_stop():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(second)  # between the first interrupt and _uninterruptible: no raise
    assert "still stopping" in caplog.text
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before, "handlers restored"
