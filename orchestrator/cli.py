"""The ``spectune`` command line: parse, configure logging, call one function per command.

Exit codes: 0 success, 1 the command ran and failed (e.g. an audit found a mismatch), 2 bad input
(an invalid spec, a bad option), 3 a command that this version does not implement yet.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from orchestrator.bench import commands as bench_commands
from orchestrator.errors import SpecError, SpectuneError
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from orchestrator.space import candidate_from_settings
from orchestrator.spec import SweepSpec
from orchestrator.summary import describe_spec
from orchestrator.validation import validation_problems
from serving.engine.audit import audit_process_tree
from serving.engine.command import build_command
from serving.engine.config import EngineConfig
from serving.engine.nccl import danger_of
from serving.redaction import REDACTED, is_secret, redacted_env

__all__ = ["app", "main"]


app = typer.Typer(
    name="spectune",
    help="Find the fastest SGLang speculative-decoding + NCCL configuration, prove it is applied, serve it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SpecPath = Annotated[Path, typer.Argument(help="Sweep spec YAML (see experiments/).", show_default=False)]


def _configure_logging(verbose: bool) -> None:
    """Send spectune's own records (loggers ``orchestrator.*``, ``serving.*``) to stderr.

    Only the CLI configures logging; records do not propagate to the root logger, so a host
    application's (or Ray's) handlers don't print them twice.
    """
    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False, markup=False)
    for name in ("orchestrator", "serving"):
        module_logger = logging.getLogger(name)
        module_logger.handlers[:] = [handler]
        module_logger.setLevel(logging.DEBUG if verbose else logging.INFO)
        module_logger.propagate = False


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    _configure_logging(verbose)


MAX_SHOWN_PROBLEMS = 100
"""The most problems of one spec printed; a generated file can have thousands, and the first
hundred say what is wrong (the rest are counted)."""


def _load_spec(path: Path) -> SweepSpec:
    """Load a spec or exit 2 with its problems listed (the first ``MAX_SHOWN_PROBLEMS``)."""
    try:
        return SweepSpec.from_yaml(path)
    except SpecError as exc:
        err = Console(stderr=True)
        err.print(f"[bold red]invalid spec[/] {escape(str(path))}:", highlight=False)
        for problem in exc.problems[:MAX_SHOWN_PROBLEMS]:
            # field names and messages quote the user's YAML: never let it be read as markup
            where = f"[bold]{escape(problem.field)}[/]: " if problem.field else ""
            err.print(f"  - {where}{escape(problem.message)}", highlight=False, soft_wrap=True)
        hidden = len(exc.problems) - MAX_SHOWN_PROBLEMS
        if hidden > 0:
            err.print(f"  ... and {hidden} more problem{'s' if hidden != 1 else ''}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None


@app.command()
def validate(
    spec: SpecPath,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Check a sweep spec and summarise its search space. Exit 0 if valid, 2 with the problems."""
    sweep_spec = _load_spec(spec)
    summary = describe_spec(sweep_spec)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    console.print(f"[bold green]valid[/] {escape(str(spec))}: sweep [bold]{sweep_spec.name}[/]", highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("dimension")
    table.add_column("values")
    table.add_column("count", justify="right")
    for dim in summary["dimensions"]:
        table.add_row(dim["name"], dim["values"], str(dim["count"]))
    console.print(table)
    console.print(f"valid configurations: [bold]{summary['valid_configurations']}[/]", highlight=False)
    for key in ("engine", "objective", "benchmark", "confirmation", "budget", "tracking"):
        console.print(f"{key:<12} {summary['text'][key]}", highlight=False, soft_wrap=True, markup=False)
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning[/] {escape(warning)}", highlight=False, soft_wrap=True)


@app.command()
def sweep(
    spec: Annotated[
        Optional[Path], typer.Argument(help="Sweep spec YAML (see experiments/); omit with --resume.", show_default=False)
    ] = None,
    results_dir: Annotated[
        Optional[str],
        typer.Option("--results-dir", help="Where results go (default: the spec's results_dir; under `ray job submit "
                     "--working-dir` a relative one goes to ~/spectune-results, see the README)."),
    ] = None,
    resume: Annotated[
        Optional[Path],
        typer.Option("--resume", help="Finish the interrupted sweep in this results directory (its spec.yaml is used)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the baselines and first trials with their exact engine commands and "
                           "env; no Ray, no GPUs, nothing started."),
    ] = False,
    first: Annotated[int, typer.Option("--first", min=0, max=100, help="Proposed trials shown by --dry-run.")] = 3,
    address: Annotated[
        Optional[str], typer.Option("--address", help="Ray cluster to use (default: the running one, else a new local one).")
    ] = None,
    wait_for_resources: Annotated[
        float, typer.Option("--wait-for-resources", min=0, max=30 * 24 * 3600, metavar="SECONDS",
                            help="If no node can hold one trial yet (an autoscaling cluster, nodes still joining), wait "
                            "this long for one, saying every 30 s what is missing; default 0: exit 2 at once."),
    ] = 0.0,
) -> None:
    """Run a tuning sweep on Ray (Ray Tune + Optuna), one MLflow run per trial.

    Exit 0 with a valid best configuration (best.yaml), 1 if no trial produced one, 2 for bad input or a
    sweep that cannot run here (preflight: resources, engine package, model paths, MLflow).
    """
    from orchestrator.spec_file import read_spec_file
    from orchestrator.sweep import dry_run as show_dry_run
    from orchestrator.sweep.driver import PreflightError, SweepBusyError, SweepResumeError, run_sweep

    if resume is not None:
        if spec is None:
            spec = resume / "spec.yaml"
        results_dir = str(resume)
    if spec is None:
        Console(stderr=True).print("give a spec (spectune sweep SPEC) or --resume RESULTS_DIR", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    sweep_spec = _load_spec(spec)
    if dry_run:
        show_dry_run(sweep_spec, first=first)
        return
    try:
        outcome = run_sweep(sweep_spec, spec_text=read_spec_file(spec), results_dir=results_dir, address=address,
                            resume=resume is not None, wait_for_resources_s=wait_for_resources)
    except PreflightError as exc:
        err = Console(stderr=True)
        err.print("[bold red]cannot start the sweep[/] (nothing was run):", highlight=False)
        for line in str(exc).splitlines():
            err.print(f"  - {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except SweepResumeError as exc:
        Console(stderr=True).print(f"[bold red]cannot resume[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except SweepBusyError as exc:
        Console(stderr=True).print(f"[bold red]cannot start[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_FAILED) from None
    raise typer.Exit(outcome.exit_code)


@app.command()
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
    from serving.serve.ingress import key_digest
    from serving.serve.options import API_KEY_ENV, ServeConfigError, load_serve_file

    err = Console(stderr=True)
    overrides: dict = {"host": host, "port": port, "num_replicas": num_replicas, "gpus_per_replica": gpus_per_replica,
                       "ingress": ingress, "app_name": app_name, "route_prefix": route_prefix}
    if autoscaling_config is not None:
        try:
            overrides["autoscaling_config"] = json.loads(autoscaling_config)
        except ValueError as exc:
            err.print(f"--autoscaling-config: not valid JSON ({escape(str(exc))})", highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT) from None
    try:
        engine_config, options = load_serve_file(config, overrides={k: v for k, v in overrides.items() if v is not None})
    except ServeConfigError as exc:
        err.print(f"[bold red]invalid serve config[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    key = api_key or API_KEY_ENV.get() or None
    if emit_serve_config is not None:
        from serving.app import serve_config_file

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
        err.print(f"[bold red]serve failed[/]: {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None


app.command(name="bench")(bench_commands.bench)
app.command(name="probe")(bench_commands.probe)


def _pairs(items: list[str], *, option: str) -> dict[str, str]:
    """``["A=1", "B=2"]`` -> ``{"A": "1", "B": "2"}``, or exit 2 naming the bad item."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            Console(stderr=True).print(f"{option} {item!r}: expected NAME=VALUE", highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT)
        out[name.strip()] = value
    return out


@app.command()
def audit(
    pid: Annotated[
        int, typer.Option("--pid", min=1, help="PID of the engine's server process (the one launched).")
    ],
    expect: Annotated[
        Optional[list[str]],
        typer.Option("--expect", help="NAME=VALUE every process must carry (repeatable); NAME= for any value."),
    ] = None,
    worker_expect: Annotated[
        Optional[list[str]],
        typer.Option(
            "--worker-expect", help="NAME=VALUE only TP workers must carry (e.g. NCCL_CUMEM_ENABLE=0 under SGLang)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Prove every process of a running engine (SGLang included) carries the expected environment.

    Reads /proc/<pid>/environ of the server and every descendant. Exit 0 if all carry every
    expected variable, 1 on any missing or different value, 2 if there is no such process.
    """
    expected = {k: (v or None) for k, v in _pairs(expect or [], option="--expect").items()}
    workers = {k: (v or None) for k, v in _pairs(worker_expect or [], option="--worker-expect").items()}
    if not expected and not workers:
        Console(stderr=True).print("give at least one --expect NAME=VALUE", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    report = audit_process_tree(root_pid=pid, expected=expected, worker_expected=workers)
    if report.processes[0].error == "no such process":
        Console(stderr=True).print(f"no process with pid {pid}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(report.summary())
        if report.ok:
            for process in report.processes:
                typer.echo(f"  {process.describe()}")
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _validation_message(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(p) for p in validation_problems(exc, model=EngineConfig))
    return str(exc)


def _shown(config: EngineConfig) -> EngineConfig:
    """``config`` for printing: secret-looking env values and string flags replaced (``serving.redaction``)."""
    flags = {k: REDACTED if is_secret(k) and isinstance(v, str) else v for k, v in config.extra_args.items()}
    return config.model_copy(update={"env": redacted_env(config.env), "extra_args": flags})


@app.command(name="engine-cmd")
def engine_cmd(
    spec: SpecPath,
    settings: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            help="KEY=VALUE over the space's first point: num_steps, eagle_topk, num_draft_tokens, "
            "all_reduce (custom|nccl), NCCL_* (default unsets). Repeatable.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address the engine binds.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the engine listens on.")] = 30000,
    as_json: Annotated[bool, typer.Option("--json", help="Print argv and env as JSON.")] = False,
    show_secrets: Annotated[
        bool,
        typer.Option(
            "--show-secrets",
            help="Print secret-looking values (HF_TOKEN, *_KEY, *PASSWORD*, ...) instead of <redacted>.",
        ),
    ] = False,
) -> None:
    """Print the exact engine command and environment of one configuration, to reproduce a trial by hand.

    Secret-looking values (engine.env HF_TOKEN, *_KEY, *PASSWORD*, ... and such string flags) print
    as <redacted> unless --show-secrets is given.
    """
    sweep_spec = _load_spec(spec)
    try:
        candidate = candidate_from_settings(sweep_spec, _pairs(settings or [], option="--set"))
        config = candidate.engine_config(sweep_spec)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        Console(stderr=True).print(
            f"[bold red]invalid configuration[/]: {escape(_validation_message(exc))}", highlight=False
        )
        raise typer.Exit(EXIT_BAD_INPUT) from None
    command = build_command(config if show_secrets else _shown(config), host=host, port=port, python="python")
    if as_json:
        typer.echo(json.dumps({"argv": command.argv, "env": command.env, "url": command.url}, indent=2))
        return
    err = Console(stderr=True)
    if candidate not in sweep_spec.space():  # membership is computed, the space is never listed
        err.print("note: this configuration is outside the spec's search space", highlight=False)
    for name, value in sorted(config.env.items()):
        reason = danger_of(name, value)
        if reason and not sweep_spec.search.is_allowed(name, value):
            err.print(f"warning: {name}={value} is dangerous: {reason}", highlight=False, markup=False)
    typer.echo(command.shell())


@app.command()
def examples(
    name: Annotated[Optional[str], typer.Argument(help="Example to copy (omit to list them).")] = None,
    to: Annotated[Path, typer.Option("--to", help="Directory to copy the example into.")] = Path("."),
) -> None:
    """List the example specs shipped with spectune, or copy one to start from."""
    shipped = shipped_examples()
    if name is None:
        for file_name in sorted(shipped):
            typer.echo(file_name)
        return
    key = name if name.endswith(".yaml") else f"{name}.yaml"
    if key not in shipped:
        Console(stderr=True).print(f"no example {name!r}; shipped: {', '.join(sorted(shipped))}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    target = to / key
    if target.exists():
        Console(stderr=True).print(f"{target} exists; not overwriting it", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    to.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shipped[key], target)
    typer.echo(str(target))


def shipped_examples() -> dict[str, Path]:
    """The example specs installed with spectune (the ``experiments/`` data package), by file name.

    ``experiments/`` holds YAML only, so it is a namespace package; its directories are read
    directly because importlib.resources cannot read an editable install's namespace mapping.
    """
    spec = importlib.util.find_spec("spectune_experiments")
    found: dict[str, Path] = {}
    for location in list(spec.submodule_search_locations or []) if spec else []:
        folder = Path(location)
        if folder.is_dir():
            found.update({p.name: p for p in folder.glob("*.yaml")})
    return found


def main() -> None:
    """Entry point of the ``spectune`` script."""
    try:
        app()
    except SpectuneError as exc:  # anything not handled by a command: one clear line, no traceback
        Console(stderr=True).print(f"[bold red]error[/]: {escape(str(exc))}", highlight=False)
        raise SystemExit(EXIT_FAILED) from None


if __name__ == "__main__":
    main()
