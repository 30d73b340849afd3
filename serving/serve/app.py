"""The Ray Serve application that serves one tuned engine configuration.

One deployment, ``SpectuneEngine``: each replica owns one engine (its GPUs in a placement-group
bundle, the configuration's variables in its runtime_env), proves the env at start-up, and is
itself the OpenAI-compatible ingress for that engine (``serving.serve.ingress``). ``build_app``
makes the application for ``serve.run``; ``app_builder`` does the same from a Serve config file
(``import_path: serving.serve.app:app_builder``, written by ``serve_config_file``).
"""

from __future__ import annotations

from typing import Any

import yaml
from ray import serve
from ray.serve import Application

from serving.engine.config import EngineConfig
from serving.serve.options import ServeOptions
from serving.serve.provenance import Provenance
from serving.serve.replica import EngineReplica

__all__ = [
    "DEPLOYMENT_NAME",
    "INSTALL_COMMAND",
    "REPLICA_SERVE_ENV",
    "app_builder",
    "build_app",
    "deployment_options",
    "serve_config",
    "serve_config_file",
]

DEPLOYMENT_NAME = "SpectuneEngine"

INSTALL_COMMAND = "pip install -e '.[sglang]'"
"""How a node gets spectune: from its checkout, as the README's overnight section installs it;
the emitted Serve config's header says it."""

REPLICA_SERVE_ENV: dict[str, str] = {
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
}
"""Ray Serve settings read inside each replica process (delivered in its runtime_env)."""


def deployment_options(config: EngineConfig, options: ServeOptions) -> dict[str, Any]:
    """The ``serve.deployment(...).options(...)`` of the engine deployment.

    One node: every resource of a replica is in bundle 0 of its placement group, which Serve's
    replica and its children share. Across nodes: a bundle per node (``serving.engine.placement``).
    """
    gpus = options.gpus_for(config)
    cpus = options.cpus_per_replica
    bundles, strategy = [options.replica_bundle(config)], "STRICT_PACK"
    if config.nnodes > 1:  # a bundle per node; node rank 0's host, not the replica, takes bundle 0's GPUs
        placement = options.replica_placement(config)
        bundles, strategy, gpus = [dict(b) for b in placement.bundles], placement.strategy, 0
    passed_through: dict[str, Any] = (
        {"autoscaling_config": options.autoscaling_config}
        if options.autoscaling_config is not None
        else {"num_replicas": options.num_replicas or 1}
    )
    if options.max_queued_requests is not None:
        passed_through["max_queued_requests"] = options.max_queued_requests
    return {
        "name": DEPLOYMENT_NAME,
        **passed_through,
        "max_ongoing_requests": options.max_ongoing_requests,
        "health_check_period_s": options.health_check_period_s,
        "health_check_timeout_s": options.health_check_timeout_s,
        "graceful_shutdown_timeout_s": 60.0,
        "max_constructor_retry_count": 3,
        "ray_actor_options": {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "runtime_env": {"env_vars": {**REPLICA_SERVE_ENV, **config.env}},
        },
        "placement_group_bundles": bundles,
        "placement_group_strategy": strategy,
    }


def build_app(config: EngineConfig, options: ServeOptions, *, api_key_sha256: str | None = None,
              provenance: Provenance | None = None) -> Application:
    """The Serve application for ``config`` (bind only: nothing starts until ``serve.run``).

    Args:
        config: The engine configuration, exactly as measured.
        options: How to serve it.
        api_key_sha256: ``serving.serve.ingress.key_digest`` of the API key; None serves without one.
        provenance: Where the configuration came from (``GET /spectune/info``); never given to the engine.
    """
    settings = {
        "provenance": provenance.model_dump(mode="json") if provenance is not None else None,
        "replicas": options.replicas_info(),
        "log_dir": options.log_dir,  # None: each node's own temp dir (the replica decides)
        "start_timeout_s": options.engine_start_timeout_s,
        "health_check_timeout_s": options.health_check_timeout_s,
        "api_key_sha256": api_key_sha256,
        "gpus_per_replica": options.gpus_for(config),
        "cpus_per_replica": options.cpus_per_replica,
    }
    deployment = serve.deployment(EngineReplica).options(**deployment_options(config, options))
    return deployment.bind(config=config.model_dump(mode="json"), settings=settings)


def app_builder(args: dict[str, Any]) -> Application:
    """Serve's application builder: ``args`` = ``{"engine": {...}, "serve": {...}, "api_key_sha256": ...,
    "provenance": {...}}`` (the last two optional).

    Raises:
        pydantic.ValidationError: the engine configuration or the serve options are invalid.
    """
    config = EngineConfig.model_validate(args["engine"])
    options = ServeOptions.model_validate(args.get("serve") or {})
    provenance = Provenance.model_validate(args["provenance"]) if args.get("provenance") else None
    return build_app(config, options, api_key_sha256=args.get("api_key_sha256"), provenance=provenance)


def serve_config(config: EngineConfig, options: ServeOptions, *, api_key_sha256: str | None = None,
                 provenance: Provenance | None = None) -> dict[str, Any]:
    """A Serve config (the schema of ``serve deploy`` / ``serve run CONFIG``) for this application.

    The deployment's options are applied by ``app_builder`` from ``args``, so the file has one
    source of truth; the API key appears only as its SHA-256.
    """
    args: dict[str, Any] = {
        "engine": config.model_dump(mode="json"),
        "serve": options.model_dump(mode="json", exclude_defaults=True),
    }
    if api_key_sha256 is not None:
        args["api_key_sha256"] = api_key_sha256
    if provenance is not None:
        args["provenance"] = provenance.model_dump(mode="json")
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": options.host, "port": options.port},
        "applications": [
            {
                "name": options.app_name,
                "route_prefix": options.route_prefix,
                "import_path": "serving.serve.app:app_builder",
                "args": args,
            }
        ],
    }


def serve_config_file(config: EngineConfig, options: ServeOptions, *, api_key_sha256: str | None = None,
                      provenance: Provenance | None = None) -> str:
    """``serve_config`` as YAML text, with comment lines that say how to use it."""
    header = (
        "# Ray Serve config written by `spectune serve --emit-serve-config`.\n"
        "# Deploy on a running cluster:  serve deploy THIS_FILE   (or: ray job submit -- serve run THIS_FILE)\n"
        f"# The cluster's nodes need spectune installed as the README does, from its checkout ({INSTALL_COMMAND}),\n"
        "# or the checkout as the job's working dir (ray job submit --working-dir . -- serve run THIS_FILE).\n"
        "# HAProxy ingress (the faster path): start every node with RAY_SERVE_ENABLE_HA_PROXY=1 ray start ...\n"
    )
    if api_key_sha256 is not None:
        header += "# args.api_key_sha256 is the SHA-256 of the API key, not the key.\n"
    return header + yaml.safe_dump(serve_config(config, options, api_key_sha256=api_key_sha256, provenance=provenance),
                                   sort_keys=False)
