"""The harness's client of an engine's control endpoints: health, ``/server_info``, ``/flush_cache``, ``/v1/models``.

A plain OpenAI server has none of SGLang's endpoints; every function here says "absent" (None)
for that case rather than failing, and the runner decides what absence means.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

from orchestrator.bench.loadgen import ApiKind
from orchestrator.errors import BenchmarkError

__all__ = [
    "SERVER_INFO_KEYS",
    "SPECULATIVE_FIELDS",
    "accept_length_from_info",
    "aserver_info",
    "check_health",
    "decode_log_interval_from_info",
    "detect_api",
    "flush_cache",
    "get_server_info",
    "openai_model",
    "resolved_speculative",
    "server_info",
    "summarise_server_info",
]

logger = logging.getLogger(__name__)

SERVER_INFO_KEYS = (
    "model_path",
    "tp_size",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "disable_custom_all_reduce",
    "decode_log_interval",
    "max_running_requests",
    "version",
)
"""``/server_info`` fields copied into a benchmark result, so a result says what it measured."""


async def _get(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        try:
            body = await resp.json(content_type=None)
        except ValueError:
            body = None
        return resp.status, body


async def check_health(session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 30.0) -> str | None:
    """``None`` if the server can serve, else why not (one line, naming the URL).

    Tries ``/health_generate`` (SGLang: generates one token), then ``/health``, then
    ``/v1/models`` (any OpenAI server); a 404 moves on to the next, anything else decides.
    """
    base = base_url.rstrip("/")
    last = "no health endpoint answered"
    for path in ("/health_generate", "/health", "/v1/models"):
        try:
            async with session.get(base + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status in (404, 405):
                    last = f"{path} is not served (HTTP {resp.status})"
                    continue
                if resp.status == 200:
                    return None
                body = (await resp.text(errors="replace"))[:200]
                return f"{base}{path} answered HTTP {resp.status}: {body}"
        except (TimeoutError, asyncio.TimeoutError):
            return f"{base}{path} did not answer within {timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            cause = type(exc.os_error).__name__ if exc.os_error is not None else str(exc)
            return f"cannot connect to {base} ({cause}; is the server running?)"
        except aiohttp.ClientError as exc:
            return f"{base}{path} failed: {type(exc).__name__}: {exc}"
    return f"{base}: {last}"


async def get_server_info(
    session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 30.0
) -> dict[str, Any] | None:
    """SGLang's ``/server_info`` as a dict; ``None`` where not served.

    The deprecated ``/get_server_info`` is asked only when ``/server_info`` answers 404 (older
    SGLang); it logs a deprecation warning on every call in SGLang 0.5.23.
    """
    base = base_url.rstrip("/")
    for path in ("/server_info", "/get_server_info"):
        try:
            status, body = await _get(session, base + path, timeout_s)
        except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError) as exc:
            logger.debug("GET %s%s failed: %s", base, path, exc)
            return None
        if status != 404:
            return body if status == 200 and isinstance(body, dict) else None
    return None


async def aserver_info(base_url: str, *, timeout_s: float = 30.0) -> dict[str, Any] | None:
    """:func:`get_server_info` in a session of its own: one read of the engine's server args (the
    trial's record of what the engine resolved), blocking twin :func:`server_info`."""
    async with aiohttp.ClientSession() as session:
        return await get_server_info(session, base_url, timeout_s=timeout_s)


def server_info(base_url: str, **kwargs: Any) -> dict[str, Any]:
    """:func:`aserver_info` run to completion in a new event loop."""
    return asyncio.run(aserver_info(base_url, **kwargs))


async def apost_generate(base_url: str, body: dict[str, Any], *, timeout_s: float = 120.0,
                         session: aiohttp.ClientSession | None = None) -> Any:
    """One non-streamed native ``POST /generate``: the parsed JSON answer (in ``session``, else in a
    session of its own).

    Raises:
        BenchmarkError: the request failed, or the answer was not HTTP 200 with JSON (the status and
            the start of the body are named).
    """
    url = base_url.rstrip("/") + "/generate"
    try:
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await apost_generate(base_url, body, timeout_s=timeout_s, session=own)
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise BenchmarkError(f"POST {url} answered HTTP {resp.status}: {text[:300]}")
            return json.loads(text)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise BenchmarkError(f"POST {url} failed: {type(exc).__name__}: {exc}") from None


