"""``spectune sweep``: run (or resume, or dry-run) a tuning sweep and exit with its outcome; with
``--resume DIR --max-visits N`` extend its confirmation (``orchestrator.sweep.confirmation.extension``);
with ``--finish DIR [--max-minutes M]`` end a stopped sweep from disk."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchestrator.cli.console import stderr_console
from orchestrator.cli.inputs import load_spec
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from orchestrator.spec_file import read_spec_file

__all__ = ["extension_refusal", "finish_refusal", "resume_refusal", "sweep"]


def finish_refusal(finish: Path, *, spec: Path | None, resume: Path | None, smoke: bool, dry_run: bool,
                   max_visits: int | None) -> str | None:
    """Why ``--finish DIR`` cannot be used as given (one sentence naming the problem and the fix), or
    None. DIR must be a sweep's results directory: a folder with the spec.yaml and sweep-state.json
    a sweep writes at its start."""
    from orchestrator.sweep.records.results import STATE_FILE

    if spec is not None or resume is not None or smoke or dry_run:
        given = ("a spec" if spec is not None else "--resume" if resume is not None
                 else "--smoke" if smoke else "--dry-run")
        return f"--finish {finish} with {given}: --finish reads everything from the sweep's directory; give it alone"
    if max_visits is not None:
        return (f"--finish {finish} with --max-visits {max_visits}: --finish confirms within --max-minutes under the "
                "recorded design; to extend the design use --resume DIR --max-visits N")
    if not finish.exists():
        return f"--finish {finish}: no such directory; give the results directory of a sweep (it holds trials.jsonl)"
    if not finish.is_dir():
        return f"--finish {finish}: not a directory; give the results directory of a sweep (it holds trials.jsonl)"
    missing = [name for name in ("spec.yaml", STATE_FILE) if not (finish / name).exists()]
    if missing:
        return (f"--finish {finish}: not a sweep's results directory (no {' or '.join(missing)}, which a sweep "
                "writes at its start)")
    return None


def resume_refusal(resume: Path, *, spec: Path | None) -> str | None:
    """Why ``--resume DIR`` cannot be used as given (one sentence naming the problem and what a
    sweep's directory holds), or None. Without a spec the spec.yaml in DIR is the sweep's spec."""
    from orchestrator.sweep.records.results import STATE_FILE, TRIALS_FILE

    holds = f"it holds spec.yaml, {STATE_FILE} and {TRIALS_FILE}, which a sweep writes there"
    if not resume.exists():
        return f"--resume {resume}: no such directory; give the results directory of a sweep ({holds})"
    if not resume.is_dir():
        return f"--resume {resume}: not a directory; give the results directory of a sweep ({holds})"
    if spec is None and not (resume / "spec.yaml").exists():
        return f"--resume {resume}: not a sweep's results directory (no spec.yaml; {holds})"
    return None


def extension_refusal(*, resume: Path | None, max_visits: int | None, max_minutes: float | None,
                      finish: bool = False) -> str | None:
    """Why ``--max-visits`` / ``--max-minutes`` cannot be used as given (one sentence naming the
    flag, the value and what is allowed), or None. ``--max-visits`` extends the confirmation of the
    sweep in ``--resume``'s directory past its last look (read from its spec.yaml and
    confirmation.jsonl); ``--max-minutes`` bounds a resumed confirmation's rounds."""
    if max_minutes is not None and not max_minutes > 0:
        return f"--max-minutes {max_minutes:g}: give a positive number of minutes for the confirmation's rounds"
    if finish:
        return None  # finish_refusal checks --finish's combinations
    if resume is None:
        if max_visits is not None:
            return (f"--max-visits {max_visits} extends the confirmation of a sweep that has run: give --resume "
                    "RESULTS_DIR too (a new sweep takes confirmation.max_visits from its spec)")
        if max_minutes is not None:
            return (f"--max-minutes {max_minutes:g} bounds a resumed confirmation: give --resume RESULTS_DIR too (a "
                    "new sweep takes confirmation.max_minutes from its spec)")
        return None
    if max_visits is None or not (resume / "spec.yaml").exists():
        return None  # a directory without a sweep: the resume itself says so
    from orchestrator.sweep.confirmation.extension import extension_problem, read_confirmation_lines

    spec = load_spec(resume / "spec.yaml")
    return extension_problem(spec, read_confirmation_lines(resume), max_visits, results_dir=str(resume))


