"""Session-wide test isolation and the shared Ray clusters (one single-node, one two-node).

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
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from helpers.ray_cluster import RayCluster

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
def mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store with MLflow's migrations already run (3-5 s on two cores each
    time a store is created): a test copies it (:func:`helpers.sweep.seed_results`) where a sweep or
    a coordinator opens its store, which then opens in a fraction of a second."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def results_dir(tmp_path: Path, mlflow_store_template: Path) -> Path:
    """``tmp_path / "results"`` holding a copy of :func:`mlflow_store_template` as ``mlflow.db``."""
    from helpers.sweep import seed_results

    return seed_results(tmp_path / "results", mlflow_store_template)


HAPROXY_ENV_NAMES = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                     "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
"""Ports HAProxy mode otherwise takes at fixed numbers: never fixed ports in tests."""


@pytest.fixture(scope="session")
def ray_head() -> Iterator["RayCluster"]:
    """The session's one ``ray start --head`` cluster: 4 CPUs, 8 logical GPUs, the dashboard (``ray job
    submit``) and Serve's HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY=1`` before ``ray start``, as the
    README says). Started on first use (10-20 s on two cores), shared by every test that needs one node."""
    from serving.ports import free_port

    from helpers.ray_cluster import RayCluster

    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1", **{name: str(free_port()) for name in HAPROXY_ENV_NAMES}}
    cluster = RayCluster.start(num_cpus=4, num_gpus=8, env=env)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def two_nodes() -> Iterator["RayCluster"]:
    """The session's two-node cluster (two ``ray start`` nodes on this machine), each one CPU and four
    logical GPUs: a trial of four GPUs fits one node only, an engine across nodes spreads."""
    from helpers.ray_cluster import RayCluster

    cluster = RayCluster.start(num_cpus=1, num_gpus=4)
    try:
        cluster.add_node(num_cpus=1, num_gpus=4)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ray_cluster(ray_head: "RayCluster") -> Iterator[dict]:
    """This test process connected (``ray.init``) to :func:`ray_head`. Yields ``{"address", "temp_dir"}``."""
    import ray

    ray.init(address=ray_head.address, log_to_driver=False)
    try:
        yield {"address": ray_head.address, "temp_dir": str(ray_head.temp_dir)}
    finally:
        ray.shutdown()


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
