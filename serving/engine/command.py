"""EngineConfig -> the exact command line and environment of an engine.

One renderer for SGLang (``python -m sglang.launch_server``) and the reference engine
(``python -m serving.reference``): they take the same flag names. Host and port are inputs,
chosen by whoever owns the machine, never parsed back out of argv.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from serving.engine.config import EngineConfig, FlagValue
from serving.redaction import redacted_env

__all__ = ["DIST_INIT_ADDR_AT_LAUNCH", "EngineCommand", "build_command", "engine_managed_env", "render_flags"]

ENGINE_MODULES = {"sglang": "sglang.launch_server", "reference": "serving.reference"}
"""The Python module each engine kind runs as (``python -m MODULE``)."""


@dataclass(frozen=True)
class EngineCommand:
    """A fully rendered engine launch.

    Attributes:
        argv: The command line, program first.
        env: The variables this configuration adds to the launching environment (not the whole
            environment: the engine inherits the rest from whoever starts it).
        host: The address the engine binds.
        port: The port the engine listens on.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 30000

    @property
    def url(self) -> str:
        """Base URL of the engine's HTTP API."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def redacted_env(self) -> dict[str, str]:
        """``env`` with the values of secret-looking variables replaced (``serving.redaction``)."""
        return redacted_env(self.env)

    def shell(self, *, redacted: bool = False) -> str:
        """One copy-pasteable shell line that reproduces this launch by hand.

        Args:
            redacted: Replace the values of secret-looking variables (the line then no longer
                reproduces the launch exactly; the placeholder says so).
        """
        env = self.redacted_env() if redacted else self.env
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{assignments} {cmd}" if assignments else cmd

    def to_dict(self, *, redacted: bool = True) -> dict[str, Any]:
        """JSON-ready ``{"argv", "env", "url"}``, secrets redacted unless ``redacted=False``."""
        return {
            "argv": list(self.argv),
            "env": self.redacted_env() if redacted else dict(self.env),
            "url": self.url,
        }


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def render_flags(flags: Mapping[str, FlagValue | None]) -> list[str]:
    """Render ``{name: value}`` as SGLang-style argv.

    ``True`` is a bare flag, ``False`` and ``None`` are left out, lists become one flag followed by
    each value (argparse ``nargs``), everything else is ``--name value``.
    """
    argv: list[str] = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append(_flag(name))
        elif isinstance(value, list):
            argv.append(_flag(name))
            argv.extend(str(v) for v in value)
        else:
            argv.extend([_flag(name), str(value)])
    return argv


DIST_INIT_ADDR_AT_LAUNCH = "NODE_RANK_0_IP:PORT"
"""What a shown command of an engine across nodes has for ``--dist-init-addr``: node rank 0's host
picks the real one at launch."""


def build_command(
    config: EngineConfig, *, host: str = "127.0.0.1", port: int, python: str | None = None,
    node_rank: int = 0, dist_init_addr: str | None = None,
) -> EngineCommand:
    """Render ``config`` as the command that starts its engine (``--enable-metrics`` on unless
    ``extra_args`` turns it off).

    Args:
        config: The engine configuration.
        host: Address to bind.
        port: Port to listen on (chosen by the caller).
        python: Interpreter to run the engine module with (default: this one).
        node_rank: This node's ``--node-rank`` when the engine spans ``config.nnodes`` > 1 nodes.
        dist_init_addr: ``--dist-init-addr``: node rank 0's ``host:port``, the same in every node's
            command (``EngineHost.rendezvous_address``); default :data:`DIST_INIT_ADDR_AT_LAUNCH`,
            for a command only shown.

    Raises:
        ValueError: ``node_rank`` is outside ``[0, nnodes)``.
    """
    if config.nnodes > 1 and dist_init_addr is None:
        dist_init_addr = DIST_INIT_ADDR_AT_LAUNCH
    if not 0 <= node_rank < config.nnodes:
        raise ValueError(f"node_rank={node_rank} is outside [0, nnodes={config.nnodes})")
    flags: dict[str, FlagValue | None] = {
        "model_path": config.model_path,
        "tp_size": config.tp_size,
        "host": host,
        "port": port,
    }
    if config.speculative:
        flags.update(
            speculative_algorithm=config.speculative_algorithm,
            speculative_draft_model_path=config.speculative_draft_model_path,
            speculative_num_steps=config.speculative_num_steps,
            speculative_eagle_topk=config.speculative_eagle_topk,
            speculative_num_draft_tokens=config.speculative_num_draft_tokens,
        )
    if config.nnodes > 1:
        flags.update(nnodes=config.nnodes, node_rank=node_rank, dist_init_addr=dist_init_addr)
    flags["disable_custom_all_reduce"] = config.disable_custom_all_reduce
    flags["enforce_disable_flashinfer_allreduce_fusion"] = config.enforce_disable_flashinfer_allreduce_fusion
    flags["reference_gpu_kind"] = config.reference_gpu_kind
    flags["reference_mscclpp_installed"] = config.reference_mscclpp_installed
    flags["enable_metrics"] = True
    flags.update(config.extra_args)
    argv = [python or sys.executable, "-m", ENGINE_MODULES[config.kind], *render_flags(flags)]
    return EngineCommand(argv=argv, env=dict(config.env), host=host, port=port)


def engine_managed_env(config: EngineConfig, *, launch_env: Mapping[str, str]) -> dict[str, str | None]:
    """Variables the engine sets itself before spawning its TP workers, as the audit expects them.

    Follows SGLang 0.5.23's ``_set_envs_and_config`` (``sglang/srt/entrypoints/engine.py``), which
    decides each from the flags and the launching environment; ``None`` means "present, any value".

    Args:
        config: The engine configuration (its flags decide the rule).
        launch_env: The environment the engine's server process was started with
            (``EngineProcess.launch_env``).

    Returns:
        ``NCCL_CUMEM_ENABLE``, ``NCCL_NVLS_ENABLE`` and ``CUDA_DEVICE_MAX_CONNECTIONS`` with the
        values expected in the TP workers' start-up environment.
    """
    args = config.extra_args
    symm_mem = bool(args.get("enable_symm_mem"))
    nvls = bool(args.get("enable_nccl_nvls"))
    cumem: str | None
    if symm_mem:
        cumem = "1"
    elif "NCCL_CUMEM_ENABLE" in launch_env:
        cumem = launch_env["NCCL_CUMEM_ENABLE"]
    elif args.get("moe_a2a_backend") == "deepep_v2":
        cumem = "1"
    elif args.get("enable_kv_cache_sharding") or config.nnodes > 1:
        cumem = None
    else:
        cumem = "0"
    if nvls or symm_mem:
        nvls_value: str | None = "1"
    else:
        nvls_value = launch_env.get("NCCL_NVLS_ENABLE", "0")
    return {"NCCL_CUMEM_ENABLE": cumem, "NCCL_NVLS_ENABLE": nvls_value, "CUDA_DEVICE_MAX_CONNECTIONS": None}
