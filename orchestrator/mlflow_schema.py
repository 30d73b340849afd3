"""spectune's MLflow schema: every tag, param family and artifact name a sweep writes and
``spectune serve --mlflow-run`` reads, defined once.

One parent run per sweep (``TAG_ROLE`` = ``ROLE_SWEEP``), one nested child run per trial
(``ROLE_TRIAL``). The tag table (which run carries each tag, and who reads it) and the params,
metrics and artifacts are in docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

__all__ = [
    "engine_nodes_from_tag",
    "engine_nodes_tag",
    "ENGINE_CONFIG_ARTIFACT",
    "ROLE_SWEEP",
    "ROLE_TRIAL",
    "TAG_ALL_REDUCE_KERNEL",
    "TAG_AUDIT_OK",
    "TAG_BLIND_READERS",
    "TAG_STOPPED",
    "TAG_VALUE_CHARS",
    "tag_value",
    "TAG_BEST_LABEL",
    "TAG_BEST_TRIAL",
    "TAG_CUDA_VISIBLE_DEVICES",
    "TAG_EARLY_STOPPED",
    "TAG_ENGINE_COMMAND",
    "TAG_ENGINE_NODES",
    "TAG_ENGINE_PID",
    "TAG_KIND",
    "TAG_LABEL",
    "TAG_MESSAGE",
    "TAG_NCCL_LOG",
    "TAG_NODE_ID",
    "TAG_NUMBER",
    "TAG_OBJECTIVE_CONCURRENCY",
    "TAG_OBJECTIVE_METRIC",
    "TAG_REASON",
    "TAG_RESULTS_DIR",
    "TAG_ROLE",
    "TAG_SERVED_AT",
    "TAG_SERVED_BY",
    "TAG_SERVED_URL",
    "TAG_START_FLAGS",
    "TAG_STATUS",
    "TAG_SWEEP",
    "TAG_TRIAL_ID",
    "TAG_VERDICT",
    "TAG_VERDICT_RATIO",
]

ENGINE_CONFIG_ARTIFACT = "engine_config.yaml"

ROLE_SWEEP = "sweep"
ROLE_TRIAL = "trial"

TAG_SWEEP = "spectune.sweep"
TAG_ROLE = "spectune.role"
TAG_TRIAL_ID = "spectune.trial_id"
TAG_RESULTS_DIR = "spectune.results_dir"
TAG_KIND = "spectune.kind"
TAG_LABEL = "spectune.label"
TAG_NUMBER = "spectune.number"
TAG_STATUS = "spectune.status"
TAG_REASON = "spectune.reason"
TAG_MESSAGE = "spectune.message"
TAG_EARLY_STOPPED = "spectune.early_stopped"
TAG_ENGINE_COMMAND = "spectune.engine_command"
TAG_START_FLAGS = "spectune.start_flags"
TAG_NODE_ID = "spectune.node_id"
TAG_ENGINE_NODES = "spectune.engine_nodes"
"""Every node the trial's engine ran on, by node rank: a JSON list of ``{node_rank, node_id, node_ip}``
(``spectune.node_id`` is node rank 0's)."""
TAG_CUDA_VISIBLE_DEVICES = "spectune.cuda_visible_devices"
TAG_ENGINE_PID = "spectune.engine_pid"
TAG_AUDIT_OK = "spectune.audit_ok"
TAG_ALL_REDUCE_KERNEL = "spectune.all_reduce_kernel"
TAG_NCCL_LOG = "spectune.nccl_log"
TAG_BLIND_READERS = "spectune.blind_readers"
"""On a trial's run (and the sweep's): what its engine did not answer that a blind reader uses
(``TrialRecord.blind_readers``), ``; ``-joined; absent where nothing was missing."""
TAG_OBJECTIVE_METRIC = "spectune.objective.metric"
TAG_OBJECTIVE_CONCURRENCY = "spectune.objective.concurrency"
TAG_BEST_TRIAL = "spectune.best_trial"
TAG_BEST_LABEL = "spectune.best_label"
TAG_VALUE_CHARS = 5000
"""The most characters spectune writes into one tag value (MLflow refuses longer ones)."""


def tag_value(text: str) -> str:
    """``text`` cut to :data:`TAG_VALUE_CHARS` (a message, a diagnosis, a joined list)."""
    return text[:TAG_VALUE_CHARS]


TAG_STOPPED = "spectune.stopped"
"""On the sweep's run: why the search stopped early (``night_stop``'s diagnosis); absent otherwise."""
TAG_VERDICT = "spectune.verdict"
TAG_VERDICT_RATIO = "spectune.verdict_ratio"
TAG_SERVED_AT = "spectune.served_at"
TAG_SERVED_BY = "spectune.served_by"
TAG_SERVED_URL = "spectune.served_url"

ENGINE_NODE_KEYS = ("node_rank", "node_id", "node_ip")


def engine_nodes_tag(nodes: Iterable[Mapping[str, Any]]) -> str:
    """``TAG_ENGINE_NODES``' value: the nodes as JSON, by node rank (pids and GPUs are the record's)."""
    return json.dumps([{key: node.get(key) for key in ENGINE_NODE_KEYS} for node in nodes])


def engine_nodes_from_tag(value: str | None) -> list[dict[str, Any]]:
    """The inverse of :func:`engine_nodes_tag`; empty for a run without the tag (or a garbled one)."""
    if not value:
        return []
    try:
        nodes = json.loads(value)
    except ValueError:
        return []
    return [dict(n) for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
