"""``spectune serve``: serve one configuration with Ray Serve, or write its Serve config file.

The configuration is a file (a sweep's best.yaml) or the one recorded on an MLflow run
(``--mlflow-run``: a trial's ``engine_config.yaml`` or a sweep's ``best.yaml``). Once the endpoint
is ready, a configuration with provenance gets its trial's MLflow run tagged as served
(``spectune.served_at``, ``spectune.served_by``), through ``orchestrator.tracking``; a tracking
store that does not answer is a warning, never a failed serve.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import BaseModel, ValidationError
from rich.markup import escape

from orchestrator.mlflow_schema import TAG_SERVED_AT, TAG_SERVED_BY, TAG_SERVED_URL
from orchestrator.cli.console import stderr_console
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from orchestrator.validation import validation_problems
from serving.serve.ingress import key_digest
from orchestrator.timestamps import utc_timestamp
from serving.serve.options import API_KEY_ENV, ServeConfigError, ServedConfig, parse_served, read_served
from serving.serve.provenance import Provenance

__all__ = ["serve"]

logger = logging.getLogger(__name__)


def serve(
    config: Annotated[
        Optional[Path], typer.Argument(help="An engine config YAML: a sweep's best.yaml, optionally with a serve: "
                                       "block (or --mlflow-run instead).", show_default=False)
    ] = None,
    host: Annotated[Optional[str], typer.Option(help="Address to bind (default 127.0.0.1; 0.0.0.0 exposes it).")] = None,
    port: Annotated[Optional[int], typer.Option(help="HTTP port of the endpoint (default 8000).")] = None,
    num_replicas: Annotated[
        Optional[int], typer.Option("--num-replicas", help="Replicas, each with its own engine and GPUs.")
    ] = None,
    autoscaling_config: Annotated[
        Optional[str], typer.Option("--autoscaling-config", help="Ray Serve autoscaling_config as JSON, passed through.")
    ] = None,
    gpus_per_replica: Annotated[
        Optional[int], typer.Option("--gpus-per-replica", help="GPUs per replica (default: tp_size for SGLang, 0 for the reference engine).")
    ] = None,
    ingress: Annotated[
        Optional[str], typer.Option(help="haproxy (default, faster) or proxy; only when spectune starts Ray itself.")
    ] = None,
    api_key: Annotated[
        Optional[str], typer.Option("--api-key", help="Require this key from clients (default: $SPECTUNE_API_KEY; none if unset).",
                                    show_default=False)
    ] = None,
    address: Annotated[
        Optional[str], typer.Option("--address", help="Join this Ray cluster (default: start a local one).")
    ] = None,
    app_name: Annotated[Optional[str], typer.Option("--app-name", help="Serve application name (default spectune).")] = None,
    route_prefix: Annotated[Optional[str], typer.Option("--route-prefix", help="Mount path (default /).")] = None,
    mlflow_run: Annotated[
        Optional[str], typer.Option("--mlflow-run", help="Serve the configuration recorded on this MLflow run: a "
                                    "trial's run or a sweep's (its best.yaml).", show_default=False)
    ] = None,
    tracking_uri: Annotated[
        Optional[str], typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                    help="MLflow tracking URI of --mlflow-run (default: $MLFLOW_TRACKING_URI).",
                                    show_default=False)
    ] = None,
    wait_for_resources: Annotated[
        float, typer.Option("--wait-for-resources", min=0, max=30 * 24 * 3600, metavar="SECONDS",
                            help="If the cluster cannot hold the replicas yet (an autoscaling cluster, nodes still "
                            "joining), wait this long, saying every 30 s what is missing; default 0: exit 2 at once."),
    ] = 0.0,
    emit_serve_config: Annotated[
        Optional[Path], typer.Option("--emit-serve-config", help="Write a Serve config file (serve deploy / ray job "
                                     "submit) instead of serving.", show_default=False)
    ] = None,
) -> None:
    """Serve a configuration with Ray Serve behind an OpenAI-compatible endpoint (until Ctrl-C).

    Exit 0 after a clean stop (or with the file written), 1 if the application failed to start
    (e.g. an engine failed its env audit), 2 for an invalid config or option, or one that cannot
    run here (preflight: no node for a replica's GPUs, a missing model path, an unknown preset).
    """
    err = stderr_console()
    overrides: dict = {"host": host, "port": port, "num_replicas": num_replicas, "gpus_per_replica": gpus_per_replica,
                       "ingress": ingress, "app_name": app_name, "route_prefix": route_prefix}
    if autoscaling_config is not None:
        try:
            overrides["autoscaling_config"] = json.loads(autoscaling_config)
        except ValueError as exc:
            err.print(f"--autoscaling-config: not valid JSON ({escape(str(exc))})")
            raise typer.Exit(EXIT_BAD_INPUT) from None
    given = {k: v for k, v in overrides.items() if v is not None}
    if (config is None) == (mlflow_run is None):
        err.print("give a config file or --mlflow-run RUN_ID (one of them): e.g. spectune serve results/best.yaml")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        served = read_served(config, overrides=given, explain=_explain) if config is not None else _from_run(
            mlflow_run, tracking_uri=tracking_uri, overrides=given)
    except _RunError as exc:
        err.print(f"[bold red]cannot serve the run[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except ServeConfigError as exc:
        err.print(f"[bold red]invalid serve config[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    engine_config, options, provenance = served
    key = api_key or API_KEY_ENV.get() or None
    # imported here: Ray and Ray Serve take seconds to import
    if emit_serve_config is not None:
        from serving.serve.app import serve_config_file

        emit_serve_config.write_text(
            serve_config_file(engine_config, options, api_key_sha256=key_digest(key) if key else None,
                              provenance=provenance), encoding="utf-8"
        )
        typer.echo(f"wrote {emit_serve_config}: serve deploy {emit_serve_config}")
        return
    from serving.serve.runner import Readiness, ServePreflightError, ServeStartError, run_foreground

    def on_ready(ready: Readiness) -> None:
        typer.echo(ready.line())
        if ready.note():
            typer.echo(ready.note())
        if provenance is not None:
            _tag_served(provenance, served_by=f"{socket.gethostname()}:{options.port}", url=ready.url)

    try:
        run_foreground(engine_config, options, api_key=key, address=address, on_ready=on_ready, provenance=provenance,
                       wait_for_resources_s=wait_for_resources)
    except ServePreflightError as exc:
        err.print("[bold red]cannot serve[/] (nothing was deployed):")
        for line in str(exc).splitlines():
            err.print(f"  - {escape(line)}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except ServeStartError as exc:
        err.print(f"[bold red]serve failed[/]: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None


def _explain(exc: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """A hand-edited best.yaml's problems as the spec checker words them (``serving.serve.options.Explain``)."""
    return [(problem.field, problem.message) for problem in validation_problems(exc, model=model)]


class _RunError(ServeConfigError):
    """``--mlflow-run``: the run's configuration cannot be had (the message says why and what to do)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _from_run(run_id: str, *, tracking_uri: str | None, overrides: dict) -> ServedConfig:
    """The configuration recorded on ``run_id`` with provenance built from the run.

    Raises:
        ServeConfigError: no tracking URI, the store unreachable, the run not found, no config on
            it, or the recorded config invalid.
    """
    if not tracking_uri:
        raise _RunError(f"--mlflow-run {run_id}: no tracking URI; give --tracking-uri (e.g. "
                        "sqlite:///results/mlflow.db, the URI the sweep printed) or set MLFLOW_TRACKING_URI")
    from orchestrator.tracking import RunConfigError, recorded_config  # imports mlflow (seconds)

    try:
        recorded = recorded_config(tracking_uri=tracking_uri, run_id=run_id)
    except RunConfigError as exc:
        raise _RunError(f"--mlflow-run: {exc}") from None
    engine, options, _ = parse_served(recorded.text, source=recorded.source, overrides=overrides, explain=_explain)
    try:
        provenance = Provenance.model_validate(recorded.provenance)
    except ValueError as exc:
        raise _RunError(f"--mlflow-run {run_id}: the provenance recorded on the run at {tracking_uri} is invalid: "
                        f"{exc}") from None
    return ServedConfig(engine, options, provenance)


def _tag_served(provenance: Provenance, *, served_by: str, url: str) -> None:
    """Tag the trial's MLflow run as served; a store that does not answer is a warning."""
    run_id, uri = provenance.mlflow_run_id, provenance.tracking_uri
    if not run_id or not uri:
        return
    from orchestrator.tracking import RunConfigError, tag_served  # imports mlflow (seconds)

    try:
        tag_served(tracking_uri=uri, run_id=run_id, tags={TAG_SERVED_AT: utc_timestamp(),
                                                          TAG_SERVED_BY: served_by, TAG_SERVED_URL: url})
    except RunConfigError as exc:
        logger.warning("not tagging the run as served: %s", exc)
    except Exception as exc:  # noqa: BLE001 - any refusal of the store: the endpoint serves regardless
        logger.warning("not tagging MLflow run %s at %s as served: %s: %s", run_id, uri, type(exc).__name__, exc)
    else:
        logger.info("MLflow run %s at %s tagged spectune.served_by=%s", run_id, uri, served_by)
