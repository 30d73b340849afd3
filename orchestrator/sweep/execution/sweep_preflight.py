"""Preflight: what a sweep needs, checked in seconds before its first trial.

Each check raises :class:`PreflightError` (exit 2) naming the spec field, the value and the fix:

* :func:`check_tracking`: the MLflow server answers, or a SQLite file's directory is writable.
* :func:`check_resources`: the cluster can hold one trial's placement group (optionally waiting).
* :func:`check_network`: every NCCL network value names something that exists on every node.
* :func:`check_engine`: the engine can start where a trial's will, and what GPUs that node has.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from orchestrator.errors import SpectuneError
from orchestrator.spec import SweepSpec
from orchestrator.tracking_server import health_status
from serving.engine import nccl
from serving.engine.placement import placements_that_fit
from serving.engine.node_checks import (
    engine_problems,
    network_problems,
    plural,
    run_where_placed,
    units_that_fit,
    wait_for_fit,
)

__all__ = ["PreflightError", "check_engine", "check_network", "check_resources", "check_tracking", "node_gpu_kind"]

logger = logging.getLogger(__name__)

TRACKING_TIMEOUT_S = 5.0
"""How long an MLflow tracking server may take to answer ``/health`` before the sweep refuses it."""


class PreflightError(SpectuneError):
    """The sweep cannot run as specified on this cluster (exit 2); the message says what to change."""


# --- tracking ----------------------------------------------------------------------------------


def check_tracking(uri: str, *, timeout_s: float = TRACKING_TIMEOUT_S) -> str:
    """The MLflow store of ``uri`` can be written; returns a one-line note of what was checked.

    Raises:
        PreflightError: a tracking server that does not answer ``/health`` in ``timeout_s``, or a
            SQLite file whose directory cannot be created or written.
    """
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return _check_server(uri, timeout_s=timeout_s)
    if parts.scheme == "sqlite":
        path = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
        if path is None or not str(path):
            return f"tracking: {uri} (not checked: not a sqlite:///path URI)"
        directory = _existing_ancestor(path.parent)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PreflightError(
                f"tracking.mlflow_uri: {uri}: cannot write {path.parent} ({directory} is not writable); choose a "
                "writable results directory (--results-dir) or another tracking URI"
            )
        return f"tracking: SQLite file {path} (directory writable)"
    return f"tracking: {uri} (not checked: {parts.scheme or 'a path'} store)"


def _check_server(uri: str, *, timeout_s: float) -> str:
    health = uri.rstrip("/") + "/health"
    fix = ("start it (mlflow server --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000), fix the "
           "URI, or leave tracking.mlflow_uri unset for a SQLite file in the results directory")
    try:
        status = health_status(uri, timeout_s=timeout_s)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PreflightError(
            f"tracking.mlflow_uri: {uri} does not answer ({reason}; waited at most {timeout_s:g} s); {fix}"
        ) from None
    if status >= 500:
        raise PreflightError(f"tracking.mlflow_uri: {uri} answered {health} with HTTP {status}; {fix}")
    return f"tracking: MLflow server {uri} answers (HTTP {status})"


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# --- resources ---------------------------------------------------------------------------------


def _fits(node: dict[str, float], bundles: Sequence[dict[str, float]]) -> bool:
    need: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            need[name] = need.get(name, 0.0) + amount
    return units_that_fit([node], need) >= 1


def _shortfall(spec: SweepSpec, nodes: list[dict[str, float]]) -> str:
    gpus, cpus = spec.gpus_per_trial, spec.resources.cpus_per_trial
    total_gpus = sum(n.get("GPU", 0.0) for n in nodes)
    total_cpus = sum(n.get("CPU", 0.0) for n in nodes)
    largest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
    where = "resources.gpus_per_trial" if spec.resources.gpus_per_trial is not None else "engine.tp_size"
    nnodes = spec.engine.nnodes
    if nnodes > 1:
        placement = spec.trial_placement
        return (
            f"resources: one engine spans engine.nnodes={nnodes} nodes, each its own, with "
            f"{plural(placement.gpus_per_node, 'GPU')} per node ({where} / nnodes) and "
            f"{plural(cpus, 'CPU')} (resources.cpus_per_trial) on the first, but the cluster has "
            f"{plural(sum(1 for n in nodes if _fits(n, [placement.bundles[-1]])), 'node')} with "
            f"{plural(placement.gpus_per_node, 'GPU')} free of {plural(len(nodes), 'node')}"
        )
    return (
        f"resources: the spec asks for {plural(gpus, 'GPU')} per trial ({where}) and {plural(cpus, 'CPU')} "
        f"(resources.cpus_per_trial) on one node, but the cluster has {plural(total_gpus, 'GPU')} and "
        f"{plural(total_cpus, 'CPU')} in {plural(len(nodes), 'node')} (the largest node: "
        f"{plural(largest.get('GPU', 0.0), 'GPU')}, {plural(largest.get('CPU', 0.0), 'CPU')})"
    )


def check_resources(spec: SweepSpec, *, wait_s: float = 0.0, say: Callable[[str], None],
                    poll_s: float = 2.0) -> str:
    """One node of the connected Ray cluster can hold a trial; returns a note.

    Args:
        wait_s: Keep looking this long (nodes joining, an autoscaler adding them), saying every
            ``PROGRESS_EVERY_S`` what is missing; 0 decides at once.
        say: Where the waiting lines go (the job log).

    Raises:
        PreflightError: no node fits (after ``wait_s``).
    """
    placement = spec.trial_placement
    fits, nodes, waited = wait_for_fit(lambda seen: placements_that_fit(seen, placement) >= 1, wait_s=wait_s,
                                       say=say, describe=lambda seen: _shortfall(spec, seen), poll_s=poll_s)
    if fits:
        if placement.nnodes > 1:
            return f"resources: {placement.nnodes} nodes hold a trial's engine ({placement.describe()})"
        return f"resources: a node holds a trial ({plural(spec.gpus_per_trial, 'GPU')}, " \
               f"{plural(spec.resources.cpus_per_trial, 'CPU')})"
    hint = (f"gave up after waiting {waited:.0f} s (--wait-for-resources {wait_s:g})" if wait_s else
            "add a node that has them, lower the spec's needs, or pass --wait-for-resources SECONDS on an "
            "autoscaling cluster")
    raise PreflightError(f"{_shortfall(spec, nodes)}; {hint}")


# --- NCCL's network variables, on every node --------------------------------------------------


def check_network(spec: SweepSpec) -> str | None:
    """Every node-checked NCCL value the spec may set (``engine.env`` and the search), and each node's
    own, names something on every node that can run an engine rank; returns a note, or None when
    the spec sets none and its engine stays on one node (nothing then crosses a network).

    Raises:
        PreflightError: one line per value and node where it cannot work.
    """
    fixed = [(f"engine.env.{name}", name, value) for name, value in spec.engine.env.items()
             if name in nccl.NODE_CHECKED_VARIABLES]
    searched = [(field, name, value) for field, name, value in spec.search.nccl_settings()
                if value is not None and name in nccl.NODE_CHECKED_VARIABLES]
    if not fixed and not searched and spec.engine.nnodes == 1:
        return None
    note, problems = network_problems([*fixed, *searched], env=spec.engine.env, placement=spec.trial_placement)
    if problems:
        raise PreflightError("\n".join(problems))
    return note


# --- the engine, where it will run ------------------------------------------------------------


def _local_architecture(model_path: str) -> str | None:
    """``architectures[0]`` of a local model directory's config.json (what SGLang reads), else None."""
    import json

    config = Path(model_path).expanduser() / "config.json"
    try:
        names = json.loads(config.read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None
    return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None


def _engine_and_node(**kwargs: Any) -> dict[str, Any]:
    """Runs on the engine's node: ``engine_problems``, the node's GPUs and a local model's architecture."""
    from serving.engine.gpu_topology import read_node_gpus

    found = engine_problems(**kwargs)
    gpus = read_node_gpus()
    found["gpus"] = None if gpus is None else {"kind": gpus.kind, "detail": gpus.detail}
    found["architecture"] = _local_architecture(kwargs["model_path"]) if kwargs["kind"] == "sglang" else None
    return found


def node_gpu_kind(spec: SweepSpec, gpus: dict[str, str] | None, *, node: str) -> tuple[str | None, str]:
    """The node kind the sweep plans its all-reduce arms for, and a note saying where it came from.

    SGLang: what ``nvidia-smi`` reports on the engine's node. The reference engine: the spec's
    kind, or on ``auto`` ``cpu`` without a GPU, else the GPU's sm with PCIe.

    Raises:
        PreflightError: ``engine.gpu_kind`` names another node than the one found.
    """
    declared = spec.engine.gpu_kind
    if spec.engine.kind == "reference":
        if declared != "auto":
            return declared, f"all-reduce: the reference engine follows SGLang's rule for {declared} (engine.gpu_kind)"
        found = "cpu" if gpus is None else gpus["kind"].replace("-nvlink", "-pcie")
        return found, f"all-reduce: the reference engine on node {node} follows SGLang's rule for {found}"
    if gpus is None:
        if declared != "auto":
            return declared, (f"all-reduce: nvidia-smi gave no GPUs on node {node}; planning for {declared} "
                              "(engine.gpu_kind) as declared")
        return None, (f"all-reduce: nvidia-smi gave no GPUs on node {node}: the arms' kernels are not known before "
                      "the first trial, every arm is measured (each trial records what its engine ran)")
    if declared not in ("auto", gpus["kind"]):
        raise PreflightError(
            f"engine.gpu_kind: the spec is written for {declared}, but node {node} is {gpus['kind']} ({gpus['detail']}); "
            f"its all-reduce arms and NCCL dimensions were planned for another node: set engine.gpu_kind: "
            f"{gpus['kind']} (or auto), or run it on a {declared} node")
    return gpus["kind"], f"all-reduce: node {node} is {gpus['kind']} ({gpus['detail']})"


def check_engine(spec: SweepSpec, *, wait_s: float = 0.0,
                 say: Callable[[str], None]) -> tuple[list[str], dict[str, str | None]]:
    """The engine can start where a trial's engine will run; returns notes (hub ids, the node) and
    what the all-reduce arms are planned with: ``gpu_kind`` (``node_gpu_kind``; None: not known) and
    the ``architecture`` read from a local model's config.json (None: the spec's own, or unknown).
    The check runs as a task in a placement group shaped like a trial's.

    Raises:
        PreflightError: every problem found, one per line.
    """
    placement = spec.trial_placement
    try:
        found = run_where_placed(  # node rank 0's node: its GPUs decide the arms
            _engine_and_node, bundles=list(placement.bundles), bundle_index=placement.host_bundles[0],
            strategy=placement.strategy, wait_s=wait_s,
            say=say, what="one trial's", kind=spec.engine.kind, model_path=spec.engine.model_path,
            draft_path=spec.engine.draft_model_path if spec.engine.speculative_algorithm else None,
            env=dict(spec.engine.env),
        )
    except TimeoutError as exc:
        raise PreflightError(str(exc)) from None
    if found["problems"]:
        raise PreflightError("\n".join(found["problems"]))
    kind, kind_note = node_gpu_kind(spec, found.get("gpus"), node=found["node"])
    notes = [*found["notes"], f"engine: {spec.engine.kind} can start on node {found['node']}", kind_note]
    architecture = found.get("architecture")
    if architecture and spec.engine.architecture and architecture != spec.engine.architecture:
        raise PreflightError(f"engine.architecture: {spec.engine.architecture} is set, but {spec.engine.model_path}/"
                             f"config.json on node {found['node']} says {architecture}; fix engine.architecture (or "
                             "remove it: the preflight reads it from a local model)")
    if architecture and not spec.engine.architecture:
        notes.append(f"engine.architecture: {architecture} (from {spec.engine.model_path}/config.json)")
    return notes, {"gpu_kind": kind, "architecture": None if spec.engine.architecture else architecture}
