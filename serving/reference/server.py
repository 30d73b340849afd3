"""Server lifecycle of node rank 0: bind the port, spawn the TP workers, warm up, serve, shut down.

The port is bound at once (health routes 503 until ready); the workers are spawned after the
environment is set as SGLang sets it; after one warm-up request the log says "The server is fired
up and ready to roll!". Exit status: 0 after SIGTERM/SIGINT, 1 when a worker fails or dies. See
docs/reference-engine.md ("Processes").
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Callable, Optional

from aiohttp import web

from serving.redaction import redacted_env
from serving.reference.engine_client import EngineClient
from serving.reference.faults import Faults
from serving.reference.http_common import AppState
from serving.reference.http_server import build_app
from serving.reference.launcher import WorkerGroup, WorkerStartError
from serving.reference.metrics import ReferenceMetrics
from serving.reference.protocol import GenerateReq, WorkerReady
from serving.reference.sampling import SamplingParams
from serving.reference.server_args import ServerArgs
from serving.reference.tokenizer import ByteTokenizer

__all__ = ["attach_engine", "new_state", "prepare_environment", "runner", "serve", "warm_up"]

logger = logging.getLogger(__name__)

WORKER_READY_TIMEOUT_S = 900.0
SHUTDOWN_TIMEOUT_S = 2.0


def prepare_environment(args: ServerArgs) -> dict[str, str]:
    """Set what SGLang sets before spawning its schedulers; return the values set.

    Follows SGLang 0.5.23's ``_set_envs_and_config`` (``srt/entrypoints/engine.py``).
    """
    changed: dict[str, str] = {}
    if "NCCL_CUMEM_ENABLE" not in os.environ or args.enable_symm_mem:
        changed["NCCL_CUMEM_ENABLE"] = str(int(args.enable_symm_mem))
    if "NCCL_NVLS_ENABLE" not in os.environ or args.enable_nccl_nvls or args.enable_symm_mem:
        changed["NCCL_NVLS_ENABLE"] = str(int(args.enable_nccl_nvls or args.enable_symm_mem))
    changed["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    os.environ.update(changed)
    logger.info("environment set for the workers (as SGLang does): %s", redacted_env(changed))
    return changed


def new_state(args: ServerArgs) -> AppState:
    """The HTTP side's state before any worker exists (every route answers; generation 503s)."""
    from serving.reference.config import get_preset

    preset = get_preset(args.model_path)
    metrics = ReferenceMetrics(model_name=args.served_model_name) if args.enable_metrics else None
    return AppState(args=args, tokenizer=ByteTokenizer(vocab_size=preset.vocab_size), metrics=metrics)


def runner(app: web.Application) -> web.AppRunner:
    """An app runner that shuts down fast and cancels a handler whose client went away."""
    return web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S, handler_cancellation=True)


def attach_engine(
    state: AppState,
    workers: WorkerGroup,
    ready: list[WorkerReady],
    *,
    die_after_tokens: Optional[int],
    on_fatal: Callable[[str], None],
    loop: asyncio.AbstractEventLoop,
) -> EngineClient:
    """Connect the HTTP side to ready workers (generation works; ``state.ready`` is still False)."""
    args = state.args
    state.worker_info = workers.worker_info()
    state.max_total_num_tokens = ready[0].max_total_num_tokens
    state.decode_cuda_graph_bs = ready[0].decode_cuda_graph_bs
    state.graph_memory_gb = ready[0].graph_memory_gb
    if state.metrics is not None:
        state.metrics.set_max_total_num_tokens(state.max_total_num_tokens)
    client = EngineClient(
        workers=workers,
        num_draft_tokens=args.speculative_num_draft_tokens if args.speculative else None,
        metrics=state.metrics,
        die_after_tokens=die_after_tokens,
        on_fatal=on_fatal,
        drop_fields=state.drop_fields,
    )
    client.start(loop)
    state.client = client
    return client