def post_generate(base_url: str, body: dict[str, Any], **kwargs: Any) -> Any:
    """:func:`apost_generate` run to completion in a new event loop."""
    return asyncio.run(apost_generate(base_url, body, **kwargs))


SPECULATIVE_FIELDS = {
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
}
"""The sweep's names of the speculative numbers -> SGLang's server-arg names in ``/server_info``."""


def resolved_speculative(url: str, *, timeout_s: float = 30.0, info: dict[str, Any] | None = None) -> dict[str, int] | None:
    """The speculative numbers the engine at ``url`` runs with, in the sweep's names, or None.

    Read from ``/server_info`` (SGLang's ``server_args.resolved_dict()``, every resolution
    applied), at the top level or in ``internal_states[0]``, so SGLang's automatic choice and any
    count the engine adjusted show as what they are.
    """
    info = info if info is not None else server_info(url, timeout_s=timeout_s)
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states") if isinstance(info.get("internal_states"), list) else []
    for source in (info, *states[:1]):
        if not isinstance(source, dict):
            continue
        values = {ours: source.get(theirs) for ours, theirs in SPECULATIVE_FIELDS.items()}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
            return values  # type: ignore[return-value]
    return None


def accept_length_from_info(info: dict[str, Any] | None) -> float | None:
    """``avg_spec_accept_length`` from a ``/server_info`` body: the mean over the
    ``internal_states`` entries that report one, else a top-level value; ``None`` when absent."""
    if not info:
        return None
    values: list[float] = []
    states = info.get("internal_states")
    if isinstance(states, list):
        for state in states:
            value = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values.append(float(value))
    if not values:
        value = info.get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values.append(float(value))
    return sum(values) / len(values) if values else None


def decode_log_interval_from_info(info: dict[str, Any] | None) -> int | None:
    """The server's ``decode_log_interval`` (decode steps between folds of its speculative
    counters); ``None`` where not reported."""
    value = (info or {}).get("decode_log_interval")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def summarise_server_info(info: dict[str, Any] | None) -> dict[str, Any]:
    """The fields of :data:`SERVER_INFO_KEYS` present in ``info``."""
    if not info:
        return {}
    return {key: info[key] for key in SERVER_INFO_KEYS if key in info}


async def flush_cache(session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 30.0) -> str | None:
    """Reset the server's caches and speculative counters: ``None`` once flushed, else why not
    (one line naming the URL). Logs nothing.

    A refusal while requests are still running (SGLang's HTTP 400) is retried with a growing
    pause until ``timeout_s``.
    """
    url = base_url.rstrip("/") + "/flush_cache"
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while True:
        try:
            async with session.post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                status = resp.status
                body = (await resp.text(errors="replace"))[:200]
        except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError) as exc:
            return f"POST {url} failed: {type(exc).__name__}: {exc}"
        if status == 200:
            return None
        if status in (404, 405):
            return f"{url} is not served (HTTP {status})"
        if time.monotonic() + pause > deadline:
            return f"{url} still refused after {timeout_s:g} s (HTTP {status}: {body})"
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


async def detect_api(session: aiohttp.ClientSession, base_url: str) -> tuple[ApiKind, dict[str, Any] | None]:
    """SGLang's native ``generate`` when ``/server_info`` answers (SGLang, the reference engine),
    else OpenAI ``completions``; also returns the server info found."""
    info = await get_server_info(session, base_url)
    return ("generate" if info is not None else "completions"), info


async def openai_model(session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 30.0) -> str | None:
    """The first model id of ``/v1/models`` (the OpenAI ``model`` field to send), if served."""
    try:
        status, body = await _get(session, base_url.rstrip("/") + "/v1/models", timeout_s)
    except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError):
        return None
    if status == 200 and isinstance(body, dict):
        data = body.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
            return str(data[0]["id"])
    return None
