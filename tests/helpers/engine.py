"""What every engine test shares: one reference-engine config, one wait, one environ reader.

The waiting and environ reading are the production helpers themselves. The NCCL settings and
the port check are the engine lifecycle tests' own.
"""

from __future__ import annotations

import psutil

from serving.engine.audit import read_environ
from serving.engine.config import EngineConfig
from serving.waiting import wait_until

__all__ = [
    "NCCL_ENV",
    "SPECULATIVE",
    "alive",
    "listening",
    "processes_with_marker",
    "read_environ",
    "reference_config",
    "wait_until",
]

NCCL_ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "4194304", "NCCL_DEBUG": "INFO"}
"""The NCCL settings the engine lifecycle tests launch with and the audit must find everywhere."""

SPECULATIVE = dict(
    speculative_algorithm="EAGLE3",
    speculative_draft_model_path="ref-tiny-draft",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)
"""The reference engine's CPU preset with SGLang's default chain (3 steps, top-k 1, 4 tokens)."""


def reference_config(
    *,
    tp_size: int = 1,
    speculative: bool = False,
    env: dict[str, str] | None = None,
    extra_args: dict | None = None,
    enable_metrics: bool = False,
) -> EngineConfig:
    """The smallest reference engine (CPU preset ``ref-tiny``), optionally speculative, with /metrics."""
    flags = {**({"enable_metrics": True} if enable_metrics else {}), **(extra_args or {})}
    return EngineConfig(
        kind="reference", model_path="ref-tiny", tp_size=tp_size, env=env or {}, extra_args=flags,
        **(SPECULATIVE if speculative else {}),
    )


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live processes whose start-up environment has SPECTUNE_TEST_MARKER=marker: a test
    counts exactly its own engines, whatever else runs on the machine."""
    found = []
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if read_environ(proc.pid).get("SPECTUNE_TEST_MARKER") == marker:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def listening(port: int) -> bool:
    """Whether anything on this machine listens on TCP ``port``."""
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )
