"""The traffic's provenance: which prompts a benchmark sent, from which file (its hash), and what shape
of load they make (input sizes, output caps, sampling), so that two results can be checked to have
measured the same traffic.

Quantiles are ``statistics.quantiles(values, n=100, method="inclusive")`` (the values are taken as
the whole population: p0 is the smallest, p100 the largest, p50 the median; linear interpolation
between the closest ranks); one value is every quantile of itself.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field

from orchestrator.bench.datasets import DatasetError, Prompt
from orchestrator.bench.request_log import RequestLog
from orchestrator.validation import StrictModel

__all__ = ["MLFLOW_PARAM_MAX", "SOURCES", "TrafficFingerprint", "builtin_sha256", "fingerprint"]

SOURCES = ("builtin", "sharegpt", "random", "request_log")
APIS = ("generate", "completions", "chat", "auto")
MLFLOW_PARAM_MAX = 500
"""The longest param value MLflow accepts (older servers: 500 characters)."""


def _fmt(value: float) -> str:
    """A number as a person reads it: 128 not 128.0, 0.85 not 0.8500000001."""
    return f"{value:.4g}"


class TrafficFingerprint(StrictModel):
    """What traffic a benchmark sent: its source and the hash of its file, the selection, the
    request shape. Built by :func:`fingerprint`; recorded with a result and as MLflow params."""

    source: str = Field(description="builtin, sharegpt, random or request_log.")
    path: str | None = Field(description="The dataset file as given (None for builtin and random).")
    sha256: str = Field(description="Hex SHA-256 of the dataset file's bytes; builtin: of the shipped prompts "
                        "file; random: of the JSON list of the selected prompts' texts.")
    requests_in_file: int | None = Field(description="Requests (non-empty lines) in the file; None where not "
                                         "known (sharegpt, random).")
    replayable: int | None = Field(description="Of those, the ones that can be sent; None where not known.")
    not_replayable: dict[str, int] = Field(description="Reason -> count of the file's requests that cannot be "
                                           "sent (orchestrator.bench.request_log.NOT_REPLAYABLE_REASONS).")
    selected: int = Field(description="Prompts per repetition (num_prompts).")
    seed: int = Field(description="The seed of the selection.")
    api: str = Field(description="generate, completions, chat or auto.")
    chat_template_kwargs: dict[str, Any] | None = Field(description="Sent with every chat request.")
    input_chars: dict[str, float] = Field(description="p10, p50, p90, max of the selected prompts' characters "
                                          "(a chat request: its messages' contents joined by newlines).")
    output_cap: dict[str, float] = Field(description="p50, p90, max of the effective max_new_tokens: "
                                         "min(the prompt's max_tokens, output_len), or output_len.")
    temperature: dict[str, float] = Field(description="greedy_share (fraction sent at temperature 0), min, p50, "
                                          "max of the effective temperature (the prompt's, else the run's).")
    top_p: float | None = Field(description="None when no selected prompt sets top_p (the server's default for "
                                "all); else the median of the top_p values set (the one value when they agree; "
                                "prompts that set none are left out).")
    ignore_eos: bool = Field(description="Whether every request generates exactly its output cap.")

    def _requests(self) -> str:
        if self.requests_in_file is None:
            return ""
        text = f"{self.requests_in_file} requests"
        if self.replayable is not None and (self.not_replayable or self.replayable != self.requests_in_file):
            text += f", {self.replayable} replayable"
        if self.not_replayable:
            text += f", {sum(self.not_replayable.values())} not: " + ", ".join(
                f"{reason} {count}" for reason, count in self.not_replayable.items())
        return text

    def _temperature(self) -> str:
        t = self.temperature
        if t["min"] == t["max"]:
            text = f"temperature {_fmt(t['max'])}"
        else:
            text = f"temperature {_fmt(t['min'])}-{_fmt(t['max'])}"
        if 0 < t["greedy_share"] < 1:
            text += f" ({t['greedy_share']:.0%} greedy)"
        return text

    def short(self) -> str:
        """One line a person reads, e.g. ``request_log chat-log.jsonl (sha256 1a2b3c4d, 40 requests,
        36 replayable, 4 not: tools 2, images 2), 16 per repetition, api chat, temperature 0-0.8
        (50% greedy), output cap p50 128, ignore_eos true``."""
        head = self.source if self.path is None else f"{self.source} {Path(self.path).name}"
        inside = ", ".join(part for part in (f"sha256 {self.sha256[:8]}", self._requests()) if part)
        parts = [f"{head} ({inside})", f"{self.selected} per repetition", f"seed {self.seed}", f"api {self.api}"]
        if self.chat_template_kwargs:
            parts.append("chat_template_kwargs " + json.dumps(self.chat_template_kwargs, sort_keys=True))
        parts.append(self._temperature())
        if self.top_p is not None:
            parts.append(f"top_p {_fmt(self.top_p)}")
        parts.append(f"input p50 {_fmt(self.input_chars['p50'])} chars")
        cap = self.output_cap
        parts.append(f"output cap {_fmt(cap['max'])}" if cap["p50"] == cap["max"] else
                     f"output cap p50 {_fmt(cap['p50'])} (max {_fmt(cap['max'])})")
        parts.append(f"ignore_eos {str(self.ignore_eos).lower()}")
        return ", ".join(parts)

    def mlflow_params(self) -> dict[str, str]:
        """Flat ``traffic.*`` MLflow params, every value a string of at most :data:`MLFLOW_PARAM_MAX`
        characters (a longer one is cut and ends in ``...``); ``none`` for an absent value.

        Keys: source, path, sha256, requests, not_replayable, selected, seed, api,
        chat_template_kwargs (JSON, sorted keys), input_chars, output_cap, temperature, top_p, ignore_eos.
        """
        def pairs(values: dict[str, Any]) -> str:
            return ", ".join(f"{key} {_fmt(v) if isinstance(v, float) else v}" for key, v in values.items())

        params = {
            "source": self.source,
            "path": self.path if self.path is not None else "none",
            "sha256": self.sha256,
            "requests": self._requests() or "none",
            "not_replayable": pairs(self.not_replayable) or "none",
            "selected": str(self.selected),
            "seed": str(self.seed),
            "api": self.api,
            "chat_template_kwargs": (json.dumps(self.chat_template_kwargs, sort_keys=True)
                                     if self.chat_template_kwargs is not None else "none"),
            "input_chars": pairs(self.input_chars),
            "output_cap": pairs(self.output_cap),
            "temperature": pairs(self.temperature),
            "top_p": _fmt(self.top_p) if self.top_p is not None else "none",
            "ignore_eos": str(self.ignore_eos).lower(),
        }
        return {f"traffic.{key}": value if len(value) <= MLFLOW_PARAM_MAX else value[: MLFLOW_PARAM_MAX - 3] + "..."
                for key, value in params.items()}


def _quantiles(values: list[float], points: tuple[int, ...]) -> dict[str, float]:
    """``{"p<k>": ...}`` for each k in ``points`` (see the module docstring), and ``max``."""
    if len(values) == 1:
        cuts = [float(values[0])] * 99
    else:
        cuts = statistics.quantiles(values, n=100, method="inclusive")
    result = {f"p{k}": float(cuts[k - 1]) for k in points}
    result["max"] = float(max(values))
    return result


def _input_chars(prompt: Prompt) -> int:
    if prompt.messages is not None:
        return len("\n".join(content for _, content in prompt.messages))
    return len(prompt.text)


def builtin_sha256() -> tuple[str, int]:
    """(hex SHA-256 of the shipped ``orchestrator/bench/data/prompts.jsonl``, its non-empty lines)."""
    data = resources.files("orchestrator.bench").joinpath("data", "prompts.jsonl").read_bytes()
    return hashlib.sha256(data).hexdigest(), sum(1 for line in data.splitlines() if line.strip())


def fingerprint(
    *,
    source: str,
    prompts: list[Prompt],
    selected: int,
    seed: int,
    api: str,
    output_len: int,
    temperature: float,
    ignore_eos: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
    path: str | None = None,
    log: RequestLog | None = None,
) -> TrafficFingerprint:
    """The fingerprint of one benchmark's traffic.

    Args:
        source: builtin, sharegpt, random or request_log.
        prompts: The selected prompts (one repetition's list, as sent).
        selected: Prompts per repetition (the spec's num_prompts).
        seed: The selection's seed.
        api: generate, completions, chat or auto.
        output_len: The run's output cap (a prompt's own max_tokens is capped by it).
        temperature: The run's temperature (used for prompts that set none).
        ignore_eos: Whether each request generates exactly its cap.
        chat_template_kwargs: Sent with every chat request, if any.
        path: The dataset file as given: required for sharegpt, taken from ``log`` for request_log
            when not given, refused for builtin and random.
        log: The request log read (required for request_log, refused otherwise): its hash, counts.

    Returns:
        The :class:`TrafficFingerprint`. The hash comes from ``log`` (request_log), the shipped
        prompts file (builtin: its bytes are read), the file at ``path`` (sharegpt: its bytes are
        read) or the JSON list of the prompts' texts (random).

    Raises:
        ValueError: an unknown source or api, no prompts, output_len below 1, or a path or log where
            the source takes none (or none where it needs one).
        DatasetError: a sharegpt file that cannot be read.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if api not in APIS:
        raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
    if not prompts:
        raise ValueError("no prompts: a fingerprint describes the prompts sent")
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, not {output_len}")
    if (log is not None) != (source == "request_log"):
        raise ValueError("log is given for source request_log, and only for it")
    if source in ("builtin", "random") and path is not None:
        raise ValueError(f"source {source} has no file; path must be None, not {path!r}")
    if source == "sharegpt" and not path:
        raise ValueError("source sharegpt needs path (the ShareGPT file)")

    requests_in_file: int | None = None
    replayable: int | None = None
    not_replayable: dict[str, int] = {}
    if log is not None:
        path = path if path is not None else log.path
        sha256, requests_in_file, replayable = log.sha256, log.lines, len(log.prompts)
        not_replayable = dict(log.not_replayable)
    elif source == "builtin":
        sha256, requests_in_file = builtin_sha256()
        replayable = requests_in_file
    elif source == "sharegpt":
        try:
            sha256 = hashlib.sha256(Path(str(path)).read_bytes()).hexdigest()
        except OSError as exc:
            raise DatasetError(f"dataset_path {path!r} cannot be read for its hash: {exc}") from None
    else:
        texts = json.dumps([p.text for p in prompts], ensure_ascii=False)
        sha256 = hashlib.sha256(texts.encode("utf-8")).hexdigest()

    caps = [float(min(p.max_tokens, output_len)) if p.max_tokens is not None else float(output_len) for p in prompts]
    temps = [float(p.temperature) if p.temperature is not None else float(temperature) for p in prompts]
    top_ps = [float(p.top_p) for p in prompts if p.top_p is not None]
    temperature_stats = {
        "greedy_share": sum(1 for t in temps if t == 0.0) / len(temps),
        "min": min(temps),
        **_quantiles(temps, (50,)),
    }
    return TrafficFingerprint(
        source=source,
        path=path,
        sha256=sha256,
        requests_in_file=requests_in_file,
        replayable=replayable,
        not_replayable=not_replayable,
        selected=selected,
        seed=seed,
        api=api,
        chat_template_kwargs=dict(chat_template_kwargs) if chat_template_kwargs is not None else None,
        input_chars=_quantiles([float(_input_chars(p)) for p in prompts], (10, 50, 90)),
        output_cap=_quantiles(caps, (50, 90)),
        temperature=temperature_stats,
        top_p=statistics.median(top_ps) if top_ps else None,
        ignore_eos=ignore_eos,
    )
