"""A user's recorded traffic: an OpenAI-format JSONL request log, read into replayable prompts.

One request a line, as a gateway or proxy records it. A line holds either the request body itself
(``{"model": ..., "messages": [...], "max_tokens": ..., ...}`` for chat, ``{"prompt": "...", ...}``
for completions) or a wrapper with the body under ``"body"`` or ``"request"``, e.g. OpenAI's batch
format ``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}``.

Each request's messages, output cap (``max_tokens`` or ``max_completion_tokens``), ``temperature``
and ``top_p`` are kept so they can be replayed. Requests that cannot be replayed faithfully (tools,
images, ``n`` > 1, ...) are counted by reason, not raised: a log is judged as a whole, and only a log
with no replayable request at all is an error.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.datasets import DatasetError, Prompt, load_prompts, select_prompts

__all__ = ["NOT_REPLAYABLE_REASONS", "RequestLog", "load_dataset", "load_request_log", "sample_requests"]

NOT_REPLAYABLE_REASONS = {
    "not_json": "the line is not JSON",
    "other_endpoint": "the wrapper's url is not a /chat/completions or /completions endpoint (embeddings, ...)",
    "not_a_request": "the line is JSON but not a request: not an object, or no messages nor prompt (in it or under "
    "body/request)",
    "tools": "the request declares tools or functions, or its conversation holds tool calls or tool results",
    "images": "a content part that is not text (image_url, input_audio, file, ...)",
    "n>1": "the request asks for several choices (n or best_of above 1)",
    "bad_sampling": "temperature outside 0..2 or top_p outside (0, 1], or not a number",
    "bad_message": "messages is not a list of {role, content} objects with text content",
    "token_prompt": "a completions prompt given as token ids, or as a batch of several prompts",
    "no_user_turn": "a chat request without a user turn",
    "empty_prompt": "the prompt (a chat request: its last user turn) is empty or blank",
}
"""Every reason a request is not replayable, as counted in :attr:`RequestLog.not_replayable`,
with what it means. A request is counted once, under the first reason that applies in this order."""

_TEXT_PART_JOIN = "\n"
"""How a message's text parts are joined into one content string (as vLLM and SGLang do for a model
whose template takes string content)."""


@dataclass(frozen=True)
class RequestLog:
    """A request log as read by :func:`load_request_log`.

    Attributes:
        path: The file as given.
        sha256: Hex SHA-256 of the file's bytes (what exactly was replayed).
        lines: Non-empty lines read (each one a request, replayable or not).
        prompts: The replayable requests in file order; ``id`` is the request's ``custom_id`` (made
            unique by ``-log-<line>`` if repeated), else ``log-<line number>`` (1-based, counting
            empty lines too, so it is the line an editor shows).
        not_replayable: Reason -> count of the requests that cannot be replayed (reasons:
            :data:`NOT_REPLAYABLE_REASONS`); empty when every request is replayable.
        kind: ``chat`` (every replayable request is a chat request), ``completions`` or ``mixed``.
    """

    path: str
    sha256: str
    lines: int
    prompts: list[Prompt]
    not_replayable: dict[str, int] = field(default_factory=dict)
    kind: str = "chat"


class _NotReplayable(Exception):
    """One request cannot be replayed; ``reason`` is a key of :data:`NOT_REPLAYABLE_REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _unwrap(entry: dict[str, Any]) -> dict[str, Any]:
    """The request body: ``entry["body"]`` or ``entry["request"]`` when that is an object, else the entry."""
    for key in ("body", "request"):
        inner = entry.get(key)
        if isinstance(inner, dict):
            url = entry.get("url")
            if isinstance(url, str) and url and not url.rstrip("/").endswith("completions"):
                raise _NotReplayable("other_endpoint")
            return inner
    return entry


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _number(value: Any) -> float | None:
    """A finite number as a float; raises ``bad_sampling`` for anything else but ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _NotReplayable("bad_sampling")
    return float(value)


def _sampling(body: dict[str, Any]) -> tuple[int | None, float | None, float | None]:
    """(max_tokens, temperature, top_p) of a request body, each None when not sent."""
    for key in ("n", "best_of"):
        count = body.get(key)
        if isinstance(count, (int, float)) and not isinstance(count, bool) and count > 1:
            raise _NotReplayable("n>1")
    temperature = _number(body.get("temperature"))
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise _NotReplayable("bad_sampling")
    top_p = _number(body.get("top_p"))
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise _NotReplayable("bad_sampling")
    cap = _positive_int(body.get("max_completion_tokens"))
    if cap is None:
        cap = _positive_int(body.get("max_tokens"))
    return cap, temperature, top_p


def _is_media_part(part: Any) -> bool:
    """A content part of a type other than text (image_url, input_audio, file, ...)."""
    return isinstance(part, dict) and part.get("type", "text") != "text"


def _content_text(content: Any) -> str:
    """A message's content as one string: a string as is, a list of text parts' texts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise _NotReplayable("bad_message")
            texts.append(text)
        return _TEXT_PART_JOIN.join(texts)
    raise _NotReplayable("bad_message")


def _declares_tools(body: dict[str, Any]) -> bool:
    return bool(body.get("tools") or body.get("functions"))


def _uses_tools(messages: list[Any]) -> bool:
    """A turn is a tool result or carries tool calls."""
    return any(
        isinstance(m, dict) and (m.get("role") in ("tool", "function") or m.get("tool_calls") or m.get("function_call"))
        for m in messages
    )


def _has_non_text_part(messages: list[Any]) -> bool:
    return any(
        isinstance(m, dict) and isinstance(m.get("content"), list) and any(map(_is_media_part, m["content"]))
        for m in messages
    )


def _chat(messages: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(last user turn's text, messages) of a chat request's messages (tools and images already refused)."""
    if not isinstance(messages, list):
        raise _NotReplayable("bad_message")
    turns: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
            raise _NotReplayable("bad_message")
        turns.append((message["role"], _content_text(message.get("content"))))
    users = [text for role, text in turns if role == "user"]
    if not users:
        raise _NotReplayable("no_user_turn")
    return users[-1], tuple(turns)


def _completion(prompt: Any) -> str:
    """The prompt of a completions request (a string, or a list of one string)."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _NotReplayable("token_prompt")
    return prompt


def _parse(entry: Any, line: int, used_ids: set[str]) -> tuple[Prompt, str]:
    """(prompt, "chat" or "completions") of one decoded line; raises :class:`_NotReplayable` with the
    first reason that applies, in the order of :data:`NOT_REPLAYABLE_REASONS`."""
    if not isinstance(entry, dict):
        raise _NotReplayable("not_a_request")
    body = _unwrap(entry)
    if "messages" in body:
        kind = "chat"
    elif "prompt" in body:
        kind = "completions"
    else:
        raise _NotReplayable("not_a_request")
    messages = body.get("messages")
    turns = messages if kind == "chat" and isinstance(messages, list) else []
    if _declares_tools(body) or _uses_tools(turns):
        raise _NotReplayable("tools")
    if _has_non_text_part(turns):
        raise _NotReplayable("images")
    max_tokens, temperature, top_p = _sampling(body)
    if kind == "chat":
        text, sent = _chat(messages)
    else:
        text, sent = _completion(body["prompt"]), None
    if not text.strip():
        raise _NotReplayable("empty_prompt")
    custom_id = entry.get("custom_id", body.get("custom_id"))
    prompt_id = str(custom_id) if custom_id is not None and str(custom_id) else f"log-{line}"
    if prompt_id in used_ids:
        prompt_id = f"{prompt_id}-log-{line}"
    used_ids.add(prompt_id)
    prompt = Prompt(id=prompt_id, text=text, messages=sent, max_tokens=max_tokens,
                    temperature=temperature, top_p=top_p)
    return prompt, kind


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in counts.items())


def load_request_log(path: str | Path) -> RequestLog:
    """Read an OpenAI-format JSONL request log (one request a line; see the module docstring).

    A request that cannot be replayed is counted under its reason (:data:`NOT_REPLAYABLE_REASONS`),
    not raised; a line that is not JSON counts as ``not_json``.

    Args:
        path: The log file (UTF-8 JSONL).

    Returns:
        The :class:`RequestLog`: the replayable requests in file order, the counts of the others,
        the file's SHA-256.

    Raises:
        DatasetError: the file is missing or unreadable or not UTF-8, has no non-empty line, or has
            no replayable request (the message names the file, the counts by reason and the first
            line of each reason).
    """
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"request log {str(path)!r} does not exist; give an OpenAI-format JSONL "
                           "request log (one chat or completions request a line)") from None
    except OSError as exc:
        raise DatasetError(f"request log {str(path)!r} cannot be read: {exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"request log {str(path)!r}: byte {exc.start} is not UTF-8; "
                           "expected a UTF-8 JSONL file") from None

    prompts: list[Prompt] = []
    kinds: set[str] = set()
    skipped: Counter[str] = Counter()
    first_line: dict[str, int] = {}
    used_ids: set[str] = set()
    lines = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        lines += 1
        try:
            try:
                entry = json.loads(raw)
            except ValueError:
                raise _NotReplayable("not_json") from None
            prompt, kind = _parse(entry, number, used_ids)
        except _NotReplayable as skip:
            skipped[skip.reason] += 1
            first_line.setdefault(skip.reason, number)
            continue
        prompts.append(prompt)
        kinds.add(kind)

    if lines == 0:
        raise DatasetError(f"request log {str(path)!r} is empty (no non-empty line); expected one JSON "
                           'request a line, e.g. {"messages": [{"role": "user", "content": "..."}]}')
    if not prompts:
        where = ", ".join(f"{reason} {skipped[reason]} (first at line {first_line[reason]})" for reason in skipped)
        raise DatasetError(
            f"request log {str(path)!r}: none of its {lines} request(s) can be replayed: {where}; expected one "
            'JSON request a line: {"messages": [{"role": "user", "content": "..."}], ...} (chat), '
            '{"prompt": "...", ...} (completions), or either under "body" (OpenAI batch format)'
        )
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    return RequestLog(
        path=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        lines=lines,
        prompts=prompts,
        not_replayable=dict(sorted(skipped.items(), key=lambda item: (-item[1], item[0]))),
        kind=kind,
    )


def sample_requests(log: RequestLog, *, count: int, seed: int) -> list[Prompt]:
    """``count`` replayable requests of ``log`` in a seeded order (the rule of
    :func:`orchestrator.bench.datasets.select_prompts`): a ``random.Random(seed)`` shuffle of all of
    them, repeated as needed to reach ``count``. The same seed gives the same list.

    Raises:
        ValueError: ``count`` is negative.
        DatasetError: the log has no replayable request (a :class:`RequestLog` built by hand).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    return select_prompts(log.prompts, count=count, seed=seed)


def load_dataset(*, dataset: str, count: int, seed: int, dataset_path: str | None = None,
                 random_input_len: int = 128) -> list[Prompt]:
    """``count`` prompts of any source a benchmark takes: a request log's replayable requests
    (:func:`sample_requests`), else ``orchestrator.bench.datasets.load_prompts``.

    Raises:
        DatasetError: the source cannot be read.
    """
    if dataset == "request_log":
        if not dataset_path:
            raise DatasetError("dataset request_log needs dataset_path (an OpenAI-format JSONL request log)")
        return sample_requests(load_request_log(dataset_path), count=count, seed=seed)
    return load_prompts(dataset=dataset, count=count, seed=seed, dataset_path=dataset_path,  # type: ignore[arg-type]
                        random_input_len=random_input_len)
