"""Token authentication for the local Ray that spectune starts itself: Ray's default (token), chosen
explicitly so Ray does not warn about it; never a user's setting changed, never a joined cluster's.

No cluster is started: what Ray decides before it starts one (its mode, its warning) is asked of
Ray's own functions in a child process, so this test session's Ray config is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sweep.execution.ray_connection import starts_local_cluster
from serving.ray_auth import AUTH_MODE_VARIABLE, choose_local_auth_mode

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, logging, os, sys
import ray  # imported first, as the CLI has: Ray has read its auth mode by now
from ray._private.authentication.authentication_token_setup import enable_token_auth_by_default
from ray._raylet import AuthenticationMode, get_authentication_mode

said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("ray._private.authentication.authentication_token_setup").addHandler(Keep())
if sys.argv[1] == "spectune":
    from serving.ray_auth import choose_local_auth_mode
    choose_local_auth_mode()
enable_token_auth_by_default()  # what ray.init() does first when it starts a cluster
print(json.dumps({"said": said, "variable": os.environ.get("RAY_AUTH_MODE"),
                  "token_mode": get_authentication_mode() == AuthenticationMode.TOKEN}))
"""


def _before_a_local_start(how: str, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != AUTH_MODE_VARIABLE}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _CHILD, how], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_local_cluster_keeps_token_auth_without_ray_warning_about_it(tmp_path: Path) -> None:
    ray_alone = _before_a_local_start("ray", tmp_path)
    assert any("Token authentication is enabled" in line for line in ray_alone["said"]), ray_alone
    ours = _before_a_local_start("spectune", tmp_path)
    assert ours == {"said": [], "variable": "token", "token_mode": True}, "the same mode as Ray's default, unsaid"


@pytest.mark.parametrize("value", ["disabled", "token", ""])
def test_a_mode_the_user_set_is_never_changed(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(AUTH_MODE_VARIABLE, value)
    assert choose_local_auth_mode() is None
    assert os.environ[AUTH_MODE_VARIABLE] == value


def test_only_a_cluster_this_process_starts_is_concerned(monkeypatch: pytest.MonkeyPatch) -> None:
    assert starts_local_cluster("local")
    assert not starts_local_cluster("10.0.0.5:6379"), "--address: the cluster's own mode"
    assert not starts_local_cluster("auto")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # ray job submit's driver
    assert not starts_local_cluster(None)