def sweep(
    spec: Annotated[
        Optional[Path], typer.Argument(help="Sweep spec YAML (see experiments/); omit with --resume.", show_default=False)
    ] = None,
    results_dir: Annotated[
        Optional[str],
        typer.Option("--results-dir", help="Where results go (default: the spec's results_dir; under `ray job submit "
                     "--working-dir` a relative one goes to ~/spectune-results; what lands there: docs/sweep.md, "
                     "\"Where results land\")."),
    ] = None,
    resume: Annotated[
        Optional[Path],
        typer.Option("--resume", help="Finish the interrupted sweep in this results directory (its spec.yaml is used)."),
    ] = None,
    finish: Annotated[
        Optional[Path],
        typer.Option("--finish", metavar="DIR", show_default=False,
                     help="End the stopped sweep in this results directory from disk (its spec.yaml, trials.jsonl, "
                     "confirmation.jsonl; after a reboot too): no search trial runs; the confirmation runs for "
                     "--max-minutes where given (none: no confirmation, best.yaml keeps SGLang's default and names the "
                     "search's best as an unconfirmed candidate); then the final files."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the baselines and first trials with their exact engine commands and "
                           "env; no Ray, no GPUs, nothing started."),
    ] = False,
    first: Annotated[int, typer.Option("--first", min=0, max=100, help="Proposed trials shown by --dry-run.")] = 3,
    all_nodes: Annotated[bool, typer.Option(
        "--all-nodes", help="With --dry-run: the all-reduce table on every GPU kind, not only engine.gpu_kind's.")] = False,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="Before bed: run only the night's two baselines (no speculation, SGLang's "
                           "choice) through every check, one repetition at the objective's level; print what passed, "
                           "the start phases and the night re-planned. --resume DIR then continues into the night "
                           "without running them again."),
    ] = False,
    address: Annotated[
        Optional[str], typer.Option("--address", help="Ray cluster to use (default: the running one, else a new local one).")
    ] = None,
    tracking_uri: Annotated[
        Optional[str],
        typer.Option("--tracking-uri", help="MLflow tracking URI (default: the spec's tracking.mlflow_uri, else "
                     "$MLFLOW_TRACKING_URI, else sqlite:///<results dir>/mlflow.db; a resumed sweep keeps its own)."),
    ] = None,
    max_visits: Annotated[
        Optional[int], typer.Option("--max-visits", metavar="N", show_default=False,
                                    help="With --resume: extend the sweep's confirmation to N visits per contender "
                                    "(above its last look, at most 100) at alpha held in reserve; no search trial runs "
                                    "again (docs/confirmation.md).")
    ] = None,
    max_minutes: Annotated[
        Optional[float], typer.Option("--max-minutes", metavar="M", show_default=False,
                                      help="With --resume or --finish: the confirmation's time in this run, in minutes "
                                      "(instead of confirmation.max_minutes and the budget's remainder).")
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
    if finish is not None:
        problem = finish_refusal(finish, spec=spec, resume=resume, smoke=smoke, dry_run=dry_run, max_visits=max_visits)
        if problem is not None:
            stderr_console().print(f"[bold red]cannot finish[/]: {escape(problem)}", soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT)
        spec, results_dir = finish / "spec.yaml", str(finish)
    if resume is not None:
        problem = resume_refusal(resume, spec=spec)
        if problem is not None:
            stderr_console().print(f"[bold red]cannot resume[/]: {escape(problem)}", soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT)
        if spec is None:
            spec = resume / "spec.yaml"
        results_dir = str(resume)
    if spec is None:
        stderr_console().print("give a spec (spectune sweep SPEC) or --resume RESULTS_DIR")
        raise typer.Exit(EXIT_BAD_INPUT)
    refusal = extension_refusal(resume=resume, max_visits=max_visits, max_minutes=max_minutes,
                                finish=finish is not None)
    if refusal is not None:
        stderr_console().print(f"[bold red]cannot extend the confirmation[/]: {escape(refusal)}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    # imported here, after the checks of what was given: they import Ray, Ray Tune, Optuna and MLflow (seconds)
    from orchestrator.sweep.execution.before_bed import NotReadyError
    from orchestrator.sweep import dry_run as show_dry_run
    from orchestrator.sweep.execution.night_stop import EngineContractError
    from orchestrator.sweep.execution.driver import PreflightError, SweepBusyError, SweepResumeError, run_sweep

    sweep_spec = load_spec(spec)
    if dry_run:
        try:
            show_dry_run(sweep_spec, first=first, previous=resume,  # --resume DIR: planned from what it measured
                         results_dir=results_dir, all_nodes=all_nodes)
        except NotReadyError:  # the dry run printed its errors (orchestrator.sweep.execution.before_bed)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        return
    try:
        outcome = run_sweep(sweep_spec, spec_text=read_spec_file(spec), results_dir=results_dir, address=address,
                            resume=resume is not None, wait_for_resources_s=wait_for_resources,
                            tracking_uri=tracking_uri, extend_to=max_visits, confirmation_minutes=max_minutes,
                            smoke=smoke, finish=finish is not None)
    except PreflightError as exc:
        err = stderr_console()
        err.print("[bold red]cannot start the sweep[/] (nothing was run):")
        for line in str(exc).splitlines():
            err.print(f"  - {escape(line)}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except EngineContractError as exc:
        stderr_console().print(f"[bold red]sweep stopped: the engine does not answer what a measurement needs[/]: "
                               f"{escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except SweepResumeError as exc:
        stderr_console().print(f"[bold red]cannot {'finish' if finish is not None else 'resume'}[/]: "
                               f"{escape(str(exc))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except SweepBusyError as exc:
        stderr_console().print(f"[bold red]cannot start[/]: {escape(str(exc))}")
        raise typer.Exit(EXIT_FAILED) from None
    raise typer.Exit(outcome.exit_code)
