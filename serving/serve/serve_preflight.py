"""``spectune serve``'s preflight: what the application needs, checked in seconds before it is deployed.

Each check raises :class:`ServePreflightError` (the CLI exits 2) naming the field, the value and
the fix: **engine** (it can start where a replica will run it: here for a local cluster, in a Ray
task placed like a replica on a joined one), **resources** (the nodes hold the replicas Serve
starts with, optionally waiting for them) and **network** (NCCL's node-checked variables name
something on every node that can run a replica's engine rank).
"""

from __future__ import annotations

from typing import Any, Callable

from serving.engine import nccl
from serving.engine.config import EngineConfig
from serving.engine.placement import placements_that_fit
from serving.engine.node_checks import (
    alive_nodes,
    engine_problems,
    network_problems,
    plural,
    run_where_placed,
    units_that_fit,
    wait_for_fit,
)
from serving.errors import SpectuneError
from serving.serve.options import ServeOptions

__all__ = ["ServePreflightError", "check_engine_on_cluster", "check_engine_here",
           "check_network", "check_resources", "shortfall"]

SERVE_FIELDS = {"kind": "kind", "model": "model_path", "draft": "speculative_draft_model_path"}
"""The engine fields of a best.yaml, as the messages name them."""


class ServePreflightError(SpectuneError):
    """The configuration cannot be served on this cluster (exit 2); the message says what to change."""


def _draft(config: EngineConfig) -> str | None:
    return config.speculative_draft_model_path if config.speculative_algorithm else None


def _verdict(found: dict[str, Any], config: EngineConfig) -> list[str]:
    if found["problems"]:
        raise ServePreflightError("\n".join(found["problems"]))
    return [*found["notes"], f"engine: {config.kind} can start on node {found['node']}"]


def check_engine_here(config: EngineConfig) -> list[str]:
    """The engine can start on this machine (a local cluster's only node); returns notes.

    Raises:
        ServePreflightError: every problem found, one per line.
    """
    return _verdict(engine_problems(kind=config.kind, model_path=config.model_path, draft_path=_draft(config),
                                    fields=SERVE_FIELDS, env=dict(config.env)), config)


def check_engine_on_cluster(config: EngineConfig, options: ServeOptions, *, wait_s: float = 0.0,
                            say: Callable[[str], None]) -> list[str]:
    """The engine can start where a replica will run (a Ray task in a placement group shaped like one
    replica's); returns notes.

    Raises:
        ServePreflightError: every problem found, one per line, or no node freed a replica's
            resources in time.
    """
    try:
        bundles, strategy = [options.replica_bundle(config)], "STRICT_PACK"
        if config.nnodes > 1:  # node rank 0's bundle of a replica spread over nodes
            placement = options.replica_placement(config)
            bundles, strategy = [dict(b) for b in placement.bundles], placement.strategy
        found = run_where_placed(
            engine_problems, bundles=bundles, bundle_index=0, strategy=strategy,
            wait_s=wait_s, say=say, what="one replica's", kind=config.kind,
            model_path=config.model_path, draft_path=_draft(config), fields=SERVE_FIELDS, env=dict(config.env),
        )
    except TimeoutError as exc:
        raise ServePreflightError(str(exc)) from None
    return _verdict(found, config)


