"""The env audit on real process trees (plain subprocesses, no engine): what it finds and names."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from serving.engine.audit import REDACTED, audit_process_tree, read_environ, redact

# The seed's bug in miniature: the parent has NCCL_PROTO, but it is not in os.environ while the
# worker is spawned (put back right after). The worker is named "ref::tp0" like the reference
# engine's ranks; both wait for stdin EOF.
TREE = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys
    late = os.environ.pop("NCCL_PROTO")
    worker_code = (
        "import ctypes, sys; ctypes.CDLL('libc.so.6').prctl(15, b'ref::tp0', 0, 0, 0); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    worker = subprocess.Popen([sys.executable, "-c", worker_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    worker.stdout.readline()
    os.environ["NCCL_PROTO"] = late   # too late: the worker already has its environment
    print("ready", flush=True)
    sys.stdin.read()
    worker.stdin.close(); worker.wait()
    """
)


@pytest.fixture()
def tree() -> Iterator[subprocess.Popen]:
    env = {**os.environ, "NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret_value"}
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_finds_every_process_and_roles(tree: subprocess.Popen) -> None:
    report = audit_process_tree(root_pid=tree.pid, expected={"NCCL_ALGO": "Ring"})
    assert report.ok, report.summary()
    assert report.count("server") == 1 and report.count("tp_worker") == 1
    assert "env audit passed" in report.summary()


def test_late_variable_is_caught_on_the_worker_only(tree: subprocess.Popen) -> None:
    report = audit_process_tree(root_pid=tree.pid, expected={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"})
    assert not report.ok
    (failure,) = report.failures
    worker_pid = psutil.Process(tree.pid).children()[0].pid
    assert (failure.pid, failure.role, failure.missing) == (worker_pid, "tp_worker", ("NCCL_PROTO",))
    summary = report.summary()
    assert f"pid {worker_pid} (tp_worker" in summary and "missing NCCL_PROTO" in summary


def test_mismatch_names_values_and_redacts_secrets(tree: subprocess.Popen) -> None:
    report = audit_process_tree(root_pid=tree.pid, expected={"NCCL_ALGO": "Tree", "HF_TOKEN": "other"})
    assert not report.ok and len(report.failures) == 2
    data = report.to_dict()
    text = report.summary() + repr(data)
    assert "hf_secret_value" not in text and "other" not in text
    assert REDACTED in text
    assert "'Ring'" in text and "'Tree'" in text


def test_worker_only_expectations(tree: subprocess.Popen) -> None:
    report = audit_process_tree(root_pid=tree.pid, expected={}, worker_expected={"NCCL_CUMEM_ENABLE": "0"})
    assert [f.role for f in report.failures] == ["tp_worker"]


def test_present_with_any_value(tree: subprocess.Popen) -> None:
    assert audit_process_tree(root_pid=tree.pid, expected={"NCCL_ALGO": None}).ok
    assert not audit_process_tree(root_pid=tree.pid, expected={"NCCL_NOPE": None}).ok


def test_missing_process_is_not_ok() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    report = audit_process_tree(root_pid=proc.pid, expected={"A": "1"})
    assert not report.ok and report.processes[0].error == "no such process"


def test_read_environ_is_the_start_up_environment_exactly() -> None:
    # A non-Python child (cat adds nothing to its environment) with values that need care:
    # an "=" inside a value, an empty value, non-ASCII text.
    env = {"PATH": os.environ["PATH"], "NCCL_ALGO": "Ring", "WITH_EQUALS": "a=b=c", "EMPTY": "", "TEXT": "h\u00e9"}
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"ready\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"ready\n"  # echoed: cat is running, past its exec
        assert read_environ(proc.pid) == env
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        read_environ(proc.pid)


def test_redact() -> None:
    assert redact("NCCL_ALGO", "Ring") == "Ring"
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD"):
        assert redact(name, "x") == REDACTED


def test_cli_audit_exit_codes(tree: subprocess.Popen) -> None:
    exe = Path(sys.executable).with_name("spectune")
    ok = subprocess.run([str(exe), "audit", "--pid", str(tree.pid), "--expect", "NCCL_ALGO=Ring"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "tp_worker" in ok.stdout
    bad = subprocess.run([str(exe), "audit", "--pid", str(tree.pid), "--expect", "NCCL_PROTO=LL"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "missing NCCL_PROTO" in bad.stdout
    gone = subprocess.run([str(exe), "audit", "--pid", "999999999", "--expect", "A=1"],
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2
