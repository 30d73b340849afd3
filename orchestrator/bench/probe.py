"""The correctness probe: greedy outputs for a fixed prompt set, compared token for token with a
stored baseline.

The first run against a baseline path writes the baseline (prompts, sampling and outputs); later
runs send exactly the same requests, one at a time, and name the first differing prompt and
position. Token ids are compared where the server returns them, otherwise text. Why: see
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, Field, ValidationError

from orchestrator.bench import control as srv
from orchestrator.bench.datasets import load_builtin
from orchestrator.bench.files import staged_file
from orchestrator.bench.loadgen import ApiKind, Sampling, WorkItem, run_load
from orchestrator.errors import BenchmarkError
from orchestrator.timestamps import utc_timestamp

__all__ = [
    "PROBE_SCHEMA_VERSION",
    "ProbeBaseline",
    "ProbeBaselineError",
    "ProbeMismatch",
    "ProbeOutput",
    "ProbePrompt",
    "ProbeResult",
    "arun_probe",
    "compare_outputs",
    "run_probe",
]

logger = logging.getLogger(__name__)

PROBE_SCHEMA_VERSION = "spectune.probe/1"
_SNIPPET = 8  # tokens (or 24 characters) shown either side of a difference


class ProbeBaselineError(BenchmarkError):
    """The baseline file cannot be used: unreadable, not JSON, another schema, inconsistent, or
    missing where it must exist. Bad input, not a verdict on the server: nothing was compared."""


class ProbePrompt(BaseModel):
    """A prompt as stored in the baseline (so later runs send exactly the same text)."""

    id: str
    text: str


class ProbeOutput(BaseModel):
    """One prompt's greedy output."""

    prompt_id: str
    output_ids: list[int] | None = Field(description="Generated token ids, where the server returns them.")
    text: str | None = Field(description="Generated text.")


class ProbeBaseline(BaseModel):
    """The stored reference: exactly what was sent and what came back."""

    schema_version: Literal["spectune.probe/1"] = PROBE_SCHEMA_VERSION
    created_at: str
    base_url: str = Field(description="Server the baseline was taken from (for the record only).")
    server: dict[str, Any] = Field(description="Its /server_info summary (model, speculative settings).")
    api: ApiKind
    model: str | None
    max_new_tokens: int
    prompts: list[ProbePrompt]
    outputs: list[ProbeOutput]


class ProbeMismatch(BaseModel):
    """The first difference in one prompt's output."""

    prompt_index: int = Field(description="Index of the prompt in the baseline.")
    prompt_id: str
    position: int = Field(description="Index of the first differing token (or character).")
    unit: Literal["token", "char"]
    expected: str = Field(description="The baseline around the position.")
    got: str = Field(description="This server's output around the position.")

    def __str__(self) -> str:
        return (
            f"prompt {self.prompt_index} ({self.prompt_id!r}) differs at {self.unit} {self.position}: "
            f"expected {self.expected} got {self.got}"
        )


class ProbeResult(BaseModel):
    """What the probe found."""

    status: Literal["baseline_written", "match", "mismatch"]
    baseline_path: str
    num_prompts: int
    unit: Literal["token", "char"] | None = Field(description="What was compared (None when the baseline was written).")
    mismatches: list[ProbeMismatch] = Field(description="One per differing prompt, in prompt order.")

    @property
    def passed(self) -> bool:
        """True unless the outputs differ from the baseline."""
        return self.status != "mismatch"

    @property
    def first_mismatch(self) -> ProbeMismatch | None:
        return self.mismatches[0] if self.mismatches else None

    @property
    def message(self) -> str:
        if self.status == "baseline_written":
            return f"baseline written to {self.baseline_path} ({self.num_prompts} prompts)"
        if self.status == "match":
            return f"all {self.num_prompts} prompts match the baseline {self.baseline_path} {self.unit} for {self.unit}"
        return (
            f"{len(self.mismatches)} of {self.num_prompts} prompts differ from the baseline "
            f"{self.baseline_path}; first: {self.mismatches[0]}"
        )


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
    if version != PROBE_SCHEMA_VERSION:
        raise ProbeBaselineError(f"probe baseline {path}: schema_version {version!r} is not {PROBE_SCHEMA_VERSION!r}")
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
) -> ProbeResult:
    """Probe the server at ``base_url`` against the baseline at ``baseline_path``.

    With no file at ``baseline_path`` the server's greedy outputs become the baseline (status
    ``baseline_written``; the write is atomic and never replaces another probe's). Otherwise the
    baseline's own prompts, API and length are used and ``num_prompts`` / ``max_new_tokens`` /
    ``api`` are ignored.

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
        load = await run_load(
            session=session,
            base_url=base_url,
            api=resolved_api,
            items=[WorkItem(prompt_id=p.id, text=p.text) for p in prompts],
            concurrency=1,
            sampling=Sampling(max_new_tokens=length, temperature=0.0, seed=0, ignore_eos=True),
            timeout_s=timeout_s,
            stream=False,
            model=model,
            keep_output=True,
        )
    failed = [r for r in load.records if r.error is not None]
    if failed:
        first = failed[0]
        raise BenchmarkError(
            f"{len(failed)} of {len(prompts)} probe requests to {base_url} failed, so correctness cannot be "
            f"judged; first: prompt {first.index} ({first.prompt_id!r}): {first.error_kind}: {first.error}"
        )
    outputs = [ProbeOutput(prompt_id=r.prompt_id, output_ids=r.output_ids, text=r.output_text) for r in load.records]
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
        result = ProbeResult(status="baseline_written", baseline_path=str(path), num_prompts=len(prompts), unit=None, mismatches=[])
        logger.debug("%s", result.message)
        return result
    unit, mismatches = compare_outputs(baseline=baseline.outputs, current=outputs)
    result = ProbeResult(
        status="mismatch" if mismatches else "match",
        baseline_path=str(path),
        num_prompts=len(prompts),
        unit=unit,
        mismatches=mismatches,
    )
    logger.debug("%s", result.message)
    return result


def run_probe(**kwargs: Any) -> ProbeResult:
    """:func:`arun_probe` run to completion in a new event loop (same arguments, result, errors)."""
    return asyncio.run(arun_probe(**kwargs))
