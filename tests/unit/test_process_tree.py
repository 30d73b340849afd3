"""ProcessTree on a real process tree (plain subprocesses, no engine): every process of it is found,
even once re-parented or out of the group, and nothing else is."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from typing import Iterator

import psutil
import pytest

from serving.engine.process_tree import ProcessTree

from helpers.engine import wait_until

SLEEPER = [sys.executable, "-c", "import signal; signal.pause()"]  # until a signal ends it

# A leader (own session, like an engine) with a worker in its group and a helper that left the
# group (setsid). On "orphan\n" it starts a process whose parent exits at once: that one is in the
# group but was never a descendant the tree could see.
LEADER = textwrap.dedent(
    f"""
    import subprocess, sys
    sleeper = {SLEEPER!r}
    worker = subprocess.Popen(sleeper)
    detached = subprocess.Popen(sleeper, start_new_session=True)
    print(worker.pid, detached.pid, flush=True)
    sys.stdin.readline()
    spawn = "import subprocess; print(subprocess.Popen({SLEEPER!r}).pid, flush=True)"
    middle = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True)
    print(middle.stdout.readline().strip(), flush=True)
    middle.wait()
    sys.stdin.read()
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture()
def leader() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    spawned: list[int] = []
    proc.spawned = spawned  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        for pid in [proc.pid, *spawned]:
            if _alive(pid):
                psutil.Process(pid).kill()
        proc.wait(timeout=30)


def _pids(processes: list[psutil.Process]) -> set[int]:
    return {p.pid for p in processes}


def test_finds_reparented_detached_and_unseen_group_members_and_no_strangers(leader: subprocess.Popen) -> None:
    assert leader.stdin is not None and leader.stdout is not None
    tree = ProcessTree(leader.pid)
    worker, detached = map(int, leader.stdout.readline().split())
    leader.spawned += [worker, detached]  # type: ignore[attr-defined]
    assert _pids(tree.live()) == {leader.pid, worker, detached}  # remembered as descendants

    leader.stdin.write("orphan\n")
    leader.stdin.flush()
    orphan = int(leader.stdout.readline())
    leader.spawned.append(orphan)  # type: ignore[attr-defined]
    wait_until(lambda: orphan not in _descendants(leader.pid), timeout_s=30, what="the orphan to be re-parented")
    stranger = subprocess.Popen(SLEEPER)  # this test's own child, in this test's group
    try:
        assert _pids(tree.live()) == {leader.pid, worker, detached, orphan}  # orphan: via the group only
        # The leader dies; its exit code is still the launcher's to collect (the tree never reaps it).
        leader.kill()
        assert leader.wait(timeout=30) == -signal.SIGKILL
        assert _pids(tree.live()) == {worker, detached, orphan}  # remembered, though no longer descendants
        assert tree.wait_gone(timeout_s=30) == set()
        assert not any(_alive(pid) for pid in (worker, detached, orphan))
        assert set(tree.seen) == {leader.pid, worker, detached, orphan}
        assert _alive(stranger.pid), "a process outside the engine's tree was killed"
    finally:
        stranger.kill()
        stranger.wait(timeout=30)


def _descendants(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def test_signal_reaches_the_group_and_those_that_left_it(leader: subprocess.Popen) -> None:
    assert leader.stdout is not None
    tree = ProcessTree(leader.pid)
    worker, detached = map(int, leader.stdout.readline().split())
    leader.spawned += [worker, detached]  # type: ignore[attr-defined]
    tree.remember()
    tree.signal(signal.SIGTERM)
    assert leader.wait(timeout=30) == -signal.SIGTERM
    wait_until(lambda: not _alive(worker) and not _alive(detached), timeout_s=30, what="SIGTERM to reach all")
    assert tree.live() == []


def test_a_gone_leader_is_refused_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(psutil.NoSuchProcess):
        ProcessTree(proc.pid)
