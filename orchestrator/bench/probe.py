"""The correctness probe: greedy outputs for a fixed prompt set, compared with a stored baseline.

The first run against a baseline path writes the baseline (prompts, sampling, outputs and, on
SGLang's native API, the prompt's token ids and each output token's most likely alternatives with
their log-probabilities); later runs send exactly the same requests, one at a time, and judge each
prompt's first difference:

* rule ``near_tie`` (the default, native API): a flip to the baseline's runner-up within
  ``max_logprob_gap`` nats is GPU numerics and passes (``orchestrator.bench.probe_rule``); the
  probe then re-anchors (sends the prompt plus the baseline's tokens through the flip) and keeps
  comparing the rest. Anything else is a mismatch naming the prompt and position.
* rule ``exact`` (strict mode, and whenever the baseline has no log-probabilities): the first
  differing token (or character, where the server returns no ids) is a mismatch.

Only the no-speculation baseline is asked for log-probabilities: a speculative engine never is
(public reports through 2026 show SGLang's spec-v2 path returning partial logprobs or crashing with
EAGLE3). Why: docs/design/bench-and-spec.md ("Correctness probe").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

import aiohttp
from pydantic import ValidationError

from orchestrator.bench import control as srv, probe_models
from orchestrator.bench.datasets import load_builtin
from orchestrator.bench.files import staged_file
from orchestrator.bench.loadgen import ApiKind
from orchestrator.bench.probe_models import (
    PROBE_SCHEMA_VERSION,
    ProbeBaseline,
    ProbeBaselineError,
    ProbeMismatch,
    ProbeOutput,
    ProbePrompt,
    ProbeResult,
)
from orchestrator.bench.probe_requests import generate_once, native_outputs, openai_outputs, where
from orchestrator.bench.probe_rule import (
    DEFAULT_MAX_FLIP_RATE,
    DEFAULT_MAX_LOGPROB_GAP,
    NearTieFlip,
    ProbeRule,
    flip_at,
    flip_rate,
    logprob_table,
    near_ties,
)
from orchestrator.errors import BenchmarkError
from orchestrator.timestamps import utc_timestamp

__all__ = [*probe_models.__all__, "arun_probe", "compare_outputs", "judge_near_tie", "run_probe"]

logger = logging.getLogger(__name__)

_READABLE_VERSIONS = ("spectune.probe/1", PROBE_SCHEMA_VERSION)  # /1: no log-probabilities (exact rule only)
_SNIPPET = 8  # tokens (or 24 characters) shown either side of a difference


def _first_difference(expected: list[Any] | str, got: list[Any] | str) -> int | None:
    for index, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return index
    if len(expected) != len(got):
        return min(len(expected), len(got))
    return None


def _window(values: list[int] | str, position: int, unit: str) -> str:
    if unit == "token":
        part = values[position:position + _SNIPPET]
        return f"{list(part)}" + (" (end)" if position >= len(values) else "")
    text = values[position:position + 3 * _SNIPPET]
    return repr(text) + (" (end)" if position >= len(values) else "")


def compare_outputs(
    *, baseline: list[ProbeOutput], current: list[ProbeOutput]
) -> tuple[Literal["token", "char"], list[ProbeMismatch]]:
    """Compare outputs prompt by prompt: token ids where both sides have them for every prompt,
    else text. Returns the unit compared and one mismatch per differing prompt."""
    unit: Literal["token", "char"] = (
        "token"
        if all(b.output_ids is not None for b in baseline) and all(c.output_ids is not None for c in current)
        else "char"
    )
    mismatches = []
    for index, (base, cur) in enumerate(zip(baseline, current)):
        expected: list[int] | str = base.output_ids if unit == "token" else (base.text or "")  # type: ignore[assignment]
        got: list[int] | str = cur.output_ids if unit == "token" else (cur.text or "")  # type: ignore[assignment]
        position = _first_difference(expected, got)
        if position is not None:
            mismatches.append(
                ProbeMismatch(
                    prompt_index=index,
                    prompt_id=base.prompt_id,
                    position=position,
                    unit=unit,
                    expected=_window(expected, position, unit),
                    got=_window(got, position, unit),
                )
            )
    return unit, mismatches


def _read_baseline(path: Path) -> ProbeBaseline:
    """The stored baseline at ``path``.

    Raises:
        ProbeBaselineError: it cannot be read, is not JSON, has another schema version, does not
            validate, or has a different number of prompts and outputs.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProbeBaselineError(f"probe baseline {path} cannot be read: {exc}; delete it to take a new one") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in _READABLE_VERSIONS:
        raise ProbeBaselineError(f"probe baseline {path}: schema_version {version!r} is not one of {list(_READABLE_VERSIONS)}; delete it to take a new one")
    try:
        baseline = ProbeBaseline.model_validate(data)
    except ValidationError as exc:
        raise ProbeBaselineError(f"probe baseline {path} is not valid: {exc}") from None
    if len(baseline.prompts) != len(baseline.outputs):
        raise ProbeBaselineError(f"probe baseline {path}: {len(baseline.prompts)} prompts but {len(baseline.outputs)} outputs")
    return baseline


