"""The shared Ray fixture works under the session's HOME and offers the logical GPUs tests rely on.

tests/conftest.py gives the session a fresh HOME holding a stale ``~/.ray/auth_token`` (as an
earlier run may leave one) and RAY_AUTH_MODE=disabled; this is the check that Ray then still runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_stale_token_in_home_does_not_break_ray(ray_cluster: dict) -> None:
    import ray

    @ray.remote(num_gpus=1)
    def visible_devices() -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    # Ray assigns a logical GPU id and exports it, exactly as on a GPU node.
    assert ray.get(visible_devices.remote()) != ""
    assert ray.cluster_resources().get("GPU") == 8
    # Ray ran beside the stale token (it did not replace it), and kept its files in its own temp dir.
    assert (Path(os.environ["HOME"]) / ".ray" / "auth_token").read_text().startswith("stale-token")
    assert (Path(ray_cluster["temp_dir"]) / "session_latest").exists()
