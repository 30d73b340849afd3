"""One TP rank: a spawned process that owns a model shard and runs the scheduler.

It names itself ``ref::tp<rank>`` and logs the communication variables it sees (secrets
redacted). Rank 0 takes requests from the HTTP process over a pipe and broadcasts them, so every
rank runs the same scheduler step. See docs/reference-engine.md ("Processes").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Optional

from serving.pdeathsig import set_parent_death_signal
from serving.redaction import redacted_env
from serving.reference.faults import CORRUPTION, EnvCondition
from serving.reference.server_args import ServerArgs

__all__ = ["WorkerConfig", "env_line", "run_worker", "set_process_name", "visible_env"]

logger = logging.getLogger(__name__)

_PR_SET_NAME = 15
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "GLOO_", "NVSHMEM_", "SPECTUNE_")
ENV_NAMES = ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
IDLE_HEARTBEAT_S = 0.5


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything a rank needs, picklable for spawn: the server's settings and this rank's own.

    Attributes:
        args: The resolved server settings; ``args.tp_size`` is the world size.
        rank: This worker's global rank.
        init_method: torch.distributed rendezvous (``tcp://host:port``).
        parent_pid: This node's engine process; the worker exits if it goes away.
        torch_threads: Intra-op threads (CPU); 0 = auto.
        corrupt_allreduce_when: The ``corrupt_allreduce_when`` fault's condition, or None.
        die_after_steps: The ``die_after_steps`` fault's N on the rank that carries it out, else None.
        corruption_share: ``corrupt_allreduce_when``'s share of the neighbour added.
        perturb_verify: The ``perturb_verify`` fault's relative size, or None.
        pcie_ipc_build_fails: The ``pcie_ipc_build_fails`` fault: the PCIe-IPC workspace build fails.
    """

    args: ServerArgs
    rank: int
    init_method: str
    parent_pid: int
    torch_threads: int = 0
    corrupt_allreduce_when: Optional[EnvCondition] = None
    die_after_steps: Optional[int] = None
    corruption_share: float = CORRUPTION
    perturb_verify: Optional[float] = None
    pcie_ipc_build_fails: bool = False

    @property
    def world_size(self) -> int:
        return self.args.tp_size

    @property
    def local_rank(self) -> int:
        """The rank's index on its node, which is its CUDA device."""
        return self.rank % self.args.ranks_per_node

    @property
    def process_name(self) -> str:
        return f"ref::tp{self.rank}"


