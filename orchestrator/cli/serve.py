"""``spectune serve``: serve one configuration with Ray Serve, or write its Serve config file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchestrator.cli.console import stderr_console
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from serving.serve.ingress import key_digest
from serving.serve.options import API_KEY_ENV, ServeConfigError, load_serve_file

__all__ = ["serve"]


def serve(
    config: Annotated[
        Path, typer.Argument(help="An engine config YAML: a sweep's best.yaml, optionally with a serve: block.",
                             show_default=False)
    ],
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
    emit_serve_config: Annotated[
        Optional[Path], typer.Option("--emit-serve-config", help="Write a Serve config file (serve deploy / ray job "
                                     "submit) instead of serving.", show_default=False)
    ] = None,
) -> None:
    """Serve a configuration with Ray Serve behind an OpenAI-compatible endpoint (until Ctrl-C).

    Exit 0 after a clean stop (or with the file written), 1 if the application failed to start
    (e.g. an engine failed its env audit), 2 for an invalid config or option.
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
    try:
        engine_config, options = load_serve_file(config, overrides={k: v for k, v in overrides.items() if v is not None})
    except ServeConfigError as exc:
        err.print(f"[bold red]invalid serve config[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    key = api_key or API_KEY_ENV.get() or None
    # The two imports below are here, not at the top: they import Ray and Ray Serve (seconds),
    # which `spectune --help` and every other command do without.
    if emit_serve_config is not None:
        from serving.serve.app import serve_config_file

        emit_serve_config.write_text(
            serve_config_file(engine_config, options, api_key_sha256=key_digest(key) if key else None), encoding="utf-8"
        )
        typer.echo(f"wrote {emit_serve_config}: serve deploy {emit_serve_config}")
        return
    from serving.serve.runner import ServeStartError, run_foreground

    try:
        run_foreground(engine_config, options, api_key=key, address=address,
                       on_ready=lambda ready: typer.echo(ready.line()))
    except ServeStartError as exc:
        err.print(f"[bold red]serve failed[/]: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None
