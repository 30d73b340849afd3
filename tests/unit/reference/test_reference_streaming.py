"""Streamed chunks are rendered from the request as it was when the engine produced them: a
handler slower than the engine (a loaded machine) never sends a chunk that claims the end early."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serving.reference.engine_client import EngineClient, RequestState
from serving.reference.http_common import merged_updates


def _state(rid: str) -> RequestState:
    return RequestState(req=SimpleNamespace(rid=rid), created=0.0, queue=asyncio.Queue())  # type: ignore[arg-type]


def test_updates_queued_behind_the_finish_go_out_as_one_last_update() -> None:
    async def run() -> list[tuple[tuple[int, ...], bool]]:
        state = _state("a")
        for ids in ((1,), (2,), (3,)):  # the engine ran ahead of the handler: three updates queued
            state.queue.put_nowait(ids)
        state.output_ids[:] = [1, 2, 3]
        state.finish = {"type": "length", "length": 3}
        client = SimpleNamespace(abort=lambda rid: None)
        return [(ids, last) async for _, ids, last in EngineClient.updates(client, state)]  # type: ignore[arg-type]

    assert asyncio.run(run()) == [((1, 2, 3), True)]


class _LiveClient:
    """Each request yields a first token, then finishes before anyone reads the first update."""

    async def updates(self, state: RequestState):
        state.output_ids.append(7)
        yield state, (7,), False
        state.output_ids.append(8)
        state.finish = {"type": "length", "length": 2}
        yield state, (8,), True

    def abort(self, rid: str) -> None:  # pragma: no cover - nothing is left to abort here
        pass


def test_a_merged_stream_renders_each_update_as_it_arrives() -> None:
    def render(index: int, rs: RequestState, new_ids: tuple[int, ...], last: bool) -> tuple:
        return index, list(rs.output_ids), rs.finished

    async def run(snapshot) -> list:
        states = [_state("a"), _state("b")]
        return [item async for item, *_ in _shots(merged_updates(_LiveClient(), states, snapshot=snapshot))]

    async def _shots(stream):
        async for index, shot, new_ids, last in stream:
            yield shot, new_ids, last

    rendered = asyncio.run(run(render))
    assert sorted(rendered) == [(0, [7], False), (0, [7, 8], True), (1, [7], False), (1, [7, 8], True)]
    live = asyncio.run(run(None))  # without a snapshot the first update is read after the finish
    assert all(rs.finished for rs in live), "the state is live: why the handler renders at arrival"
