"""``spectune serve`` as a user runs it, for the Serve tests.

``ServeProcess`` starts the real command in its own session with an isolated Ray temp dir, waits
for its readiness line (stdout), and stops it with SIGINT as Ctrl-C does, asserting a clean exit.
Every engine of a test carries ``SPECTUNE_TEST_MARKER`` (through the config's env, i.e. the
replica's runtime_env), so a test can find exactly its own processes, dead or alive.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from serving.local_http import open_direct

from helpers.engine import wait_until

__all__ = [
    "REPO",
    "SPECTUNE",
    "ServeProcess",
    "http",
    "new_marker",
    "record_trial_run",
    "write_config",
]

REPO = Path(__file__).resolve().parents[2]
SPECTUNE = str(Path(sys.executable).with_name("spectune"))
READY_TIMEOUT_S = 240.0
"""Ray start + Serve + engine start on two busy cores."""
STOP_TIMEOUT_S = 120.0
"""Ctrl-C to exit: drain, engine stop, Ray shutdown."""


def new_marker() -> str:
    """A value for SPECTUNE_TEST_MARKER that only this test's processes carry."""
    return f"serve-{uuid.uuid4().hex[:12]}"


def write_config(path: Path, *, engine: dict[str, Any], serve: dict[str, Any] | None = None,
                 provenance: dict[str, Any] | None = None) -> Path:
    """A best.yaml as a sweep writes it (comment lines on top), optionally with a serve: block and
    a provenance: block (``record_trial_run``'s)."""
    text = "# spectune sweep test: the best configuration\n# output_tok_per_s 123.4 at concurrency 8\n"
    text += yaml.safe_dump(engine, sort_keys=False)
    if serve:
        text += yaml.safe_dump({"serve": serve}, sort_keys=False)
    if provenance:
        text += yaml.safe_dump({"provenance": provenance}, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


@dataclass
class Reply:
    """One HTTP answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(url: str, *, body: bytes | dict | None = None, key: str | None = None, timeout_s: float = 60.0,
         method: str | None = None) -> Reply:
    """One request (JSON if ``body`` is a dict); HTTP errors are answers, not exceptions."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with open_direct(request, timeout_s=timeout_s) as response:
            return Reply(int(response.status), {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as exc:
        return Reply(int(exc.code), {k.lower(): v for k, v in exc.headers.items()}, exc.read())


@dataclass
class ServeProcess:
    """A running ``spectune serve`` (use ``start``; always ``stop``)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    ray_tmp: Path
    port: int
    ready_line: str = ""
    _lines: "queue.Queue[str]" = field(default_factory=queue.Queue)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, config: Path | None, *, port: int, args: list[str] = (), env: dict[str, str] | None = None,
              log_dir: Path) -> "ServeProcess":
        """``spectune serve CONFIG --port PORT ARGS`` (no CONFIG: ``args`` name it, e.g. ``--mlflow-run``)."""
        ray_tmp = Path(tempfile.mkdtemp(prefix="st-sv-", dir="/tmp"))  # Unix socket paths must stay short
        log_path = log_dir / "spectune-serve.log"
        full_env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "PYTHONUNBUFFERED": "1", **(env or {})}
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [SPECTUNE, "serve", *([str(config)] if config is not None else []), "--port", str(port), *args],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=full_env, cwd=REPO,
            start_new_session=True,
        )
        log.close()
        served = cls(proc=proc, log_path=log_path, ray_tmp=ray_tmp, port=port)
        threading.Thread(target=served._read_stdout, daemon=True).start()
        try:
            served.ready_line = served._wait_line("serving ", timeout_s=READY_TIMEOUT_S)
        except BaseException:
            served.kill()
            raise
        return served

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode(errors="replace"))
        self._lines.put("")  # EOF

    def _wait_line(self, prefix: str, *, timeout_s: float) -> str:
        seen: list[str] = []

        def arrived() -> bool:
            while not self._lines.empty():
                line = self._lines.get()
                seen.append(line)
                if line.startswith(prefix) or line == "":
                    return True
            return self.proc.poll() is not None

        wait_until(arrived, timeout_s=timeout_s, what=f"spectune serve to print {prefix!r}", poll_s=0.2,
                   detail=self.log_tail)
        found = next((line for line in seen if line.startswith(prefix)), None)
        if found is None:
            raise AssertionError(f"spectune serve exited ({self.proc.poll()}) before it was ready; stdout {seen}\n"
                                 f"{self.log_tail()}")
        return found

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "--- spectune serve stderr ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        """Ctrl-C (or ``sig``: SIGTERM as a service manager stops it); returns the exit code
        (SIGKILLs the group if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"spectune serve did not stop within {STOP_TIMEOUT_S:g} s of {sig.name}\n"
                                     f"{self.log_tail()}") from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        """Last resort on a failed test: the whole session of the command."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def logs_contain(self, needle: str) -> list[str]:
        """Files (the command's stderr, every Ray log of its session) that contain ``needle``."""
        hits = []
        for path in [self.log_path, *self.ray_tmp.rglob("*")]:
            try:
                if path.is_file() and needle.encode() in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                continue
        return hits


def record_trial_run(work: Path, *, engine: dict[str, Any], sweep: str = "serve-test") -> dict[str, Any]:
    """A sweep's MLflow SQLite store in ``work`` with one finished trial of ``engine``, written by
    the sweep's own writer (the coordinator, without Ray): the trial's run carries
    ``engine_config.yaml``. Returns ``{"tracking_uri", "run_id", "parent_run_id", "provenance"}``,
    ``provenance`` being the block a sweep's best.yaml would carry for that trial."""
    from orchestrator.sweep.execution.coordinator import SweepCoordinator
    from orchestrator.sweep.records.results import TrialRecord, trial_provenance
    from serving.engine.config import EngineConfig

    config = EngineConfig.model_validate(engine).model_dump()
    uri = f"sqlite:///{work / 'results' / 'mlflow.db'}"
    coordinator = SweepCoordinator(results_dir=str(work / "results"), tracking_uri=uri, experiment_name="serve-test",
                                   sweep_name=sweep, spec_text=f"name: {sweep}\n")
    got = coordinator.start_trial({"trial_id": "t1", "number": 0, "kind": "search", "label": "steps 2 topk 1 draft 3",
                                   "params": {}, "status": "running", "engine_config": config,
                                   "engine_command": "python -m serving.reference ..."})
    coordinator.finish_trial({
        "trial_id": "t1", "number": got["number"], "kind": "search", "label": "steps 2 topk 1 draft 3", "params": {},
        "status": "ok", "objective": {"metric": "output_tok_per_s", "concurrency": 8, "direction": "max",
                                      "values": [120.0, 123.4, 125.0], "median": 123.4, "ci95_low": 119.0,
                                      "ci95_high": 126.0},
        "repetitions_done": 3, "repetitions_planned": 3, "measured_in_full": True, "engine_config": config,
    })
    record = TrialRecord.model_validate(coordinator.records()[0])
    provenance = trial_provenance(record, sweep=sweep, parent_run_id=coordinator.parent_run_id, tracking_uri=uri,
                                  experiment="serve-test", verdict=None, written_at="2026-01-01T00:00:00+00:00")
    return {"tracking_uri": uri, "run_id": got["run_id"], "parent_run_id": coordinator.parent_run_id,
            "provenance": provenance.model_dump(mode="json")}