def set_process_name(name: str) -> None:
    """Set /proc/self/comm (15 bytes max) so ``ps`` and audits can tell roles apart."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except OSError:
        logger.debug("prctl(PR_SET_NAME) unavailable", exc_info=True)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent exits; exit now if it already has."""
    if not set_parent_death_signal(signal.SIGKILL, expected_parent=parent_pid):
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable; relying on the parent-pid watch")

    def watch() -> None:
        # For where PDEATHSIG does not exist or was lost.
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def visible_env(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The variables that matter to communication, as this process sees them, secrets redacted."""
    source = os.environ if environ is None else environ
    return redacted_env(
        {k: v for k, v in sorted(source.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    )


def env_line(env: dict[str, str]) -> str:
    """``NAME=value`` pairs for the start-up log line (values of secrets redacted)."""
    return " ".join(f"{k}={v}" for k, v in redacted_env(env).items()) or "(no NCCL_/CUDA_ variables)"


def _log_custom_all_reduce(cfg: WorkerConfig) -> None:
    """Log SGLang's per-rank lines about decode's all-reduce on the declared node: the opt-in
    communicators that come up or not (``opt_in_rank_lines``; PCIe-IPC where this rank's environment
    switches it on) and custom all-reduce turning itself off (``custom_all_reduce_off_lines``)."""
    from serving.all_reduce_rules import GpuKind, custom_all_reduce_off_lines, opt_in_rank_lines, pcie_ipc_switched_on

    args = cfg.args
    node = GpuKind.parse(args.reference_gpu_kind)
    for level, text in opt_in_rank_lines(gpu_kind=node, world_size=cfg.world_size, nnodes=args.nnodes,
                                         enable_mscclpp=args.enable_mscclpp,
                                         enable_torch_symm_mem=args.enable_torch_symm_mem,
                                         mscclpp_installed=args.reference_mscclpp_installed,
                                         enable_pcie_ipc=pcie_ipc_switched_on(os.environ)):
        getattr(logger, level)("%s", text)
    if args.disable_custom_all_reduce:
        return
    for line in custom_all_reduce_off_lines(gpu_kind=node, world_size=cfg.world_size, nnodes=args.nnodes):
        logger.warning("%s", line)


def _maybe_pcie_ipc(cfg: WorkerConfig, comm: Any) -> Any:
    """``comm`` behind SGLang's PCIe-IPC all-reduce (``parallel.PcieIpcStandIn``) where this rank's
    environment switches it on and, by ``serving.all_reduce_rules.decode_kernel`` on the declared node,
    it carries decode: no other kernel ahead of it takes the reductions. The emulated node's activations
    are taken as bf16 (what the kernel serves), whatever ``--dtype`` the toy model computes in."""
    from serving.all_reduce_rules import PCIE_IPC_MAX_NUMEL_ENV, GpuKind, decode_kernel, pcie_ipc_switched_on
    from serving.cuda_graph_rules import decode_backend_of
    from serving.reference.parallel import PcieIpcStandIn

    args = cfg.args
    if cfg.world_size == 1 or not pcie_ipc_switched_on(os.environ):
        return comm
    try:
        kernel, _ = decode_kernel(
            gpu_kind=GpuKind.parse(args.reference_gpu_kind), architecture=args.architecture, tp_size=cfg.world_size,
            disable_custom_all_reduce=args.disable_custom_all_reduce,
            enforce_disable_fusion=args.enforce_disable_flashinfer_allreduce_fusion,
            fusion_backend=args.flashinfer_allreduce_fusion_backend, nnodes=args.nnodes,
            enable_torch_symm_mem=args.enable_torch_symm_mem, enable_mscclpp=args.enable_mscclpp,
            enable_symm_mem=args.enable_symm_mem, enable_pcie_ipc=True,
            mscclpp_installed=args.reference_mscclpp_installed,
            cuda_graph=decode_backend_of(args.graph_flags) != "disabled")
    except ValueError:  # a fusion backend SGLang refuses: the server refused it before the workers started
        return comm
    if kernel != "pcie_ipc":
        return comm
    rows = args.max_running_requests * ((args.speculative_num_draft_tokens or 1) if args.speculative else 1)
    override = int(os.environ.get(PCIE_IPC_MAX_NUMEL_ENV) or 0)  # SGLang's EnvInt(0): 0 derives the bound
    return PcieIpcStandIn(comm, max_rows=rows, max_numel=override, fail=cfg.pcie_ipc_build_fails)


def _configure_logging(cfg: WorkerConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, cfg.args.log_level.upper(), logging.INFO),
        format=f"[%(asctime)s TP{cfg.rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def run_worker(cfg: WorkerConfig, conn: Connection) -> None:
    """Process entry point (the target of ``spawn``)."""
    set_process_name(cfg.process_name)
    _die_with_parent(cfg.parent_pid)
    # The engine process handles signals and shuts the workers down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _configure_logging(cfg)
    env = visible_env()
    logger.info(
        "worker %s starting: rank=%d world_size=%d node_rank=%d pid=%d device=%s env: %s",
        cfg.process_name,
        cfg.rank,
        cfg.world_size,
        cfg.args.node_rank,
        os.getpid(),
        cfg.args.device,
        env_line(env),
    )
    try:
        _serve(cfg, conn, env)
    except (EOFError, BrokenPipeError):
        logger.info("HTTP process went away; exiting")
        os._exit(0)
    except Exception as exc:  # noqa: BLE001 - report any failure to the parent, then exit non-zero
        logger.exception("worker rank %d failed", cfg.rank)
        try:
            from serving.reference.protocol import WorkerFailed

            conn.send(WorkerFailed(rank=cfg.rank, message=f"{type(exc).__name__}: {exc}"))
        except (OSError, EOFError):
            pass
        os._exit(1)
    os._exit(0)


def _serve(cfg: WorkerConfig, conn: Connection, env: dict[str, str]) -> None:
    import torch

    from serving.environ import ENV
    from serving.reference.config import get_preset
    from serving.reference.model import Model, dtype_from_name
    from serving.reference.parallel import SingleRank, TorchDistributed
    from serving.reference.protocol import (
        AbortReq,
        FlushDone,
        FlushReq,
        GenerateReq,
        Shutdown,
        Stats,
        TokenBatch,
        WorkerReady,
    )
    from serving.reference.scheduler import Scheduler
    from serving.reference.speculative import SpecConfig

    # One intra-op thread by default (docs/reference-engine.md, "Processes").
    args = cfg.args
    threads = cfg.torch_threads or ENV.SPECTUNE_REFERENCE_TORCH_THREADS.get() or 1
    torch.set_num_threads(threads)

    if args.device == "cuda":
        device = torch.device("cuda", cfg.local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if cfg.world_size > 1:
        comm: Any = TorchDistributed(
            rank=cfg.rank,
            world_size=cfg.world_size,
            init_method=cfg.init_method,
            backend=backend,
            device=device,
        )
    else:
        comm = SingleRank()
    distributed = comm
    comm = _maybe_corrupted(cfg, comm)
    _log_custom_all_reduce(cfg)
    comm = _maybe_pcie_ipc(cfg, comm)

    preset = get_preset(args.model_path)
    logger.info("Load weight begin.")  # SGLang's start-phase lines (serving.engine.start_phases reads them)
    tic = time.perf_counter()
    model = Model(preset=preset, seed=args.random_seed, comm=comm, device=device, dtype=dtype_from_name(args.dtype))
    logger.info("Load weight end. elapsed=%.2f s, type=%s, dtype=%s.", time.perf_counter() - tic, preset.name, args.dtype)
    if cfg.world_size > 1 and backend == "nccl":
        # First NCCL collective: NCCL_DEBUG=INFO logs the NCCL_* values read here.
        probe = torch.ones(1, device=device)
        comm.all_reduce(probe)
        torch.cuda.synchronize(device)
        logger.info("NCCL all-reduce probe: %s (expected %d)", float(probe), cfg.world_size)

    def push_stats(state: dict[str, Any]) -> None:
        if cfg.rank == 0:
            conn.send(Stats(internal_state=state))

    spec = None
    if args.speculative:
        spec = SpecConfig(
            num_steps=args.speculative_num_steps,
            topk=args.speculative_eagle_topk,
            num_draft_tokens=args.speculative_num_draft_tokens,
            draft_layers=args.speculative_draft_layers,
        )
    if args.eager_decode_reason:
        # On the CPU eager is the only way (info); on a GPU it is a stand-in's gap (a warning).
        logger.log(logging.WARNING if args.device == "cuda" else logging.INFO, "%s", args.eager_decode_reason)
    scheduler = Scheduler(
        model=model,
        spec=spec,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        max_prefill_tokens=args.max_prefill_tokens,
        decode_log_interval=args.decode_log_interval,
        log_stats=cfg.rank == 0,
        on_stats=push_stats,
        decode_graphs=args.decode_graph_plan() if args.captures_decode_graphs else None,
        perturb_verify=cfg.perturb_verify,
    )
    graphs = scheduler.graphs
    conn.send(
        WorkerReady(
            rank=cfg.rank,
            world_size=cfg.world_size,
            pid=os.getpid(),
            device=str(device),
            backend=backend if cfg.world_size > 1 else "none",
            process_name=cfg.process_name,
            env=env,
            max_total_num_tokens=args.max_running_requests * args.context_length,
            decode_cuda_graph_bs=tuple(scheduler.decode_cuda_graph_bs),
            graph_memory_gb=graphs.memory_gb if graphs else 0.0,
            graph_capture_s=graphs.capture_seconds if graphs else 0.0,
        )
    )
    logger.info("rank %d of %d ready (%d torch threads)", cfg.rank, cfg.world_size, threads)

    steps = 0
    while True:
        events: Optional[list[Any]] = None
        if cfg.rank == 0:
            timeout = 0.0 if scheduler.has_work else IDLE_HEARTBEAT_S
            if conn.poll(timeout):
                events = [conn.recv()]
                while conn.poll(0):
                    events.append(conn.recv())
        if cfg.world_size > 1:
            events = comm.broadcast_object(events)
        outputs = []
        stop = False
        for event in events or ():
            if isinstance(event, GenerateReq):
                outputs.extend(scheduler.submit(event))
            elif isinstance(event, AbortReq):
                outputs.extend(scheduler.abort(event.rid))
            elif isinstance(event, FlushReq):
                ok, message = scheduler.flush()
                if cfg.rank == 0:
                    conn.send(FlushDone(success=ok, message=message, internal_state=scheduler.internal_state()))
            elif isinstance(event, Shutdown):
                stop = True
        if stop:
            logger.info("shutdown requested; rank %d exiting", cfg.rank)
            break
        if scheduler.has_work:
            outputs.extend(scheduler.step())
            steps += 1
            if cfg.die_after_steps is not None and steps >= cfg.die_after_steps:
                _kill_node(cfg, steps)
        if cfg.rank == 0 and outputs:
            conn.send(
                TokenBatch(
                    outputs=tuple(outputs),
                    num_running_reqs=len(scheduler.running),
                    num_queue_reqs=len(scheduler.waiting),
                )
            )
    if isinstance(distributed, TorchDistributed):
        distributed.destroy()


def _kill_node(cfg: WorkerConfig, steps: int) -> None:
    """The ``die_after_steps`` fault: SIGKILL this node's engine process (its ranks follow)."""
    logger.error(
        "fault die_after_steps:%d: node_rank %d's ranks have run %d steps; killing this node's engine process "
        "(pid %d) and its ranks %s with SIGKILL", cfg.die_after_steps, cfg.args.node_rank, steps, cfg.parent_pid,
        list(cfg.args.node_tp_ranks),
    )
    logging.shutdown()
    sys.stderr.flush()
    if os.getppid() == cfg.parent_pid:  # never a pid reused after the engine process went away
        os.kill(cfg.parent_pid, signal.SIGKILL)
    os._exit(1)


def _maybe_corrupted(cfg: WorkerConfig, comm: Any) -> Any:
    """``comm``, wrapped by the ``corrupt_allreduce_when`` fault where this rank's env matches."""
    when = cfg.corrupt_allreduce_when
    if when is None:
        return comm
    if not when.holds(os.environ):
        logger.info("fault corrupt_allreduce_when:%s does not hold in this rank's environment; off", when)
        return comm
    from serving.reference.faults import CorruptedAllReduce

    if cfg.world_size == 1:
        logger.warning("fault corrupt_allreduce_when:%s: --tp-size 1 has no all-reduce; nothing is corrupted", when)
        return comm
    logger.warning("fault corrupt_allreduce_when:%s holds in this rank's environment: all-reduce results are corrupted "
                   "(share %g of the neighbour added)", when, cfg.corruption_share)
    return CorruptedAllReduce(comm, cfg.corruption_share)
