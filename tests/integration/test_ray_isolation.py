"""The shared Ray fixture really isolates Ray's state and offers the logical GPUs tests rely on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_stale_token_in_home_does_not_break_ray(ray_cluster: dict) -> None:
    import ray

    home = Path(os.environ["HOME"])
    assert home.name.startswith("spectune-test-home-"), "tests must not use the real HOME"
    assert (home / ".ray" / "auth_token").read_text().startswith("stale-token")
    assert os.environ["RAY_AUTH_MODE"] == "disabled"

    @ray.remote(num_gpus=1)
    def visible_devices() -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    # Ray assigns a logical GPU id and exports it, exactly as on a GPU node.
    assert ray.get(visible_devices.remote()) != ""
    assert ray.cluster_resources().get("GPU") == 8
    assert Path(ray_cluster["temp_dir"]).is_dir()
