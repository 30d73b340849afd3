"""``spectune bench`` and ``spectune probe``: parse options, call ``orchestrator.bench``, show the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.bench.datasets import DatasetError, load_builtin
from orchestrator.bench.probe import ProbeBaselineError, run_probe
from orchestrator.spec_benchmark import DEFAULT_MAX_FLIP_RATE, DEFAULT_MAX_LOGPROB_GAP
from orchestrator.bench.report import BenchmarkAborted, BenchResult, summary_table, write_json
from orchestrator.bench.runner import ProgressUpdate, run_benchmark
from orchestrator.bench.settings import BenchSettings
from orchestrator.cli.console import stderr_console
from orchestrator.errors import BenchmarkError, SpecError
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES
from orchestrator.validation import validation_problems

__all__ = ["bench", "probe"]

Url = Annotated[str, typer.Argument(help="Base URL of a running engine, e.g. http://127.0.0.1:30000.", show_default=False)]


def _fail(code: int, message: str) -> typer.Exit:
    # messages quote servers and model output ("[/INST]"): never let them be read as markup
    stderr_console().print(f"[bold red]error[/]: {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _concurrency(values: list[str] | None) -> list[int] | None:
    """``-c 1 -c 8`` or ``-c 1,8``."""
    if not values:
        return None
    out = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part:
                try:
                    out.append(int(part))
                except ValueError:
                    raise _fail(EXIT_BAD_INPUT, f"--concurrency: {part!r} is not a whole number") from None
    return out


def bench(
    url: Url,
    spec: Annotated[
        Optional[Path], typer.Option("--spec", help="Take the settings from a sweep spec's benchmark section.")
    ] = None,
    dataset: Annotated[Optional[str], typer.Option(
        help="builtin (default), sharegpt, random, or request_log (an OpenAI-format JSONL request log, replayed "
             "request by request; needs --api chat or completions).")] = None,
    dataset_path: Annotated[Optional[str], typer.Option(
        help="ShareGPT-format JSON file (dataset sharegpt) or JSONL request log (dataset request_log).")] = None,
    allow_random_prompts: Annotated[
        bool, typer.Option("--allow-random-prompts", help="Permit dataset random (flatters speculation).")
    ] = False,
    random_input_len: Annotated[
        Optional[int], typer.Option(help="Words (not tokens) per random prompt; prompt_tokens in the result says how many tokens.")
    ] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Requests per repetition and level.")] = None,
    output_len: Annotated[Optional[int], typer.Option(help="max_new_tokens per request.")] = None,
    concurrency: Annotated[
        Optional[list[str]], typer.Option("--concurrency", "-c", help="Concurrency levels: -c 1 -c 8 or -c 1,8.")
    ] = None,
    request_rate: Annotated[Optional[float], typer.Option(help="Open loop: requests/s (capped at each level).")] = None,
    warmup: Annotated[
        Optional[int], typer.Option(help="Warm-up requests per level, at its concurrency (discarded); 0: no warm-up.")
    ] = None,
    warmup_window: Annotated[
        Optional[int], typer.Option(help="Requests per warm-up stability window (default: 2 x concurrency, >= 4).")
    ] = None,
    warmup_tolerance: Annotated[
        Optional[float], typer.Option(help="Warm-up ends when two windows' tok/s differ by at most this fraction.")
    ] = None,
    warmup_max_windows: Annotated[Optional[int], typer.Option(help="Most warm-up stability windows per level.")] = None,
    fixed_warmup: Annotated[
        bool, typer.Option("--fixed-warmup", help="No stability windows: exactly --warmup requests per level.")
    ] = False,
    repetitions: Annotated[
        Optional[int], typer.Option("--repetitions", "-r", help="Most repetitions per level (the cap).")
    ] = None,
    min_repetitions: Annotated[
        Optional[int], typer.Option(help=f"Fewest repetitions per level (below {MIN_VALUES} acts as {MIN_VALUES}).")
    ] = None,
    target_ci: Annotated[
        Optional[float],
        typer.Option(help="Repeat until the 95% interval of the geometric mean lies within a factor 1 + this of it."),
    ] = None,
    target_metric: Annotated[
        Optional[str], typer.Option(help="Metric whose interval decides the repetitions (default output_tok_per_s).")
    ] = None,
    fixed_repetitions: Annotated[
        bool, typer.Option("--fixed-repetitions", help="No interval target: exactly --repetitions per level.")
    ] = False,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (0 = greedy).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Prompt order / sampling seed.")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Per-request timeout (s).")] = None,
    api: Annotated[Optional[str], typer.Option(help="auto, generate (SGLang native), completions or chat.")] = None,
    model: Annotated[Optional[str], typer.Option(help="OpenAI model field (default: first of /v1/models).")] = None,
    stream: Annotated[Optional[bool], typer.Option("--stream/--no-stream", help="Stream responses.")] = None,
    ignore_eos: Annotated[
        Optional[bool], typer.Option("--ignore-eos/--no-ignore-eos", help="Always generate output_len tokens.")
    ] = None,
    flush_cache: Annotated[
        Optional[bool], typer.Option("--flush-cache/--no-flush-cache", help="POST /flush_cache before each repetition.")
    ] = None,
    accept_length_tolerance: Annotated[
        Optional[float], typer.Option(help="Relative tolerance between the two accept-length sources.")
    ] = None,
    noisy_cv: Annotated[Optional[float], typer.Option(help="CV across repetitions above which a level is noisy.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json-out", help="Write the full result JSON here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result JSON instead of the table.")] = False,
) -> None:
    """Benchmark a running engine (SGLang, the reference engine, or any OpenAI server).

    Exit 0 when the run completed (failed requests and flags are reported), 1 when it could not;
    a run that stopped part-way still writes what it measured to --json-out (status failed).

    Settings come from --spec's benchmark section (or the defaults), overridden by options. Each
    level is warmed up at its own concurrency until its throughput is stable, then repeated until
    the 95% interval of --target-metric's geometric mean (log scale, from 3 repetitions on) is within
    a factor 1 + --target-ci of it (or -r is reached).
    """
    if fixed_warmup and warmup_tolerance is not None:
        raise _fail(EXIT_BAD_INPUT, "--fixed-warmup turns the warm-up windows off; drop --warmup-tolerance")
    if fixed_repetitions and target_ci is not None:
        raise _fail(EXIT_BAD_INPUT, "--fixed-repetitions turns the interval target off; drop --target-ci")
    overrides: dict[str, Any] = {
        "dataset": dataset, "dataset_path": dataset_path, "allow_random_prompts": allow_random_prompts or None,
        "random_input_len": random_input_len, "num_prompts": num_prompts, "output_len": output_len,
        "concurrency": _concurrency(concurrency), "request_rate": request_rate, "warmup_requests": warmup,
        "repetitions": repetitions, "min_repetitions": min_repetitions, "target_ci_rel": target_ci,
        "target_metric": target_metric, "temperature": temperature, "seed": seed, "request_timeout_s": timeout,
        "api": api, "model": model, "stream": stream, "ignore_eos": ignore_eos, "flush_cache": flush_cache,
        "accept_length_tolerance": accept_length_tolerance, "noisy_cv_threshold": noisy_cv,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if fixed_repetitions:
        overrides["target_ci_rel"] = None
    warmup_overrides = {k: v for k, v in {
        "window_requests": warmup_window, "tolerance": warmup_tolerance, "max_windows": warmup_max_windows,
    }.items() if v is not None}
    if fixed_warmup:
        warmup_overrides["tolerance"] = None
    base: dict[str, Any] = {}
    if spec is not None:
        try:
            base = SweepSpec.from_yaml(spec).benchmark.model_dump()
        except SpecError as exc:
            raise _fail(EXIT_BAD_INPUT, str(exc)) from None
    if warmup_overrides:
        overrides["warmup"] = {**base.get("warmup", {}), **warmup_overrides}
    try:
        settings = BenchSettings.model_validate({**base, **overrides})
    except ValidationError as exc:
        problems = "; ".join(str(p) for p in validation_problems(exc, model=BenchSettings))
        raise _fail(EXIT_BAD_INPUT, f"invalid benchmark settings: {problems}") from None

    err = stderr_console()
    # how many windows and repetitions a level takes is known only at its end: one bar per batch
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )
    task = progress.add_task("starting", total=None)

    def on_progress(update: ProgressUpdate) -> None:
        if update.phase == "warmup":
            label = f"c={update.concurrency} warm-up" + (f" window {update.repetition}" if update.repetition else "")
        else:
            label = f"c={update.concurrency} rep {update.repetition + 1}"
        progress.update(task, completed=update.done, total=update.total, description=label)

    try:
        with progress:
            result = run_benchmark(base_url=url, settings=settings, on_progress=on_progress)
    except DatasetError as exc:
        raise _fail(EXIT_BAD_INPUT, str(exc)) from None
    except BenchmarkAborted as exc:
        raise _fail(EXIT_FAILED, _keep_partial(exc.partial, json_out=json_out, as_json=as_json)) from None
    except BenchmarkError as exc:
        raise _fail(EXIT_FAILED, str(exc)) from None
    if json_out is not None:
        _write(result, json_out)
    _show(result, as_json=as_json, json_out=json_out)


def _write(result: BenchResult, path: Path) -> None:
    try:
        write_json(result, path)
    except OSError as exc:
        raise _fail(EXIT_FAILED, f"--json-out {path}: cannot write the result: {exc}") from None


def _keep_partial(partial: BenchResult, *, json_out: Path | None, as_json: bool) -> str:
    """Write (and with --json print) what a failed run measured; returns the error message to show."""
    assert partial.failure is not None
    if as_json:
        typer.echo(partial.model_dump_json(indent=2))
    kept = f"{partial.num_repetitions} finished repetition{'s' if partial.num_repetitions != 1 else ''}"
    if json_out is None:
        return f"{partial.failure.reason} (measured before it stopped: {kept}; --json-out keeps them)"
    _write(partial, json_out)
    return f"{partial.failure.reason} (what was measured, {kept}, is in {json_out} with status failed)"


def _show(result: BenchResult, *, as_json: bool, json_out: Path | None) -> None:
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        Console().print(summary_table(result))
    err = stderr_console()
    if result.num_errors:
        kinds: dict[str, int] = {}
        for level in result.levels:
            for rep in level.repetitions:
                for kind, count in rep.errors_by_kind.items():
                    kinds[kind] = kinds.get(kind, 0) + count
        err.print(
            f"[yellow]{result.num_errors} of {result.num_requests} requests failed[/]: {escape(str(kinds))}",
        )
    if result.accept_length_mismatch:
        err.print(
            "[yellow]accept_length_mismatch[/]: /server_info and the per-request meta_info disagree beyond "
            f"{result.settings.accept_length_tolerance:.0%}; do not trust the server's accept length",
        )
    elif result.accept_length_not_checkable:
        err.print(
            "[yellow]accept_length_not_checkable[/]: the server's lifetime accept length did not move and the "
            "repetitions may have been too short for it to; it neither agrees nor disagrees",
        )
    if result.noisy:
        noisy = {lvl.concurrency: lvl.noisy_metrics for lvl in result.levels if lvl.noisy}
        err.print(f"[yellow]noisy[/]: repetitions disagree: {escape(str(noisy))}")
    _show_trust(result, err)
    if json_out is not None:
        err.print(f"result written to {json_out}", markup=False)


def _show_trust(result: BenchResult, err: Console) -> None:
    """Say which levels' figures need care: an unsettled warm-up, an interval wider than its target, a drift."""
    for level in result.levels:
        c = level.concurrency
        if level.warmup is not None and level.warmup.converged is False:
            err.print(f"[yellow]warm-up not converged[/] at c={c}: window tok/s "
                      f"{', '.join('-' if v is None else f'{v:.1f}' for v in level.warmup.window_tok_per_s)}")
        if level.target_met is False and level.target_ci_rel is not None and level.ci_rel is None:
            err.print(f"[yellow]target not met[/] at c={c}: no 95% interval of {escape(str(level.target_metric))} "
                      f"from {level.repetitions_used} repetitions (an interval needs {MIN_VALUES} positive values); "
                      "raise --repetitions")
        elif level.target_met is False and level.target_ci_rel is not None:
            err.print(f"[yellow]target not met[/] at c={c}: {escape(str(level.target_metric))} 95% interval "
                      f"±{level.ci_rel:.1%} of the geometric mean after {level.repetitions_used} repetitions "
                      f"(target ±{level.target_ci_rel:.1%}); raise --repetitions for a narrower one")
        if level.drifts and level.drift is not None:
            err.print(f"[yellow]drift[/] at c={c}: {escape(level.drift.metric)} trends {level.drift.direction} over "
                      f"{level.drift.num_values} repetitions (Mann-Kendall p={level.drift.p_value:.2g}); "
                      "the machine or engine was still changing")


