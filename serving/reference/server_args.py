"""Command-line arguments: SGLang's flag names, SGLang's speculative rules, resolved once.

``parse_args`` turns argv into a frozen ``ServerArgs`` whose every field is final: the auto choices
(speculative triple, max running requests, device, dtype, context length) are made here and each
automatic change is logged once as a warning naming the field, as SGLang does. Bad flags and bad
values exit with status 2 and a message naming the flag (argparse's convention).

Flags SGLang has that mean nothing here (memory fraction, CUDA graphs, attention backend, ...)
are accepted so the same command line works for both engines; they are recorded in
``/server_info`` and logged as having no effect.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any, Optional, Sequence

from serving.reference.config import PRESETS, get_preset, resolve_draft_layers

__all__ = ["NO_EFFECT_FLAGS", "ServerArgs", "build_parser", "parse_args", "resolve"]

logger = logging.getLogger(__name__)

SUPPORTED_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3")
DEFAULT_MAX_RUNNING_WITH_SPEC = 48

# SGLang flags accepted for command-line compatibility; they change nothing here.
NO_EFFECT_FLAGS: dict[str, dict[str, Any]] = {
    "mem_fraction_static": {"type": float},
    "trust_remote_code": {"action": "store_true"},
    "disable_cuda_graph": {"action": "store_true"},
    "cuda_graph_max_bs": {"type": int},
    "chunked_prefill_size": {"type": int},
    "attention_backend": {"type": str},
    "disable_radix_cache": {"action": "store_true"},
    "enable_torch_compile": {"action": "store_true"},
    "kv_cache_dtype": {"type": str},
    "schedule_policy": {"type": str},
    "page_size": {"type": int},
    "disable_overlap_schedule": {"action": "store_true"},
    "log_requests": {"action": "store_true"},
    "show_time_cost": {"action": "store_true"},
}


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """The resolved server configuration (field names are SGLang's ``ServerArgs`` names)."""

    model_path: str
    tokenizer_path: str
    served_model_name: str
    tp_size: int
    host: str
    port: int
    device: str
    dtype: str
    random_seed: int
    context_length: int
    max_running_requests: int
    max_prefill_tokens: int
    speculative_algorithm: Optional[str]
    speculative_draft_model_path: Optional[str]
    speculative_num_steps: Optional[int]
    speculative_eagle_topk: Optional[int]
    speculative_num_draft_tokens: Optional[int]
    speculative_draft_layers: Optional[int]
    enable_metrics: bool
    disable_custom_all_reduce: bool
    enable_symm_mem: bool
    enable_nccl_nvls: bool
    decode_log_interval: int
    dist_init_addr: Optional[str]
    skip_server_warmup: bool
    log_level: str
    no_effect: dict[str, Any]

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    def to_dict(self) -> dict[str, Any]:
        """Flat dict for ``/server_info`` (no-effect flags included under their own names)."""
        out = dataclasses.asdict(self)
        out.update(out.pop("no_effect"))
        return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        """Exit 2 with the usage line and the message, like argparse, minus the stack."""
        self.print_usage()
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (SGLang's flag names; ``--help`` lists the presets)."""
    p = _Parser(
        prog="python -m serving.reference",
        allow_abbrev=False,  # an abbreviation could silently set a flag spectune manages
        usage="%(prog)s --model-path PRESET [--tp-size N] [--speculative-algorithm EAGLE3 ...] [SGLang flags]",
        description=(
            "spectune's reference engine: a small speculative-decoding LLM server with "
            "sglang.launch_server's flags and HTTP API. Presets: "
            + ", ".join(f"{name} ({preset.description})" for name, preset in PRESETS.items())
        ),
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True, help="Preset name.")
    p.add_argument("--tokenizer-path", default=None, help="Ignored beyond /server_info (byte tokenizer).")
    p.add_argument("--served-model-name", default=None, help="Name in /v1/models (default: --model-path).")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="Default: cuda if available, else cpu.")
    p.add_argument("--dtype", default="auto", help="auto (the preset's), float64, float32, bfloat16, float16.")
    p.add_argument("--random-seed", type=int, default=None, help="Weight seed (default: the preset's).")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--speculative-algorithm", "--speculative-algo", dest="speculative_algorithm", default=None)
    p.add_argument(
        "--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None
    )
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-custom-all-reduce", action="store_true", help="Recorded; no custom all-reduce exists here.")
    p.add_argument("--enable-symm-mem", action="store_true", help="Sets NCCL_CUMEM_ENABLE=1 as SGLang does.")
    p.add_argument("--enable-nccl-nvls", action="store_true", help="Sets NCCL_NVLS_ENABLE=1 as SGLang does.")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--dist-init-addr", default=None, help="host:port for torch.distributed (default: a free port).")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    for name, kwargs in NO_EFFECT_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=argparse.SUPPRESS, **kwargs)
    return p


def parse_args(argv: Optional[Sequence[str]] = None, *, cuda_available: Optional[bool] = None,
               cuda_device_count: Optional[int] = None) -> ServerArgs:
    """argv -> resolved ``ServerArgs``; exits 2 with a message naming the flag on bad input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return resolve(ns, cuda_available=cuda_available, cuda_device_count=cuda_device_count)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: error() exits


def _cuda_info() -> tuple[bool, int]:
    import torch

    available = torch.cuda.is_available()
    return available, torch.cuda.device_count() if available else 0


def resolve(
    ns: argparse.Namespace, *, cuda_available: Optional[bool] = None, cuda_device_count: Optional[int] = None
) -> ServerArgs:
    """Apply SGLang's defaults and rules; raise ``ValueError`` naming the flag on a conflict."""
    preset = get_preset(ns.model_path)
    if ns.tp_size < 1:
        raise ValueError(f"--tp-size must be at least 1, got {ns.tp_size}")
    preset.check_tp(ns.tp_size)
    if not 0 < ns.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {ns.port}")

    if cuda_available is None or cuda_device_count is None:
        cuda_available, cuda_device_count = _cuda_info()
    device = ns.device or ("cuda" if cuda_available else "cpu")
    if device == "cuda":
        if not cuda_available:
            raise ValueError("--device cuda was given but torch sees no CUDA device")
        if ns.tp_size > cuda_device_count:
            raise ValueError(
                f"--tp-size {ns.tp_size} needs {ns.tp_size} GPUs but {cuda_device_count} are visible "
                "(CUDA_VISIBLE_DEVICES); rank r uses visible device r"
            )

    dtype = preset.dtype if ns.dtype == "auto" else ns.dtype
    from serving.reference.model import dtype_from_name  # torch import deferred to here

    dtype_from_name(dtype)

    context_length = ns.context_length if ns.context_length is not None else preset.context_length
    if context_length < 2:
        raise ValueError(f"--context-length must be at least 2, got {context_length}")
    if ns.max_prefill_tokens < 1:
        raise ValueError(f"--max-prefill-tokens must be at least 1, got {ns.max_prefill_tokens}")
    if ns.decode_log_interval < 1:
        raise ValueError(f"--decode-log-interval must be at least 1, got {ns.decode_log_interval}")

    algorithm = ns.speculative_algorithm
    if algorithm is not None and algorithm.upper() == "NONE":
        algorithm = None
    steps, topk, draft_tokens = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    draft_path = ns.speculative_draft_model_path
    draft_layers = None
    max_running = ns.max_running_requests
    if algorithm is None:
        given = [
            flag
            for flag, value in (
                ("--speculative-draft-model-path", draft_path),
                ("--speculative-num-steps", steps),
                ("--speculative-eagle-topk", topk),
                ("--speculative-num-draft-tokens", draft_tokens),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} given without --speculative-algorithm (EAGLE or EAGLE3)")
    else:
        algorithm = algorithm.upper()
        if algorithm not in SUPPORTED_SPEC_ALGORITHMS:
            raise ValueError(
                f"--speculative-algorithm {ns.speculative_algorithm!r} is not supported by the reference "
                f"engine; use one of {', '.join(SUPPORTED_SPEC_ALGORITHMS)} (or NONE)"
            )
        if draft_path is None:
            draft_path = f"{preset.name}-draft"
            logger.warning("speculative_draft_model_path is not set; using %s (the preset's early exit)", draft_path)
        draft_layers = resolve_draft_layers(draft_path=draft_path, preset=preset)
        numbers = {"--speculative-num-steps": steps, "--speculative-eagle-topk": topk,
                   "--speculative-num-draft-tokens": draft_tokens}
        unset = [k for k, v in numbers.items() if v is None]
        if len(unset) == 3:
            steps, topk, draft_tokens = preset.auto_speculative
            logger.warning(
                "speculative_num_steps/speculative_eagle_topk/speculative_num_draft_tokens are unset; "
                "auto-chose (%d, %d, %d) for %s (SGLang's auto choice)",
                steps, topk, draft_tokens, preset.name,
            )
        elif unset:
            raise ValueError(
                f"set all three of --speculative-num-steps, --speculative-eagle-topk and "
                f"--speculative-num-draft-tokens, or none of them for the auto choice; missing: {', '.join(unset)}"
            )
        assert steps is not None and topk is not None and draft_tokens is not None
        if steps < 1:
            raise ValueError(f"--speculative-num-steps must be at least 1, got {steps}")
        if topk < 1:
            raise ValueError(f"--speculative-eagle-topk must be at least 1, got {topk}")
        if draft_tokens < 2:
            raise ValueError(f"--speculative-num-draft-tokens must be at least 2, got {draft_tokens}")
        if topk == 1 and draft_tokens != steps + 1:
            logger.warning(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1 (%d -> %d)", draft_tokens, steps + 1,
            )
            draft_tokens = steps + 1
        capacity = topk + (steps - 1) * topk * topk
        if draft_tokens - 1 > capacity:
            raise ValueError(
                f"--speculative-num-draft-tokens {draft_tokens} needs {draft_tokens - 1} candidates but a "
                f"tree of --speculative-num-steps {steps} and --speculative-eagle-topk {topk} holds "
                f"topk + (steps-1)*topk^2 = {capacity}; use at most {capacity + 1}"
            )
        if max_running is None:
            max_running = DEFAULT_MAX_RUNNING_WITH_SPEC
            logger.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override this "
                "by explicitly setting --max-running-requests."
            )
    if max_running is None:
        max_running = preset.default_max_running_requests
    if max_running < 1:
        raise ValueError(f"--max-running-requests must be at least 1, got {max_running}")

    no_effect = {name: getattr(ns, name) for name in NO_EFFECT_FLAGS}
    return ServerArgs(
        model_path=preset.name,
        tokenizer_path=ns.tokenizer_path or preset.name,
        served_model_name=ns.served_model_name or preset.name,
        tp_size=ns.tp_size,
        host=ns.host,
        port=ns.port,
        device=device,
        dtype=dtype,
        random_seed=ns.random_seed if ns.random_seed is not None else preset.seed,
        context_length=context_length,
        max_running_requests=max_running,
        max_prefill_tokens=ns.max_prefill_tokens,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=draft_path,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft_tokens,
        speculative_draft_layers=draft_layers,
        enable_metrics=ns.enable_metrics,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        enable_symm_mem=ns.enable_symm_mem,
        enable_nccl_nvls=ns.enable_nccl_nvls,
        decode_log_interval=ns.decode_log_interval,
        dist_init_addr=ns.dist_init_addr,
        skip_server_warmup=ns.skip_server_warmup,
        log_level=ns.log_level,
        no_effect=no_effect,
    )
