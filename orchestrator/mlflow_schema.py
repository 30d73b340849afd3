"""spectune's MLflow schema: every tag, param family and artifact name a sweep writes and
``spectune serve --mlflow-run`` reads, defined once. The writers (the coordinator, a trial, the
sweep's finish, ``spectune serve``), the reader (``orchestrator.tracking``), the tests and the
docs take the names from here, so a renamed tag cannot leave one side behind.

Runs: one **parent** run per sweep (``TAG_ROLE`` = ``ROLE_SWEEP``), one **child** run per trial
(``ROLE_TRIAL``), nested under it (MLflow's ``mlflow.parentRunId``).

=========================== ======= ========================================================= =========================
tag                         run     value                                                     read by
=========================== ======= ========================================================= =========================
``spectune.sweep``          both    the spec's ``name``                                       serve, UI search
``spectune.role``           both    ``sweep`` or ``trial``                                    serve (which run is which)
``spectune.trial_id``       trial   Ray Tune's trial id                                       resume
``spectune.results_dir``    parent  the sweep's results directory                             people
``spectune.kind``           trial   ``baseline_plain``, ``baseline_auto`` or ``search``       UI
``spectune.label``          trial   the configuration in words (SGLang's auto choice resolved) serve (provenance)
``spectune.number``         trial   1-based start order (the summary's ``#``)                 serve (provenance)
``spectune.status``         trial   ``running``, then a ``TrialStatus``                       UI, tests
``spectune.reason``         trial   a ``FAILURE_REASONS`` key, or empty                       UI
``spectune.message``        trial   what happened, in words (5000 characters at most)         UI
``spectune.early_stopped``  trial   ``true`` when ASHA stopped it (its run ends FINISHED)     UI (not a crash)
``spectune.engine_command`` trial   the engine's command line, secrets redacted               people
``spectune.start_flags``    trial   the sweep-only start flags as rendered                    people
``spectune.node_id``        trial   the Ray node the engine ran on (node rank 0's)            records of stopped trials
``spectune.engine_nodes``   trial   every node of the engine: JSON ``[{node_rank, node_id, node_ip}]`` records, UI
``spectune.cuda_visible_devices`` trial the engine's GPUs                                     records of stopped trials
``spectune.engine_pid``     trial   the engine's pid                                          people
``spectune.audit_ok``       trial   whether every process carried the trial's env            records of stopped trials
``spectune.all_reduce_kernel`` trial the kernel decode's all-reduce ran on (read, not assumed) UI
``spectune.nccl_log``       trial   what NCCL_DEBUG=INFO's log said of the NCCL variables     UI
``spectune.objective.metric`` trial the objective's metric                                   serve (provenance)
``spectune.objective.concurrency`` trial its concurrency level                               serve (provenance)
``spectune.best_trial``     parent  the number of the trial best.yaml holds                  serve (provenance)
``spectune.best_label``     parent  its label                                                 serve (provenance)
``spectune.verdict``        parent  the confirmation's verdict against SGLang's default      serve (provenance)
``spectune.verdict_ratio``  parent  its ratio (best / default), when it has one               UI
``spectune.served_at``      trial   when ``spectune serve --mlflow-run`` served it            people
``spectune.served_by``      trial   who served it (user@host)                                 people
``spectune.served_url``     trial   where                                                     people
=========================== ======= ========================================================= =========================

Params of the parent: the spec's key settings (``orchestrator.summary.sweep_params``: name,
engine, objective, budget, search dimensions). Params of a trial: ``trial_kind`` and the configuration in the sweep's names (``num_steps``,
``eagle_topk``, ``num_draft_tokens``, ``all_reduce``, ``NCCL_*``), plus ``resolved.*`` (what the
engine reported). Metrics: per repetition ``c{concurrency}.{metric}`` at step = repetition; at the
end ``final.*``, ``objective.*`` and ``time.*_s``. Artifacts: ``ENGINE_CONFIG_ARTIFACT`` (what
``spectune serve --mlflow-run`` starts), the env audit, the benchmark JSON and the engine log.
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
TAG_OBJECTIVE_METRIC = "spectune.objective.metric"
TAG_OBJECTIVE_CONCURRENCY = "spectune.objective.concurrency"
TAG_BEST_TRIAL = "spectune.best_trial"
TAG_BEST_LABEL = "spectune.best_label"
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