def _write_new_baseline(path: Path, text: str) -> None:
    """Publish ``text`` at ``path`` atomically, and only if no baseline is there.

    Staged beside ``path``, then hard-linked (fails if ``path`` exists, like ``O_CREAT | O_EXCL``);
    without hard links, ``os.replace`` after an existence check.

    Raises:
        BenchmarkError: a baseline appeared at ``path`` while this probe ran, or it cannot be written.
    """
    concurrent = BenchmarkError(
        f"probe baseline {path} was created by someone else while this probe ran; not overwritten. "
        "Run the probe again to compare with it, or delete it to take a new one"
    )
    try:
        with staged_file(path, text) as tmp:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise concurrent from None
            except OSError:  # no hard links here (some network and FAT filesystems)
                if path.exists():
                    raise concurrent from None
                os.replace(tmp, path)
    except OSError as exc:
        raise BenchmarkError(f"probe baseline {path} cannot be written: {exc}") from None


def _rank(alternatives: list[tuple[int, float]], token: int) -> int:
    """``token``'s 1-based rank among the alternatives (best first)."""
    return [t for t, _ in alternatives].index(token) + 1


def _rank_note(alternatives: list[tuple[int, float]], *, expected: int, got: int, max_gap: float) -> str:
    """Why a differing token is no near-tie flip, in the baseline's numbers."""
    table, own = logprob_table(alternatives, expected)
    if own is None:
        return "the baseline has no logprobs there"
    if got in table:
        return (f"the baseline's token {expected} ({own:.3g}) led the trial's {got}, its #{_rank(alternatives, got)} "
                f"choice ({table[got]:.3g}), by {own - table[got]:.3g} nats > {max_gap:g}: a confident token changed")
    return (f"the trial's {got} is not among the baseline's {len(table)} most likely there (its token {expected} "
            f"at {own:.3g}): a confident token changed")


Continuation = Callable[[int, list[int], int], Awaitable[list[int]]]
"""``(prompt index, token ids to continue from, tokens wanted) -> greedy output ids``: the trial
engine's greedy continuation of the prompt plus the baseline's tokens through a flip."""