def shortfall(config: EngineConfig, options: ServeOptions, nodes: list[dict[str, float]]) -> str:
    """What the replicas need and what the cluster has, in one sentence."""
    if config.nnodes > 1:
        placement = options.replica_placement(config)
        return (
            f"resources: each replica's engine spans nnodes={config.nnodes} nodes, each its own, with "
            f"{plural(placement.gpus_per_node, 'GPU')} per node and {plural(options.cpus_per_replica, 'CPU')} "
            f"(serve.cpus_per_replica) on the first, x {plural(options.replicas_at_start(), 'replica')}, but the "
            f"cluster's {plural(len(nodes), 'node')} hold {plural(placements_that_fit(nodes, placement, most=99), 'replica')}"
        )
    bundle = options.replica_bundle(config)
    gpus, cpus, replicas = bundle.get("GPU", 0.0), bundle["CPU"], options.replicas_at_start()
    gpu_field = ("serve.gpus_per_replica" if options.gpus_per_replica is not None
                 else "tp_size" if config.kind == "sglang" else "the reference engine's default")
    replica_field = ("serve.autoscaling_config" if options.autoscaling_config is not None
                     else "serve.num_replicas" if options.num_replicas is not None else "the default")
    largest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
    return (
        f"resources: each replica needs {plural(gpus, 'GPU')} ({gpu_field}) and {plural(cpus, 'CPU')} "
        f"(serve.cpus_per_replica) on one node, x {plural(replicas, 'replica')} ({replica_field}), but the cluster "
        f"has {plural(sum(n.get('GPU', 0.0) for n in nodes), 'GPU')} and "
        f"{plural(sum(n.get('CPU', 0.0) for n in nodes), 'CPU')} in {plural(len(nodes), 'node')} (the largest "
        f"node: {plural(largest.get('GPU', 0.0), 'GPU')}, {plural(largest.get('CPU', 0.0), 'CPU')}), room for "
        f"{plural(units_that_fit(nodes, bundle), 'replica')}"
    )


def check_resources(config: EngineConfig, options: ServeOptions, *, wait_s: float = 0.0,
                    say: Callable[[str], None], poll_s: float = 2.0,
                    nodes: Callable[[], list[dict[str, float]]] = alive_nodes) -> str:
    """The connected cluster's nodes can hold the replicas Serve starts with; returns a note.

    Args:
        wait_s: Keep looking this long, saying every 30 s what is missing; 0 decides at once.
        say: Where the waiting lines go.
        nodes: The cluster's nodes (a test passes its own).

    Raises:
        ServePreflightError: they do not (after ``wait_s``).
    """
    bundle, replicas = options.replica_bundle(config), options.replicas_at_start()
    if config.nnodes > 1:
        placement = options.replica_placement(config)
        fits, seen, waited = wait_for_fit(lambda now: placements_that_fit(now, placement, most=replicas) >= replicas,
                                          wait_s=wait_s, say=say, describe=lambda now: shortfall(config, options, now),
                                          poll_s=poll_s, nodes=nodes)
    else:
        fits, seen, waited = wait_for_fit(lambda now: units_that_fit(now, bundle) >= replicas, wait_s=wait_s, say=say,
                                          describe=lambda now: shortfall(config, options, now), poll_s=poll_s,
                                          nodes=nodes)
    if fits and config.nnodes > 1:
        return (f"resources: the cluster holds {plural(replicas, 'replica')} of {config.nnodes} nodes each "
                f"({options.replica_placement(config).describe()})")
    if fits:
        return (f"resources: the cluster holds {plural(replicas, 'replica')} of {plural(bundle.get('GPU', 0.0), 'GPU')}"
                f" and {plural(bundle['CPU'], 'CPU')} each")
    hint = (f"gave up after waiting {waited:.0f} s (--wait-for-resources {wait_s:g})" if wait_s else
            "run it where a node has them, lower --gpus-per-replica / --num-replicas (an SGLang engine needs "
            "tp_size GPUs), or pass --wait-for-resources SECONDS on an autoscaling cluster")
    raise ServePreflightError(f"{shortfall(config, options, seen)}; {hint}")


def check_network(config: EngineConfig, options: ServeOptions) -> str | None:
    """NCCL's node-checked variables in ``env``, and each node's own, hold on every node that can run
    a replica's engine rank; returns a note, or None when there is nothing to check.

    Raises:
        ServePreflightError: one line per value and node where it cannot work.
    """
    settings = [(f"env.{name}", name, value) for name, value in config.env.items()
                if name in nccl.NODE_CHECKED_VARIABLES]
    if not settings and config.nnodes == 1:
        return None
    note, problems = network_problems(settings, env=config.env, placement=options.replica_placement(config))
    if problems:
        raise ServePreflightError("\n".join(problems))
    return note
