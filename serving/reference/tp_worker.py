"""One TP rank: a process started with multiprocessing *spawn* that owns a model shard.

A spawned worker inherits exactly the environment ``os.environ`` held when it was started, and
nothing set later (the same env-propagation behaviour as SGLang's scheduler processes). At start
it names itself (``ref::tp<rank>`` in /proc/<pid>/comm, like SGLang's ``sglang::scheduler_TP0``)
and logs the NCCL_* / CUDA_* / torch.distributed variables it sees, its rank and world size, so an
audit can tell the roles apart and read what each rank was given.

Values of secret-looking variables (``serving.redaction``: ``SPECTUNE_API_TOKEN``,
``NCCL_IB_SECRET_KEY``, ...) are logged and reported as a placeholder, never verbatim.

Rank 0 receives requests from the HTTP process over a pipe and broadcasts them to the other ranks
each iteration; every rank then runs the same scheduler step. Ranks are numbered globally: across
``--nnodes`` nodes, node r's engine process starts ranks ``[tp/N * r, tp/N * (r + 1))`` and rank
k uses device ``k % (tp/N)`` of its node, as SGLang does. Workers exit on a Shutdown message (rank
0 broadcasts it to every rank of every node), when their node's engine process dies
(PR_SET_PDEATHSIG with SIGKILL, plus a parent-pid check), or when a peer dies (the collective
fails). They ignore SIGINT and SIGTERM: a signal to the whole process group is handled by the
node's engine process, which then shuts the workers down in order.
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
from serving.reference.faults import EnvCondition
from serving.reference.server_args import ServerArgs

__all__ = ["WorkerConfig", "env_line", "run_worker", "set_process_name", "visible_env"]

logger = logging.getLogger(__name__)

_PR_SET_NAME = 15
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "GLOO_", "NVSHMEM_", "SPECTUNE_")
ENV_NAMES = ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
IDLE_HEARTBEAT_S = 0.5


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything a rank needs, picklable for spawn: the server's settings whole, plus what is
    this rank's own.

    The settings are the ``ServerArgs`` the command line resolved to, passed through unchanged, so
    a new flag reaches the workers without being copied here or in the launcher.

    Attributes:
        args: The resolved server settings (``--model-path``, ``--dtype``, the speculative
            numbers, ...); ``args.tp_size`` is the world size.
        rank: This worker's rank.
        init_method: torch.distributed rendezvous (``tcp://host:port``).
        parent_pid: This node's engine process; the worker exits if it goes away.
        torch_threads: Intra-op threads (CPU); 0 = auto.
        corrupt_allreduce_when: The ``corrupt_allreduce_when`` fault's condition, checked
            against this worker's own environment; None without the fault.
        die_after_steps: The ``die_after_steps`` fault's N on the rank that carries it out
            (its node's first), else None.
    """

    args: ServerArgs
    rank: int
    init_method: str
    parent_pid: int
    torch_threads: int = 0
    corrupt_allreduce_when: Optional[EnvCondition] = None
    die_after_steps: Optional[int] = None

    @property
    def world_size(self) -> int:
        return self.args.tp_size

    @property
    def local_rank(self) -> int:
        """The rank's index on its node: its CUDA device (SGLang's ``tp_rank % tp_size_per_node``)."""
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
        # Belt and braces where PDEATHSIG does not exist (non-Linux) or was lost.
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
    """What SGLang's every rank logs when its custom all-reduce turns itself off on this node
    (``serving.all_reduce_rules``), word for word, so the sweep reads the reference engine's log
    the way it reads SGLang's. There is no custom all-reduce kernel here: the collective is
    torch.distributed's either way."""
    from serving.all_reduce_rules import GpuKind, custom_all_reduce_off_line

    args = cfg.args
    if args.disable_custom_all_reduce:
        return
    line = custom_all_reduce_off_line(gpu_kind=GpuKind.parse(args.reference_gpu_kind), world_size=cfg.world_size)
    if line:
        logger.warning("%s", line)


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
    # Ctrl-C and a SIGTERM to the whole process group reach the workers too; the HTTP process
    # decides and shuts them down in order (a rank dying first would look like a crash).
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

    # One intra-op thread: the reference models' kernels are tiny, and on a 2-core VM two OpenMP
    # threads per worker made decoding ~10x slower than one (measured); TP ranks add cores.
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

    preset = get_preset(args.model_path)
    model = Model(preset=preset, seed=args.random_seed, comm=comm, device=device, dtype=dtype_from_name(args.dtype))
    if cfg.world_size > 1 and backend == "nccl":
        # First NCCL collective: communicator init happens here, where NCCL_DEBUG=INFO logs the
        # NCCL_* values this rank read.
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
    """The ``die_after_steps`` fault: this node's engine process and its ranks vanish at once
    (SIGKILL to the engine process; its ranks follow through PR_SET_PDEATHSIG), as a crashed node."""
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
    logger.warning("fault corrupt_allreduce_when:%s holds in this rank's environment: all-reduce results are corrupted", when)
    return CorruptedAllReduce(comm)