def probe(
    url: Url,
    baseline: Annotated[
        Path, typer.Option("--baseline", help="Baseline JSON: written on the first run, compared afterwards.")
    ],
    num_prompts: Annotated[int, typer.Option(help="Built-in prompts in a new baseline.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy tokens per prompt in a new baseline.")] = 32,
    api: Annotated[str, typer.Option(help="auto, generate, completions or chat (new baseline only).")] = "auto",
    model: Annotated[Optional[str], typer.Option(help="OpenAI model field.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout (s).")] = 300.0,
    rule: Annotated[str, typer.Option(
        help="near-tie: a divergence to a token within --max-logprob-gap nats of the baseline's own is GPU numerics "
             "and passes (reported; the rest is still compared); exact: token for token.")] = "near-tie",
    max_logprob_gap: Annotated[float, typer.Option(help="near-tie: nats under which a divergence is numerics.")]
        = DEFAULT_MAX_LOGPROB_GAP,
    max_flip_rate: Annotated[float, typer.Option(
        help="near-tie: flips per near tie beyond which (the whole 95% interval above it) the flips fail.")]
        = DEFAULT_MAX_FLIP_RATE,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Compare a running engine's greedy outputs with a stored baseline.

    The first run writes the baseline (on SGLang's native API with each token's top-5 logprobs:
    take it from the no-speculation engine). Later runs judge each prompt's first difference by
    --rule. Exit 0 on a match (near-tie flips listed), 1 on a mismatch (naming the first one) or
    when the server cannot be probed, 2 when the baseline file cannot be used.
    """
    if api not in ("auto", "generate", "completions", "chat"):
        raise _fail(EXIT_BAD_INPUT, f"--api {api!r}: use auto, generate, completions or chat")
    if rule not in ("near-tie", "exact"):
        raise _fail(EXIT_BAD_INPUT, f"--rule {rule!r}: use near-tie or exact")
    if not 0 < max_logprob_gap <= 5 or not 0 < max_flip_rate <= 1:
        raise _fail(EXIT_BAD_INPUT, f"--max-logprob-gap must be in (0, 5] nats (got {max_logprob_gap:g}) and "
                                    f"--max-flip-rate in (0, 1] (got {max_flip_rate:g})")
    available = len(load_builtin())
    if max_new_tokens < 1 or not 1 <= num_prompts <= available:
        raise _fail(
            EXIT_BAD_INPUT, f"--num-prompts must be 1 to {available} and --max-new-tokens at least 1"
        )
    try:
        result = run_probe(
            base_url=url, baseline_path=baseline, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
            api=api, model=model, timeout_s=timeout,  # type: ignore[arg-type]
            rule="near_tie" if rule == "near-tie" else "exact", max_logprob_gap=max_logprob_gap,
            max_flip_rate=max_flip_rate,
        )
    except ProbeBaselineError as exc:
        raise _fail(EXIT_BAD_INPUT, str(exc)) from None
    except BenchmarkError as exc:
        raise _fail(EXIT_FAILED, str(exc)) from None
    if as_json:
        typer.echo(json.dumps({**result.model_dump(), "passed": result.passed, "message": result.message}, indent=2))
    else:
        # the message quotes model output ("[/INST]", "[bold]"): escaped, never read as markup
        style = "green" if result.passed else "bold red"
        console = Console()
        console.print(f"[{style}]{result.status}[/]: {escape(result.message)}", highlight=False, soft_wrap=True)
        for mismatch in result.mismatches[1:]:
            console.print(f"  {mismatch}", highlight=False, soft_wrap=True, markup=False)
        for flip in result.flips:
            console.print(f"  near-tie flip: {flip}", highlight=False, soft_wrap=True, markup=False)
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)
