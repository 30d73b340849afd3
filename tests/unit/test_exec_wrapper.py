"""The exec wrapper: an engine started with die_with_parent gets SIGTERM when its launcher dies,
while its pid, argv and environment are exactly those of a plain launch (plain subprocesses, no engine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from serving.engine.command import EngineCommand
from serving.engine.exec_wrapper import wrapped_argv
from serving.engine.process import EngineProcess
from serving.errors import EngineLaunchError

from helpers.engine import read_environ, wait_until

# Stands in for an engine: says it runs, records SIGTERM, otherwise waits forever.
ENGINE = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    out = Path(sys.argv[1])
    def on_term(signum, frame):
        (out / "signal").write_text(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    (out / "ready").write_text("ready")
    while True:
        signal.pause()
    """
)

# The launcher: EngineProcess(die_with_parent=True) in a process that has a second thread (as a
# Ray actor has), reporting the engine's pid; then it blocks until it is killed.
LAUNCHER = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    from serving.engine.command import EngineCommand
    from serving.engine.process import EngineProcess
    argv, env, log = json.loads(sys.argv[1])
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    engine = EngineProcess(command=EngineCommand(argv=argv, env={"FROM_CONFIG": "1"}), log_path=Path(log),
                           base_env=env, die_with_parent=True)
    engine.start()
    print(engine.pid, flush=True)
    sys.stdin.read()
    """
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_engine_gets_sigterm_when_its_launcher_dies_with_argv_pid_and_env_unchanged(tmp_path: Path) -> None:
    import json

    argv = [sys.executable, "-c", ENGINE, str(tmp_path)]
    # No LANG/LC_*: the wrapper's interpreter then adds LC_CTYPE to its own environment (PEP 538),
    # which must not reach the engine.
    env = {"PATH": os.environ["PATH"], "ONLY_IN_BASE": "x=y"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, json.dumps([argv, env, str(tmp_path / "engine.log")])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    engine_pid = None
    try:
        assert launcher.stdout is not None
        engine_pid = int(launcher.stdout.readline())
        wait_until(lambda: (tmp_path / "ready").exists(), timeout_s=60, what="the engine to run",
                   detail=lambda: (tmp_path / "engine.log").read_text())
        engine = psutil.Process(engine_pid)
        assert engine.cmdline() == argv  # the launched pid is the engine itself, with its own argv
        assert engine.ppid() == launcher.pid
        assert read_environ(engine_pid) == {**env, "FROM_CONFIG": "1"}
        launcher.kill()  # SIGKILL: no finaliser, no stop()
        launcher.wait(timeout=30)
        wait_until(lambda: (tmp_path / "signal").exists(), timeout_s=30, what="the engine to get its signal")
        assert (tmp_path / "signal").read_text() == "SIGTERM"
        wait_until(lambda: _gone(engine_pid), timeout_s=30, what="the engine to exit")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        if engine_pid is not None and not _gone(engine_pid):
            os.kill(engine_pid, 9)


def test_wrapper_reports_a_program_it_cannot_run(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-engine")
    env = {"PATH": os.environ["PATH"]}
    run = subprocess.run(wrapped_argv([missing], parent_pid=os.getpid(), env=env), env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 127
    assert missing in run.stderr


def test_wrapper_does_not_start_the_engine_if_its_launcher_is_already_gone(tmp_path: Path) -> None:
    # The launcher died before the death signal was set (the race the kernel cannot see): the
    # wrapper finds a different parent and exits instead of starting an engine nobody owns.
    marker = tmp_path / "started"
    env = {"PATH": os.environ["PATH"]}
    not_our_pid = os.getppid()  # the wrapper's parent is this process, not this process's parent
    run = subprocess.run(wrapped_argv(["touch", str(marker)], parent_pid=not_our_pid, env=env), env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and not marker.exists()
    ok = subprocess.run(wrapped_argv(["touch", str(marker)], parent_pid=os.getpid(), env=env), env=env, timeout=60)
    assert ok.returncode == 0 and marker.exists()


def test_wrapper_does_not_depend_on_the_launch_pythonpath(tmp_path: Path) -> None:
    # A PYTHONPATH that shadows stdlib modules the wrapper uses must not reach the wrapper (-I);
    # the engine still gets the variable.
    (tmp_path / "ctypes.py").write_text("raise SystemExit('shadowed ctypes imported')\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(wrapped_argv(["env"], parent_pid=os.getpid(), env=env), env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"PYTHONPATH={tmp_path}" in run.stdout.splitlines()


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_a_missing_program_fails_at_start(tmp_path: Path, die_with_parent: bool) -> None:
    command = EngineCommand(argv=[str(tmp_path / "no-such-engine"), "--port", "1"], port=1)
    engine = EngineProcess(command=command, log_path=tmp_path / "e.log", die_with_parent=die_with_parent)
    with pytest.raises(EngineLaunchError, match="no-such-engine") as info:
        engine.start()
    assert info.value.reason == "launch_failed"
    assert not engine.started
