"""Helpers for engine lifecycle tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import psutil

from serving.engine.config import EngineConfig

NCCL_ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "4194304", "NCCL_DEBUG": "INFO"}


def reference_config(*, tp_size: int = 1, env: dict[str, str] | None = None, speculative: bool = False,
                     extra_args: dict | None = None) -> EngineConfig:
    """The smallest reference engine: CPU preset, optionally speculative."""
    spec = (
        dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path="ref-tiny-draft",
            speculative_num_steps=2,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=3,
        )
        if speculative
        else {}
    )
    return EngineConfig(
        kind="reference", model_path="ref-tiny", tp_size=tp_size, env=env or {}, extra_args=extra_args or {}, **spec
    )


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live processes whose start-up environment has SPECTUNE_TEST_MARKER=marker."""
    wanted = f"SPECTUNE_TEST_MARKER={marker}".encode()
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            with open(f"/proc/{proc.pid}/environ", "rb") as handle:
                if wanted in handle.read().split(b"\0"):
                    found.append(proc.pid)
        except (OSError, psutil.NoSuchProcess):
            continue
    return found


def listening(port: int) -> bool:
    """Whether anything on this machine listens on TCP ``port``."""
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )
