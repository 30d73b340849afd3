"""The bench harness reads every SGLang version's per-request speculative counters.

SGLang renamed ``meta_info``'s draft counters twice. The payloads below are what each version's
``/generate`` answers with for one speculative request of 17 tokens, 5 verify cycles,
``--speculative-num-draft-tokens 4`` (so 15 proposed drafts), 11 of them accepted; they follow the
code that builds them:

* newest (SGLang 0.5.23, ``srt/managers/tokenizer_manager.py``
  ``_calculate_spec_decoding_metrics``): ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts``
  / ``spec_correct_drafts_histogram`` only; a development version that had moved the function to
  ``tokenizer_manager_components/spec_decoding_meta.py`` (``fill_spec_decoding_meta``) also sent
  the previous names as "backward-compat aliases, remove in next release";
* the release before (same function, earlier): ``spec_accepted_drafts`` /
  ``spec_proposed_drafts`` / ``spec_accept_histogram``;
* older (the same ``_calculate_spec_decoding_metrics``, earlier):
  ``spec_accept_token_num`` / ``spec_draft_token_num``; that version also always sent
  ``spec_verify_ct`` and zeroed ``spec_accept_rate`` / ``spec_accept_length``, verify or not.

Every version since the renames sends the ``spec_*`` keys only once a verify cycle ran:
absent keys are "not reported", never zero.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from orchestrator.bench.loadgen import RequestRecord, Sampling, WorkItem, send_request
from orchestrator.bench.metrics import compute_repetition_metrics, spec_accept_rate_requests

COMMON = {"id": "r0", "finish_reason": {"type": "length", "length": 17}, "prompt_tokens": 6,
          "completion_tokens": 17, "cached_tokens": 0, "e2e_latency": 0.2}
NEWEST = {**COMMON, "spec_verify_ct": 5, "spec_accept_rate": 11 / 15, "spec_accept_length": 17 / 5,
          "spec_num_correct_drafts": 11, "spec_num_proposed_drafts": 15,
          "spec_correct_drafts_histogram": [0, 1, 2, 2],
          "spec_accepted_drafts": 11, "spec_proposed_drafts": 15, "spec_accept_histogram": [0, 1, 2, 2]}
NEXT = {k: v for k, v in NEWEST.items() if k not in ("spec_accepted_drafts", "spec_proposed_drafts",
                                                     "spec_accept_histogram")}
PREVIOUS = {**COMMON, "spec_verify_ct": 5, "spec_accept_rate": 11 / 15, "spec_accept_length": 17 / 5,
            "spec_accepted_drafts": 11, "spec_proposed_drafts": 15, "spec_accept_histogram": [0, 1, 2, 2]}
OLDER = {**COMMON, "spec_verify_ct": 5, "spec_accept_rate": 11 / 15, "spec_accept_length": 17 / 5,
         "spec_accept_token_num": 11, "spec_draft_token_num": 15}
NO_VERIFY_NEWEST = {**COMMON, "finish_reason": {"type": "length", "length": 1}, "completion_tokens": 1}
NO_VERIFY_OLDER = {**NO_VERIFY_NEWEST, "spec_verify_ct": 0, "spec_accept_rate": 0.0, "spec_accept_length": 0}


def replay(meta: dict[str, Any], *, stream: bool = False) -> RequestRecord:
    """Send one request with spectune's load generator to a server that answers with ``meta``
    exactly as SGLang's ``/generate`` would (a whole body, or an SSE stream ending in it)."""

    async def generate(request: web.Request) -> web.StreamResponse:
        body = {"text": "x" * meta["completion_tokens"], "output_ids": [1] * meta["completion_tokens"],
                "meta_info": meta}
        if not stream:
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = {**body, "meta_info": {**COMMON, "finish_reason": None, "completion_tokens": 1}}
        for event in (first, body):
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def run() -> RequestRecord:
        app = web.Application()
        app.router.add_post("/generate", generate)
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            return await send_request(
                session=session, base_url=str(server.make_url("")), api="generate",
                item=WorkItem(prompt_id="p", text="hello"), index=0, sampling=Sampling(max_new_tokens=17),
                stream=stream, model=None, timeout_s=30.0,
            )

    return asyncio.run(run())


@pytest.mark.parametrize("meta", [NEWEST, NEXT, PREVIOUS, OLDER], ids=["newest", "next", "previous", "older"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "sse"])
def test_every_spelling_gives_the_same_draft_counts(meta: dict[str, Any], stream: bool) -> None:
    record = replay(meta, stream=stream)
    assert record.error is None
    assert (record.spec_correct_drafts, record.spec_proposed_drafts) == (11, 15)
    assert record.spec_verify_ct == 5 and record.output_tokens == 17


@pytest.mark.parametrize("meta", [NO_VERIFY_NEWEST, NO_VERIFY_OLDER], ids=["newest", "older"])
def test_no_verify_cycle_is_absent_not_zero(meta: dict[str, Any]) -> None:
    record = replay(meta)
    assert record.error is None
    assert record.spec_correct_drafts is None and record.spec_proposed_drafts is None
    # the newest SGLang omits spec_verify_ct too; the older one sent 0
    assert record.spec_verify_ct == meta.get("spec_verify_ct")


def test_accept_rate_aggregates_across_spellings() -> None:
    """A run against a mixed fleet (or across an upgrade) still adds the counts up:
    (11 + 11 + 11) / (15 + 15 + 15), the request without a verify cycle left out."""
    records = [replay(m).model_copy(update={"index": i})
               for i, m in enumerate([NEWEST, PREVIOUS, OLDER, NO_VERIFY_NEWEST])]
    assert spec_accept_rate_requests(records) == pytest.approx(11 / 15)
    rep = compute_repetition_metrics(records=records, duration_s=1.0, concurrency=1, repetition=0,
                                     request_rate=None, accept_length_server=None, accept_length_tolerance=0.1)
    assert (rep.spec_correct_drafts, rep.spec_proposed_drafts) == (33, 45)
    assert rep.spec_accept_rate == pytest.approx(11 / 15)
    assert rep.flat()["spec_accept_rate"] == pytest.approx(11 / 15)
    # accept length from the requests that report spec_verify_ct: (3 * 17 - 3) / 15 cycles
    assert rep.accept_length_requests == pytest.approx((3 * 17 - 3) / 15)


def test_plain_server_reports_no_accept_rate() -> None:
    record = replay({**COMMON})
    assert spec_accept_rate_requests([record]) is None
