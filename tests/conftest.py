"""Session-wide test isolation and the shared local Ray cluster.

Ray keeps state under HOME (~/.ray, including an auth token that Ray >= 2.59 may create) and
under /tmp/ray. A token left behind by an earlier run must never break this one, so the whole
test session gets a fresh HOME and RAY_AUTH_MODE=disabled for every Ray server and client it
starts, and Ray's files go to a temp dir of its own. A developer's MLFLOW_TRACKING_URI is taken
out too: a sweep reads it (after the spec's tracking.mlflow_uri), and the tests read each sweep's
own SQLite store.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

_saved_env: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    home = tempfile.mkdtemp(prefix="spectune-test-home-")
    # A stale token from "an earlier run": with RAY_AUTH_MODE set explicitly it must not matter.
    (Path(home) / ".ray").mkdir()
    (Path(home) / ".ray" / "auth_token").write_text("stale-token-from-another-run\n")
    for name, value in {"HOME": home, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        _saved_env[name] = os.environ.get(name)
        os.environ[name] = value
    _saved_env["MLFLOW_TRACKING_URI"] = os.environ.pop("MLFLOW_TRACKING_URI", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = os.environ.get("HOME", "")
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if Path(home).name.startswith("spectune-test-home-"):
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict]:
    """One local Ray cluster for the whole session, with 8 logical GPUs (no real GPU needed).

    ``ray start`` costs 10-20 s on two cores, so every integration test shares this one. Yields
    ``ray.init``'s context info (address etc.).
    """
    import ray

    # Unix socket paths must stay short, so not pytest's long tmp path.
    temp_dir = tempfile.mkdtemp(prefix="st-ray-", dir="/tmp")
    context = ray.init(
        num_cpus=max(4, os.cpu_count() or 2),
        num_gpus=8,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
    )
    try:
        yield {"address": context.address_info["address"], "temp_dir": temp_dir}
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests where CUDA is absent (CI); everything else always runs."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)
