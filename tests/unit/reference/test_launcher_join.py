"""Stopping the TP ranks waits for an exit code, not only for the process's sentinel: the sentinel can be
ready a moment before the process can be reaped, and a rank that was exiting cleanly was then reported as
not exiting and killed (CI: "did not exit within 5s; killing it", exit codes [None, 0])."""

from __future__ import annotations

from serving.reference.launcher import _join


class _ReapedLate:
    """A process whose ``join`` returns at once (its sentinel is ready) but which is reaped only at the
    third look."""

    def __init__(self) -> None:
        self.looks = 0

    def join(self, timeout: float | None = None) -> None:
        self.looks += 1

    @property
    def exitcode(self) -> int | None:
        return 0 if self.looks >= 3 else None


def test_join_waits_for_the_exit_code_within_the_timeout() -> None:
    proc = _ReapedLate()
    _join(proc, 30.0)
    assert proc.exitcode == 0 and proc.looks == 3


def test_join_gives_up_at_its_deadline() -> None:
    class _Never(_ReapedLate):
        @property
        def exitcode(self) -> int | None:
            return None

    proc = _Never()
    _join(proc, 0.0)
    assert proc.looks == 1 and proc.exitcode is None
