"""``spectune validate``, ``engine-cmd`` and ``examples``: read a spec, start nothing.

No Ray, no engine, no network: each command answers from the spec file (or the shipped
examples) alone.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.sweep.execution.before_bed import Finding, before_bed
from orchestrator.cli.console import stderr_console
from orchestrator.cli.inputs import SpecPath, load_spec, parse_pairs, spec_description
from orchestrator.exit_codes import EXIT_BAD_INPUT
from orchestrator.space import candidate_from_settings
from orchestrator.space.arms import all_reduce_section, section_kinds, table_lines
from orchestrator.space.points import ALL_REDUCE_ARMS
from orchestrator.sweep.execution.start_flags import sweep_start_flags, with_start_flags
from orchestrator.sweep.output.spec_summary import describe_spec
from orchestrator.validation import validation_problems
from serving.engine.command import build_command, render_flags
from serving.engine.config import EngineConfig
from serving.engine.nccl import danger_of
from serving.redaction import REDACTED, is_secret, redacted_env

__all__ = ["engine_cmd", "examples", "shipped_examples", "validate"]


def validate(
    spec: SpecPath,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    all_nodes: Annotated[bool, typer.Option(
        "--all-nodes", help="Show the all-reduce table on every GPU kind, not only the spec's engine.gpu_kind.")] = False,
) -> None:
    """Check a sweep spec and summarise its search space. Exit 0 if valid, 2 with the problems."""
    sweep_spec = load_spec(spec)
    findings = _ready_for_the_night(sweep_spec, spec)  # orchestrator.sweep.execution.before_bed; an error: exit 2
    summary = describe_spec(sweep_spec)
    summary["all_reduce_tables"] = _all_reduce_tables(sweep_spec, all_nodes=all_nodes)
    summary["warnings"] = [*summary["warnings"], *_paths_here(sweep_spec), *_night_fit(sweep_spec),
                           *(str(f) for f in findings if f.level == "warning")]
    summary["notes"] = [str(f) for f in findings if f.level == "note"]
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
    console.print(f"{'engine':<12} {summary['text']['engine']}", highlight=False, soft_wrap=True, markup=False)
    title, *table = all_reduce_section(sweep_spec, all_nodes=all_nodes)  # one table per node kind
    console.print(f"{'all_reduce':<12} {title}", highlight=False, soft_wrap=True, markup=False)
    for line in table:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    for key in ("objective", "benchmark", "confirmation", "budget", "tracking"):
        console.print(f"{key:<12} {summary['text'][key]}", highlight=False, soft_wrap=True, markup=False)
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning[/] {escape(warning)}", highlight=False, soft_wrap=True)
    for note in summary["notes"]:
        console.print(f"note {note}", highlight=False, soft_wrap=True, markup=False)


def _ready_for_the_night(sweep_spec: Any, path: Path) -> list[Finding]:
    """The before-bed findings (``orchestrator.sweep.execution.before_bed``); where one is an error, they are printed
    as an invalid spec's problems are, and the command exits 2."""
    findings = before_bed(sweep_spec)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        err = stderr_console()
        err.print(f"[bold red]not ready for the night[/] {escape(str(path))}:")
        for finding in errors:
            err.print(f"  - [bold]{escape(finding.field)}[/]: {escape(finding.message)}", soft_wrap=True)
        for finding in findings:
            if finding.level == "warning":
                err.print(f"[yellow]warning[/] {escape(str(finding))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    return findings


def _all_reduce_tables(spec: Any, *, all_nodes: bool) -> list[dict[str, Any]]:
    """The all-reduce tables of ``all_reduce_section`` as data (``validate --json``): per node kind, its rows."""
    return [{"gpu_kind": kind, "rows": [dataclasses.asdict(row) for row in spec.arms_on_node(gpu_kind=kind).table(
        nccl_searched=bool(spec.search.nccl_variables()))]}
            for kind in section_kinds(spec, all_nodes=all_nodes)] if spec.engine.tp_size > 1 else []


def _night_fit(spec: Any) -> list[str]:
    """One line where the night's plan does not fit ``budget.time_limit_s`` (``night_plan.fit_warning``)."""
    from orchestrator.sweep.output.night_plan import fit_warning

    line = fit_warning(spec)
    return [line] if line else []


def _paths_here(spec: Any) -> list[str]:
    """SGLang's model and draft paths checked on this machine (a local path exists, a hub id is
    cached whole): warnings, since the engine's node may not be this one; the sweep's preflight
    checks them there and refuses what is missing."""
    if spec.engine.kind != "sglang":
        return []
    import socket

    from serving.engine.node_checks import model_path_problems

    found = model_path_problems(
        model_path=spec.engine.model_path, env=dict(spec.engine.env), where=f"on this machine ({socket.gethostname()})",
        draft_path=spec.engine.draft_model_path if spec.engine.speculative_algorithm else None)
    return [f"{problem} (if the engines run elsewhere, the sweep's preflight checks it on their node)"
            for problem in found["problems"]]


def _validation_message(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(p) for p in validation_problems(exc, model=EngineConfig))
    return str(exc)


def _shown(config: EngineConfig) -> EngineConfig:
    """``config`` for printing: secret-looking env values and string flags replaced (``serving.redaction``)."""
    flags = {k: REDACTED if is_secret(k) and isinstance(v, str) else v for k, v in config.extra_args.items()}
    return config.model_copy(update={"env": redacted_env(config.env), "extra_args": flags})


def engine_cmd(
    spec: SpecPath,
    settings: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            help="KEY=VALUE over the space's first point: num_steps, eagle_topk, num_draft_tokens, "
            f"all_reduce ({', '.join(ALL_REDUCE_ARMS)}), NCCL_* (default unsets). Repeatable.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address the engine binds.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the engine listens on.")] = 30000,
    as_served: Annotated[bool, typer.Option(
        "--as-served", help="Leave out the sweep-only start flags: the command best.yaml serves with.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print argv and env as JSON.")] = False,
    show_secrets: Annotated[
        bool,
        typer.Option(
            "--show-secrets",
            help="Print secret-looking values (HF_TOKEN, *_KEY, *PASSWORD*, ...) instead of <redacted>.",
        ),
    ] = False,
) -> None:
    """Print the exact engine command and environment of one configuration, as a trial runs it, to
    reproduce the trial by hand: the sweep-only start flags included (--as-served leaves them out),
    one command per node rank for an engine across nodes.

    Secret-looking values (engine.env HF_TOKEN, *_KEY, *PASSWORD*, ... and such string flags) print
    as <redacted> unless --show-secrets is given.
    """
    sweep_spec = load_spec(spec)
    try:
        candidate = candidate_from_settings(sweep_spec, parse_pairs(settings or [], option="--set"))
        config = candidate.applied_to(sweep_spec.engine.template())
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        stderr_console().print(f"[bold red]invalid configuration[/]: {escape(_validation_message(exc))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    _refuse_what_sglang_refuses(sweep_spec, candidate.all_reduce)
    start_flags = {} if as_served else sweep_start_flags(sweep_spec, config)
    launched = with_start_flags(config, start_flags)
    shown = launched if show_secrets else _shown(launched)
    commands = [build_command(shown, host=host, port=port, python="python", node_rank=rank)
                for rank in range(config.nnodes)]
    if as_json:
        listed = [{"node_rank": rank, "argv": c.argv, "env": c.env, "url": c.url} for rank, c in enumerate(commands)]
        typer.echo(json.dumps(listed[0] if len(listed) == 1 else {"commands": listed}, indent=2))
        return
    err = stderr_console()
    if candidate not in sweep_spec.space():  # membership is computed, the space is never listed
        err.print("note: this configuration is outside the spec's search space")
    for name, value in sorted(config.env.items()):
        reason = danger_of(name, value)
        if reason and not sweep_spec.search.is_allowed(name, value):
            err.print(f"warning: {name}={value} is dangerous: {reason}", markup=False)
    for line in _unreached_nccl(sweep_spec, candidate.all_reduce, candidate.nccl_env):
        err.print(f"warning: {line}", markup=False, soft_wrap=True)
    if start_flags:
        err.print(f"note: with the sweep-only start flags a trial adds ({' '.join(render_flags(start_flags))}); "
                  "best.yaml serves without them (--as-served)", markup=False, soft_wrap=True)
    for rank, command in enumerate(commands):
        if len(commands) > 1:
            typer.echo(f"# node rank {rank} of {len(commands)}" + (
                " (its host's address and a free port go in --dist-init-addr on every node)" if rank == 0 else ""))
        typer.echo(command.shell())


def _refuse_what_sglang_refuses(spec: Any, arm: str) -> None:
    """Exit 2 where SGLang would refuse to start with ``arm`` on the spec's node (``engine.gpu_kind``; not
    known while ``auto``), saying SGLang's reason and the arm's row of ``validate``'s all-reduce table."""
    plan = spec.arms_on_node()
    if plan.gpu_kind is None or spec.engine.tp_size == 1 or arm not in plan.paths or not plan.paths[arm].refused:
        return
    err = stderr_console()
    err.print(f"[bold red]SGLang refuses this configuration[/] on {escape(plan.gpu_kind)} (engine.gpu_kind): "
              f"all_reduce={escape(arm)}; its row of the all-reduce table (spectune validate):", soft_wrap=True,
              highlight=False)
    for line in table_lines([plan.row(arm)], gpu_kind=plan.gpu_kind):
        err.print(line, markup=False, soft_wrap=True, highlight=False)
    usable = ", ".join(name for name, path in plan.paths.items() if not path.refused)
    err.print(f"all_reduce arms SGLang starts with on {plan.gpu_kind}: {usable or 'none'}",
              markup=False, soft_wrap=True, highlight=False)
    raise typer.Exit(EXIT_BAD_INPUT)


def _unreached_nccl(spec: Any, arm: str, nccl_env: dict[str, str]) -> list[str]:
    """A line for NCCL settings on an arm whose decode all-reduce is not NCCL's on the spec's node
    (they reach no kernel there); none while the node is not known (engine.gpu_kind: auto)."""
    if not nccl_env:
        return []
    plan = spec.arms_on_node()
    path = plan.paths.get(arm) if plan.gpu_kind is not None else None
    if path is None or path.nccl_carries_decode:
        return []
    settings = ", ".join(f"{k}={v}" for k, v in sorted(nccl_env.items()))
    return [f"{settings}: on {plan.gpu_kind} the all_reduce arm '{arm}' runs decode's all-reduce on "
            f"{path.kernel} ({path.reason}), so NCCL's variables reach no decode kernel; use an arm where NCCL "
            f"carries decode ({', '.join(plan.nccl_arms or ()) or 'none on this node'})"]


def examples(
    name: Annotated[Optional[str], typer.Argument(help="Example to copy (omit to list them).")] = None,
    to: Annotated[Path, typer.Option("--to", help="Directory to copy the example into.")] = Path("."),
) -> None:
    """List the example specs shipped with spectune (each with its description), or copy one to start from."""
    shipped = shipped_examples()
    if name is None:
        width = max(map(len, shipped), default=0)
        for file_name in sorted(shipped):
            typer.echo(f"{file_name:<{width}}  {spec_description(shipped[file_name])}".rstrip())
        return
    key = name if name.endswith(".yaml") else f"{name}.yaml"
    if key not in shipped:
        stderr_console().print(f"no example {name!r}; shipped: {', '.join(sorted(shipped))}")
        raise typer.Exit(EXIT_BAD_INPUT)
    target = to / key
    if target.exists():
        stderr_console().print(f"{target} exists; not overwriting it")
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
