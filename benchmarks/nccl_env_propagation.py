"""Show, per TP rank, which NCCL variables reached the process that runs NCCL — and the seed's bug.

Starts the reference engine twice with the same NCCL variables: once launched correctly, once with
the ``late_env`` fault (the server has the variables but its TP workers are spawned without them,
as when a variable is set in the parent after the workers were started). For each run it reads
the engine log: every worker's own start-up line (the env it was spawned with) and, on CUDA with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV``, NCCL's own "NCCL_X set by environment to V" lines per
rank. Prints JSON. Stdlib only, so it runs on a bare GPU image with just torch and aiohttp.

    python benchmarks/nccl_env_propagation.py --device cuda --tp-size 2 --model-path ref-gpu-comm
    python benchmarks/nccl_env_propagation.py            # CPU: gloo, worker start-up lines only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(ROOT))

from serving.engine.nccl_log import parse_nccl_env_lines  # noqa: E402  (standard library only)

WORKER_LINE = re.compile(r"worker (ref::tp\d+) starting: rank=(\d+) .*? env: (.*)$")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=30) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)  # health polling interval
    raise RuntimeError(f"engine not healthy after {timeout_s} s")


def _generate(url: str) -> dict:
    body = json.dumps({"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    request = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def run_scenario(*, name: str, args: argparse.Namespace, nccl_env: dict[str, str], fault: str | None, log_dir: Path) -> dict:
    """Launch one engine, make one request, stop it, and report what each rank saw."""
    port = _free_port()
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, **nccl_env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
    env.pop("SPECTUNE_REFERENCE_FAULT", None)
    if fault:
        env["SPECTUNE_REFERENCE_FAULT"] = fault
    argv = [sys.executable, "-m", "serving.reference", "--model-path", args.model_path, "--tp-size",
            str(args.tp_size), "--device", args.device, "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, args.timeout)
        completion_tokens = _generate(url)["meta_info"]["completion_tokens"]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text(errors="replace")
    ranks: dict[int, dict] = {}
    for line in text.splitlines():
        worker = WORKER_LINE.search(line)
        if worker:
            seen = dict(item.split("=", 1) for item in worker.group(3).split() if "=" in item)
            ranks.setdefault(int(worker.group(2)), {})["worker_env"] = {k: seen.get(k) for k in nccl_env}
    for process in parse_nccl_env_lines(text).values():  # NCCL's own lines, keyed by CUDA device = rank here
        reported = {k: v for k, v in process["values"].items() if k in nccl_env}
        if reported:
            ranks.setdefault(process["device"], {}).setdefault("nccl_reported", {}).update(reported)
    every_rank_has_all = len(ranks) == args.tp_size and all(
        all(r.get("worker_env", {}).get(k) == v for k, v in nccl_env.items()) for r in ranks.values()
    )
    return {
        "scenario": name,
        "fault": fault,
        "completion_tokens": completion_tokens,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "every_rank_got_every_variable": every_rank_has_all,
        "log": str(log_path),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="ref-tiny")
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds an engine may take to become healthy.")
    parser.add_argument("--log-dir", default=None, help="Where engine logs go (default: a temp dir).")
    parser.add_argument("--set", action="append", default=["NCCL_ALGO=Ring", "NCCL_PROTO=Simple"],
                        help="NAME=VALUE to propagate (repeatable).")
    args = parser.parse_args()
    nccl_env = dict(item.split("=", 1) for item in args.set)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="spectune-nccl-env-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    late = ",".join(nccl_env)
    results = [
        run_scenario(name="launched-correctly", args=args, nccl_env=nccl_env, fault=None, log_dir=log_dir),
        run_scenario(name="set-after-spawn", args=args, nccl_env=nccl_env, fault=f"late_env:{late}", log_dir=log_dir),
    ]
    print(json.dumps({"benchmark": "nccl_env_propagation", "device": args.device, "tp_size": args.tp_size,
                      "model_path": args.model_path, "variables": nccl_env, "results": results}, indent=2))


if __name__ == "__main__":
    main()