async def judge_near_tie(
    *, baseline: list[ProbeOutput], current: list[ProbeOutput], max_gap: float, continue_from: Continuation,
) -> tuple[list[ProbeMismatch], list[NearTieFlip], int, int]:
    """The near-tie rule over every prompt: (mismatches, flips, near ties compared, re-anchors).

    At each prompt's first difference a divergence within ``max_gap`` nats of the baseline's own
    token passes (``probe_rule.flip_at``); ``continue_from`` then continues from the prompt plus the
    baseline's tokens through the flip, for the rest of the length, and the comparison goes on from
    there, so the whole output stays checked. ``baseline`` must be judgeable (prompt ids, logprobs)."""
    mismatches: list[ProbeMismatch] = []
    flips: list[NearTieFlip] = []
    ties = reanchors = 0
    for index, (base, cur) in enumerate(zip(baseline, current)):
        expected: list[int] = base.output_ids or []
        alternatives = base.top_logprobs or []
        offset, got = 0, cur.output_ids or []
        compared = len(expected)
        while (d := _first_difference(expected[offset:], got)) is not None:
            position = offset + d
            comparable = d < len(got) and position < len(expected)
            gap = (flip_at(alternatives[position], expected=expected[position], got=got[d], max_gap=max_gap)
                   if comparable else None)
            if gap is None:
                detail = (_rank_note(alternatives[position], expected=expected[position], got=got[d], max_gap=max_gap)
                          if comparable else f"the output has {offset + len(got)} tokens, the baseline {len(expected)}")
                mismatches.append(ProbeMismatch(
                    prompt_index=index, prompt_id=base.prompt_id, position=position, unit="token",
                    expected=_window(expected, position, "token"), got=_window(got, d, "token"), detail=detail))
                compared = position + 1
                break
            flips.append(NearTieFlip(prompt_index=index, prompt_id=base.prompt_id, position=position,
                                     expected_token=expected[position], got_token=got[d], gap=gap,
                                     rank=_rank(alternatives[position], got[d])))
            offset = position + 1
            if offset >= len(expected):
                break
            got = await continue_from(index, [*(base.prompt_ids or []), *expected[:offset]], len(expected) - offset)
            reanchors += 1
        ties += near_ties(alternatives[:compared], expected[:compared], max_gap=max_gap)
    return mismatches, flips, ties, reanchors