async def warm_up(client: EngineClient) -> bool:
    """One short greedy generation; whether it finished (not aborted by a failing worker)."""
    req = GenerateReq(
        rid="WARMUP",
        input_ids=tuple(ByteTokenizer(vocab_size=264).encode("The capital city of France is")),
        params=SamplingParams(max_new_tokens=8, temperature=0.0),
        seed=0,
        is_health_check=True,
    )
    finish: Optional[dict] = None
    async for rs, _, last in client.generate(req):
        if last:
            finish = rs.finish
    return finish is not None and finish.get("type") != "abort"


def _armed_die_after_tokens(faults: Faults) -> Optional[int]:
    """``die_after_tokens``'s N if it applies to this (the server) process's environment."""
    count = faults.tokens_before_death(os.environ)
    when = faults.die_after_tokens_when
    if faults.die_after_tokens is not None and when is not None:
        if count is None:
            logger.warning("fault die_after_tokens:%d@%s: the condition does not hold here; off", faults.die_after_tokens, when)
        else:
            logger.warning("fault die_after_tokens:%d@%s: the condition holds here; armed", count, when)
    return count


async def serve(args: ServerArgs, *, faults: Faults) -> int:
    """Run the server until a signal (exit 0) or a fatal error (exit 1)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    exit_code = 0

    def request_stop(code: int, why: str) -> None:
        nonlocal exit_code
        if not stop.is_set():
            exit_code = code
            (logger.error if code else logger.info)("%s", why)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop, 0, f"received {signal.Signals(sig).name}; shutting down")

    started = time.monotonic()
    state = new_state(args)
    if faults.drop_fields:
        state.drop_fields = faults.drop_fields
        logger.warning("fault drop_field: /server_info and meta_info never carry %s", ", ".join(faults.drop_fields))
    app_runner = runner(build_app(state))
    await app_runner.setup()
    site = web.TCPSite(app_runner, host=args.host, port=args.port)
    try:
        await site.start()
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        await app_runner.cleanup()
        return 1
    logger.info("HTTP server listening on http://%s:%d (503 until the model is ready)", args.host, args.port)

    workers = WorkerGroup.with_faults(args=args, faults=faults)
    client: Optional[EngineClient] = None
    try:
        prepare_environment(args)
        workers.start()
        if faults.hang_on_start:
            logger.warning("fault hang_on_start: the server will never become healthy")
            await stop.wait()
            return exit_code
        wait_task = loop.run_in_executor(None, lambda: workers.wait_ready(timeout_s=WORKER_READY_TIMEOUT_S))
        stop_task = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({wait_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if stop_task in done:
            return exit_code
        stop_task.cancel()
        try:
            ready = wait_task.result()
        except WorkerStartError as exc:
            logger.error("TP workers failed to start: %s", exc)
            return 1
        client = attach_engine(
            state, workers, ready, die_after_tokens=_armed_die_after_tokens(faults),
            on_fatal=lambda why: request_stop(1, why), loop=loop,
        )
        warmed = args.skip_server_warmup or await warm_up(client)
        if stop.is_set():  # a worker failed (exit 1) or a signal came (exit 0) during warm-up
            return exit_code
        if not warmed:
            logger.error("the warm-up request was aborted; the server cannot serve")
            return 1
        state.startup_time = time.monotonic() - started
        state.ready = True
        logger.info(
            "The server is fired up and ready to roll! (%s, tp_size=%d, nnodes=%d, device=%s, workers %s)",
            args.model_path,
            args.tp_size,
            args.nnodes,
            args.device,
            ", ".join(f"{w['process_name']}={w['pid']}" for w in state.worker_info),
        )
        await stop.wait()
        return exit_code
    finally:
        state.ready = False
        if client is not None:
            client.stop()
        await site.stop()
        await loop.run_in_executor(None, lambda: workers.stop(grace_s=5.0))
        await app_runner.cleanup()
        logger.info("server stopped; port %d released", args.port)
