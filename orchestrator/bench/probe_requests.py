"""What the correctness probe sends and reads: SGLang's native ``/generate``, one prompt at a time.

The no-speculation baseline is asked for SGLang's ``return_logprob``, ``top_logprobs_num`` and
``logprob_start_len: 0`` and read from ``meta_info.input_token_logprobs`` (the prompt's token ids)
and ``output_top_logprobs`` (``(logprob, token_id, text)`` triples per output token; field names
from SGLang 0.5.23's ``tokenizer_manager.add_logprob_to_meta_info``). A speculative engine is never
asked for logprobs. OpenAI APIs go through the load generator (text, no logprobs).
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from pydantic import BaseModel

from orchestrator.bench import control as srv
from orchestrator.bench.loadgen import ApiKind, Sampling, WorkItem, run_load
from orchestrator.bench.probe_models import ProbeOutput, ProbePrompt
from orchestrator.errors import BenchmarkError
from serving.engine.contract import greedy_request

__all__ = ["Reply", "generate_once", "native_outputs", "openai_outputs", "where"]

logger = logging.getLogger(__name__)


class Reply(BaseModel):
    """One native ``/generate`` answer, as the probe reads it."""

    output_ids: list[int]
    text: str
    prompt_ids: list[int] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


def _pairs(row: Any) -> list[tuple[int, float]]:
    """SGLang's ``(logprob, token_id, text)`` triples -> ``(token_id, logprob)``, best first."""
    pairs = [(int(item[1]), float(item[0])) for item in row or () if item[0] is not None]
    return sorted(pairs, key=lambda pair: -pair[1])


async def generate_once(
    session: aiohttp.ClientSession, base_url: str, *, prompt: str | list[int], max_new_tokens: int,
    with_logprobs: bool, timeout_s: float, where: str,
) -> Reply:
    """One greedy native ``/generate`` request (``text`` or ``input_ids``), not streamed.

    With ``with_logprobs`` (the no-speculation baseline only) the logprobs of
    ``serving.engine.contract.greedy_request`` are asked for (``input_token_logprobs`` then carries
    the prompt's token ids).

    Raises:
        BenchmarkError: the request failed or the answer lacks what the probe reads (``where``
            names the prompt).
    """
    try:
        data = await srv.apost_generate(base_url, greedy_request(prompt, max_new_tokens=max_new_tokens,
                                                                  logprobs=with_logprobs),
                                        timeout_s=timeout_s, session=session)
    except BenchmarkError as exc:
        raise BenchmarkError(f"{where}: {exc}") from None
    if isinstance(data, list):  # SGLang answers a one-item list for some inputs
        data = data[0] if data else {}
    ids, meta = data.get("output_ids"), data.get("meta_info") or {}
    if not isinstance(ids, list):
        raise BenchmarkError(f"{where}: the /generate answer has no output_ids (keys: {sorted(data)})")
    reply = Reply(output_ids=[int(t) for t in ids], text=str(data.get("text", "")))
    if with_logprobs:
        prompt_rows = meta.get("input_token_logprobs")
        top_rows = meta.get("output_top_logprobs")
        if isinstance(prompt_rows, list) and isinstance(top_rows, list):
            reply.prompt_ids = [int(row[1]) for row in prompt_rows]
            reply.top_logprobs = [_pairs(row) for row in top_rows]
        else:  # a server without SGLang's logprobs: the baseline is kept without, and compared exactly
            logger.warning("%s: asked for logprobs, but meta_info has no input_token_logprobs / output_top_logprobs "
                           "(keys: %s); this baseline can only be compared token for token", where, sorted(meta))
    return reply


def where(index: int, prompt_id: str) -> str:
    return f"probe prompt {index} ({prompt_id!r})"


async def native_outputs(
    session: aiohttp.ClientSession, base_url: str, prompts: list[ProbePrompt], *, max_new_tokens: int,
    with_logprobs: bool, timeout_s: float,
) -> list[ProbeOutput]:
    """Every prompt's greedy output, one request at a time (native API)."""
    outputs = []
    for index, prompt in enumerate(prompts):
        try:
            reply = await generate_once(session, base_url, prompt=prompt.text, max_new_tokens=max_new_tokens,
                                    with_logprobs=with_logprobs, timeout_s=timeout_s, where=where(index, prompt.id))
        except BenchmarkError as exc:
            raise BenchmarkError(f"a probe request to {base_url} failed, so correctness cannot be judged: {exc}") from None
        outputs.append(ProbeOutput(prompt_id=prompt.id, output_ids=reply.output_ids, text=reply.text,
                                   prompt_ids=reply.prompt_ids, top_logprobs=reply.top_logprobs))
    return outputs


async def openai_outputs(
    session: aiohttp.ClientSession, base_url: str, prompts: list[ProbePrompt], *, api: ApiKind, model: str | None,
    max_new_tokens: int, timeout_s: float,
) -> list[ProbeOutput]:
    """Every prompt's greedy output through the load generator (OpenAI APIs: text only)."""
    load = await run_load(
        session=session,
        base_url=base_url,
        api=api,
        items=[WorkItem(prompt_id=p.id, text=p.text) for p in prompts],
        concurrency=1,
        sampling=Sampling(max_new_tokens=max_new_tokens, temperature=0.0, seed=0, ignore_eos=True),
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
    return [ProbeOutput(prompt_id=r.prompt_id, output_ids=r.output_ids, text=r.output_text) for r in load.records]