async def arun_probe(
    *,
    base_url: str,
    baseline_path: str | Path,
    num_prompts: int = 8,
    max_new_tokens: int = 32,
    api: Literal["auto", "generate", "completions", "chat"] = "auto",
    model: str | None = None,
    timeout_s: float = 300.0,
    create_baseline: bool = True,
    rule: ProbeRule = "near_tie",
    max_logprob_gap: float = DEFAULT_MAX_LOGPROB_GAP,
    max_flip_rate: float = DEFAULT_MAX_FLIP_RATE,
) -> ProbeResult:
    """Probe the server at ``base_url`` against the baseline at ``baseline_path``.

    With no file at ``baseline_path`` the server's greedy outputs become the baseline (status
    ``baseline_written``; the write is atomic and never replaces another probe's; on the native
    API it also keeps the prompt's token ids and each output token's alternatives). Otherwise the
    baseline's own prompts, API and length are used and ``num_prompts`` / ``max_new_tokens`` /
    ``api`` are ignored, and the outputs are judged by ``rule`` (module docstring).

    Args:
        base_url: ``http://host:port`` of a running server.
        baseline_path: JSON file to write (first run) or compare with.
        num_prompts: Prompts of the built-in set to use for a new baseline (the first N).
        max_new_tokens: Greedy output length per prompt for a new baseline.
        api: API for a new baseline (auto: native ``/generate`` if ``/server_info`` answers).
        model: OpenAI ``model`` field (default: the first id of ``/v1/models``).
        timeout_s: Per-request timeout.
        create_baseline: Write a baseline when there is none (True: this server is trusted to
            define correct output); False makes a missing baseline an error.
        rule: ``near_tie`` or ``exact``; ``near_tie`` falls back to ``exact`` (and says so) where the
            baseline has no log-probabilities (an OpenAI API, or a ``spectune.probe/1`` file).
        max_logprob_gap: Nats between the baseline's best two under which a flip is numerics.
        max_flip_rate: Flips per near tie beyond which (the whole 95% interval above it) the
            flips fail the probe.

    Raises:
        ProbeBaselineError: the baseline file is unreadable or invalid, or missing while
            ``create_baseline`` is False (bad input: nothing was compared).
        BenchmarkError: the server cannot serve, a probe request failed (nothing to compare), or
            the baseline was created by another probe while this one ran.
    """
    base_url = base_url.rstrip("/")
    path = Path(baseline_path)
    baseline = _read_baseline(path) if path.exists() else None
    if baseline is None and not create_baseline:
        raise ProbeBaselineError(
            f"probe baseline {path} does not exist; write it first from the configuration trusted to define "
            "correct output (create_baseline=True)"
        )
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        reason = await srv.check_health(session, base_url, timeout_s=min(timeout_s, 120.0))
        if reason is not None:
            raise BenchmarkError(f"cannot probe: {reason}")
        info = await srv.get_server_info(session, base_url)
        resolved_api: ApiKind
        if baseline is not None:
            resolved_api, model, length = baseline.api, baseline.model if model is None else model, baseline.max_new_tokens
            prompts = baseline.prompts
        else:
            resolved_api = ("generate" if info is not None else "completions") if api == "auto" else api
            if resolved_api != "generate" and model is None:
                model = await srv.openai_model(session, base_url)
            length = max_new_tokens
            builtin = load_builtin()
            if not 1 <= num_prompts <= len(builtin):
                raise BenchmarkError(f"num_prompts={num_prompts}: the built-in set has 1 to {len(builtin)} prompts")
            prompts = [ProbePrompt(id=p.id, text=p.text) for p in builtin[:num_prompts]]
        if resolved_api == "generate":
            outputs = await native_outputs(session, base_url, list(prompts), max_new_tokens=length,
                                            with_logprobs=baseline is None, timeout_s=timeout_s)
        else:
            outputs = await openai_outputs(session, base_url, list(prompts), api=resolved_api, model=model,
                                            max_new_tokens=length, timeout_s=timeout_s)
        if baseline is None:
            new = ProbeBaseline(
                created_at=utc_timestamp(),
                base_url=base_url,
                server=srv.summarise_server_info(info),
                api=resolved_api,
                model=model,
                max_new_tokens=length,
                prompts=list(prompts),
                outputs=outputs,
            )
            _write_new_baseline(path, new.model_dump_json(indent=2) + "\n")
            result = ProbeResult(status="baseline_written", baseline_path=str(path), num_prompts=len(prompts), unit=None,
                                 mismatches=[])
            logger.debug("%s", result.message)
            return result
        note = ""
        if rule == "near_tie" and not all(b.judgeable for b in baseline.outputs):
            note = (f"the baseline {path} has no log-probabilities ({baseline.api} API, {baseline.schema_version}): "
                    "compared token for token")
        if rule == "exact" or note:
            unit, mismatches = compare_outputs(baseline=baseline.outputs, current=outputs)
            result = ProbeResult(status="mismatch" if mismatches else "match", baseline_path=str(path),
                                 num_prompts=len(prompts), unit=unit, mismatches=mismatches, rule="exact", rule_note=note)
            logger.debug("%s", result.message)
            return result

        async def continue_from(index: int, token_ids: list[int], length: int) -> list[int]:
            reply = await generate_once(
                session, base_url, prompt=token_ids, max_new_tokens=length, with_logprobs=False, timeout_s=timeout_s,
                where=f"{where(index, prompts[index].id)}, re-anchored at output token "
                      f"{len(token_ids) - len(baseline.outputs[index].prompt_ids or [])}")
            return reply.output_ids

        mismatches, flips, ties, reanchors = await judge_near_tie(
            baseline=baseline.outputs, current=outputs, max_gap=max_logprob_gap, continue_from=continue_from)
    rate = flip_rate(flips=len(flips), near_ties=ties)
    status: Literal["match", "mismatch", "too_many_flips"] = (
        "mismatch" if mismatches else "too_many_flips" if rate.exceeds(max_flip_rate) else "match")
    result = ProbeResult(status=status, baseline_path=str(path), num_prompts=len(prompts), unit="token",
                         mismatches=mismatches, rule="near_tie", max_logprob_gap=max_logprob_gap,
                         max_flip_rate=max_flip_rate, flips=flips, flip_rate=rate, reanchors=reanchors)
    logger.debug("%s", result.message)
    return result


def run_probe(**kwargs: Any) -> ProbeResult:
    """:func:`arun_probe` run to completion in a new event loop (same arguments, result, errors)."""
    return asyncio.run(arun_probe(**kwargs))
