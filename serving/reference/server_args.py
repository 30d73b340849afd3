"""Command-line arguments: SGLang's flag names and speculative rules, resolved once.

``parse_args`` turns argv into a frozen ``ServerArgs`` whose every field is final; each automatic
choice is logged as a warning, as SGLang does. Bad flags and out-of-range values exit 2 with a
message naming the flag. Which flags exist and their bounds: docs/reference-engine.md
("Command line").
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
from typing import Any, Optional, Sequence

from serving.reference.checks import SEED_MAX, SEED_MIN, check_finite, check_int
from serving.reference.config import DTYPE_BYTES, DTYPE_NAMES, PRESETS, get_preset, resolve_draft_layers, scratch_columns
from serving.all_reduce_rules import GpuKind, predict, resolve_fusion_backend
from serving.cuda_graph_rules import DecodeGraphPlan
from serving.speculative_rules import FLAG_NAMES, chain_num_draft_tokens, speculative_problem

__all__ = ["DEFAULT_MEM_FRACTION_STATIC", "GRAPH_FLAGS", "INT_FLAG_BOUNDS", "NO_EFFECT_FLAGS", "REFERENCE_ONLY_FLAGS", "ServerArgs", "build_parser", "option_strings",
           "parse_args", "resolve"]

logger = logging.getLogger(__name__)

SUPPORTED_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3")
DEFAULT_MAX_RUNNING_WITH_SPEC = 48

REFERENCE_ONLY_FLAGS: dict[str, str] = {
    "--reference-gpu-kind": "the node whose all-reduce rule to follow and log (SGLang reads its node itself)",
    "--reference-mscclpp-installed": "whether --enable-mscclpp finds the mscclpp package (SGLang imports it itself)",
}
"""The reference engine's own flags (option string -> why it exists), the only ones SGLang lacks."""

DEFAULT_MEM_FRACTION_STATIC = 0.85
"""Share of a GPU's memory for weights and the static KV cache that decode CUDA graphs need."""

# SGLang's decode CUDA-graph flags, with its help text (effective on CUDA at --tp-size 1).
GRAPH_FLAGS: dict[str, dict[str, Any]] = {
    "cuda_graph_bs_decode": {"type": int, "nargs": "+",
                             "help": "Explicit list of batch sizes to capture for the decode cuda graph."},
    "cuda_graph_max_bs_decode": {"type": int, "help": "Maximum batch size captured for the decode cuda graph."},
    "cuda_graph_backend_decode": {"type": str, "choices": ["full", "breakable", "disabled"],
                                  "help": "Backend for the decode phase (here: full or disabled; breakable runs as full)."},
    "disable_decode_cuda_graph": {"action": "store_true",
                                  "help": "Disable the decode-phase CUDA graph. Convenience for "
                                  "--cuda-graph-backend-decode=disabled."},
    "disable_cuda_graph_padding": {"action": "store_true",
                                   "help": "Disable cuda graph when padding is needed. Still uses cuda graph when "
                                   "padding is not needed."},
    "disable_cuda_graph": {"action": "store_true",
                           "help": "Deprecated. Use --cuda-graph-backend-{decode,prefill}=disabled instead."},
    "mem_fraction_static": {"type": float,
                            "help": "Share of the GPU's memory for weights and the static KV cache that decode "
                            f"CUDA graphs need (default {DEFAULT_MEM_FRACTION_STATIC})."},
}

# SGLang flags accepted for command-line compatibility; they change nothing here.
NO_EFFECT_FLAGS: dict[str, dict[str, Any]] = {
    "trust_remote_code": {"action": "store_true"},
    "disable_prefill_cuda_graph": {"action": "store_true"},
    "cuda_graph_bs_prefill": {"type": int, "nargs": "+"},
    "cuda_graph_max_bs_prefill": {"type": int},
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

INT_FLAG_BOUNDS: dict[str, tuple[int, int]] = {
    "tp_size": (1, 1024),
    "nnodes": (1, 1024),
    "port": (1, 65535),
    "random_seed": (SEED_MIN, SEED_MAX),
    "max_running_requests": (1, 65536),
    "max_prefill_tokens": (1, 1 << 30),
    "decode_log_interval": (1, 1 << 30),
    "cuda_graph_max_bs_decode": (1, 65536),
    "cuda_graph_max_bs_prefill": (1, 65536),
    "chunked_prefill_size": (-1, 1 << 30),
    "page_size": (1, 65536),
}
"""Integer flags (by ``ServerArgs`` name) and their inclusive bounds."""


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """The resolved server configuration (field names are SGLang's ``ServerArgs`` names).

    Handed whole to the HTTP side and every TP rank; it crosses a spawn, so it holds plain values.
    """

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
    enforce_disable_flashinfer_allreduce_fusion: bool
    flashinfer_allreduce_fusion_backend: Optional[str]
    architecture: str
    reference_gpu_kind: str
    enable_symm_mem: bool
    enable_torch_symm_mem: bool
    enable_mscclpp: bool
    reference_mscclpp_installed: bool
    enable_nccl_nvls: bool
    decode_log_interval: int
    dist_init_addr: Optional[str]
    nnodes: int
    node_rank: int
    skip_server_warmup: bool
    log_level: str
    graph_flags: dict[str, Any]
    no_effect: dict[str, Any]
    gpu_memory_mib: Optional[float] = None

    def decode_graph_plan(self) -> DecodeGraphPlan:
        """SGLang's decode-graph plan for these flags on this GPU, cut at the request pool."""
        from serving.cuda_graph_rules import plan_decode_graphs

        flags = self.graph_flags
        return plan_decode_graphs(
            speculative=self.speculative, gpu_memory_mib=self.gpu_memory_mib, tp_size=self.tp_size,
            request_pool=self.max_running_requests,
            cuda_graph_bs_decode=flags.get("cuda_graph_bs_decode"),
            cuda_graph_max_bs_decode=flags.get("cuda_graph_max_bs_decode"),
            cuda_graph_backend_decode=flags.get("cuda_graph_backend_decode"),
            disable_decode_cuda_graph=bool(flags.get("disable_decode_cuda_graph")),
            disable_cuda_graph=bool(flags.get("disable_cuda_graph")),
            disable_cuda_graph_padding=bool(flags.get("disable_cuda_graph_padding")),
        )

    @property
    def eager_decode_reason(self) -> Optional[str]:
        """Why decode runs eagerly although SGLang would capture graphs here, else None."""
        if not self.decode_graph_plan().enabled:
            return None
        if self.device != "cuda":
            return "decode CUDA graphs need --device cuda; decode runs eagerly on the CPU"
        if self.tp_size > 1:
            return (
                f"decode CUDA graphs are not captured at --tp-size {self.tp_size} by the reference engine "
                "(capturing torch.distributed's all-reduce hung on torch 2.11); decode runs eagerly"
            )
        return None

    @property
    def scratch_cols(self) -> int:
        """KV columns past a request's prefix that one decode step or speculative cycle writes."""
        if not self.speculative:
            return 1
        assert self.speculative_num_steps and self.speculative_eagle_topk and self.speculative_num_draft_tokens
        return scratch_columns(num_steps=self.speculative_num_steps, eagle_topk=self.speculative_eagle_topk,
                               num_draft_tokens=self.speculative_num_draft_tokens)

    @property
    def captures_decode_graphs(self) -> bool:
        return self.decode_graph_plan().enabled and self.eager_decode_reason is None

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def ranks_per_node(self) -> int:
        """TP ranks on each node: SGLang's ``tp_size_per_node`` (``tp_size // nnodes``, no PP)."""
        return self.tp_size // self.nnodes

    @property
    def node_tp_ranks(self) -> range:
        """The global TP ranks this node runs (SGLang's ``_calculate_rank_ranges``, no PP)."""
        per_node = self.ranks_per_node
        return range(per_node * self.node_rank, per_node * (self.node_rank + 1))

    def to_dict(self) -> dict[str, Any]:
        """Flat dict for ``/server_info`` (no-effect flags included under their own names)."""
        out = dataclasses.asdict(self)
        out.pop("gpu_memory_mib")
        out.update(out.pop("graph_flags"))
        out.update(out.pop("no_effect"))
        return out


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (SGLang's flag names; ``--help`` lists the presets)."""
    p = argparse.ArgumentParser(
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
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="Default: cuda if available, else cpu.")
    p.add_argument("--dtype", default="auto", help="auto (the preset's), float64, float32, bfloat16, float16.")
    p.add_argument("--random-seed", type=int, default=None, help="Weight seed (default: the preset's).")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--speculative-algorithm", dest="speculative_algorithm", default=None)
    p.add_argument(
        "--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None
    )
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-custom-all-reduce", action="store_true", help="Recorded; no custom all-reduce exists here.")
    p.add_argument("--enforce-disable-flashinfer-allreduce-fusion", action="store_true",
                   help="As SGLang: no FlashInfer all-reduce fusion (serving.all_reduce_rules).")
    p.add_argument("--flashinfer-allreduce-fusion-backend", default=None, choices=("auto", "trtllm", "mnnvl", "cutedsl"),
                   help="As SGLang: FlashInfer all-reduce fusion's backend (unset: SGLang's own rule).")
    p.add_argument("--json-model-override-args", default="{}",
                   help="As SGLang: JSON overrides of the model config; 'architectures' is read here.")
    p.add_argument("--reference-gpu-kind", default=None, metavar="KIND",
                   help="The reference engine's own: the node whose all-reduce rule to follow and log as SGLang "
                   "would (cpu, sm90-nvlink, sm120-pcie, ...; default: cpu on the CPU, else the GPU's sm with pcie).")
    p.add_argument("--enable-symm-mem", action="store_true", help="Sets NCCL_CUMEM_ENABLE=1 as SGLang does.")
    p.add_argument("--enable-torch-symm-mem", action="store_true",
                   help="As SGLang: PyTorch's symmetric-memory all-reduce where its rule engages it (logged per rank).")
    p.add_argument("--enable-mscclpp", action="store_true",
                   help="As SGLang: MSCCL++ all-reduce where its rule engages it (logged per rank).")
    p.add_argument("--reference-mscclpp-installed", action="store_true",
                   help="The reference engine's own: behave as if the mscclpp package were installed.")
    p.add_argument("--enable-nccl-nvls", action="store_true", help="Sets NCCL_NVLS_ENABLE=1 as SGLang does.")
    p.add_argument("--decode-log-interval", type=int, default=40)
    # SGLang's multi-node flags, defaults and help (srt/arg_groups/fields/parallel.py).
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None,
                   help="The host address for initializing distributed backend (e.g., `192.168.0.2:25000`).")
    p.add_argument("--nnodes", type=int, default=1, help="The number of nodes.")
    p.add_argument("--node-rank", type=int, default=0, help="The node rank.")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    for name, kwargs in GRAPH_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, **kwargs)
    for name, kwargs in NO_EFFECT_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=argparse.SUPPRESS, **kwargs)
    return p


@functools.cache
def option_strings() -> frozenset[str]:
    """Every option string ``build_parser`` registers (aliases included, ``-h``/``--help`` not)."""
    return frozenset(
        option for action in build_parser()._actions  # noqa: SLF001 - argparse's only complete list
        if not isinstance(action, argparse._HelpAction) for option in action.option_strings  # noqa: SLF001
    )


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
    """Whether CUDA is usable, and how many devices: without a GPU driver's device node, no (and
    torch, seconds to import, stays out of the HTTP process)."""
    if not any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")):
        return False, 0
    import torch

    available = torch.cuda.is_available()
    return available, torch.cuda.device_count() if available else 0


def resolve(
    ns: argparse.Namespace, *, cuda_available: Optional[bool] = None, cuda_device_count: Optional[int] = None
) -> ServerArgs:
    """Apply SGLang's defaults and rules; raise ``ValueError`` naming the flag on a conflict."""
    preset = get_preset(ns.model_path)
    for name, (low, high) in INT_FLAG_BOUNDS.items():
        if getattr(ns, name) is not None:
            check_int(getattr(ns, name), name=_flag(name), low=low, high=high)
    for name in ("cuda_graph_bs_decode", "cuda_graph_bs_prefill"):
        for size in getattr(ns, name) or ():
            check_int(size, name=_flag(name), low=1, high=65536)
    if ns.mem_fraction_static is not None:
        fraction = check_finite(ns.mem_fraction_static, name="--mem-fraction-static")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"--mem-fraction-static must be in (0, 1], got {ns.mem_fraction_static}")
    preset.check_tp(ns.tp_size)
    _check_nodes(ns)

    if cuda_available is None or cuda_device_count is None:
        cuda_available, cuda_device_count = _cuda_info()
    device = ns.device or ("cuda" if cuda_available else "cpu")
    if device == "cuda":
        if not cuda_available:
            raise ValueError("--device cuda was given but torch sees no CUDA device")
        per_node = ns.tp_size // ns.nnodes
        if per_node > cuda_device_count:
            on_node = f" on each of --nnodes {ns.nnodes}" if ns.nnodes > 1 else ""
            raise ValueError(
                f"--tp-size {ns.tp_size} needs {per_node} GPUs{on_node} but {cuda_device_count} are visible "
                "(CUDA_VISIBLE_DEVICES); rank r uses visible device r % (tp_size / nnodes)"
            )

    dtype = preset.dtype if ns.dtype == "auto" else ns.dtype
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"--dtype {dtype!r} is not supported; use one of {sorted(DTYPE_NAMES)}")

    context_length = ns.context_length if ns.context_length is not None else preset.context_length
    check_int(context_length, name="--context-length", low=2, high=preset.max_context_length)

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
        steps, topk, draft_tokens = _speculative_numbers(steps, topk, draft_tokens, preset=preset)
        if max_running is None:
            max_running = DEFAULT_MAX_RUNNING_WITH_SPEC
            logger.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override this "
                "by explicitly setting --max-running-requests."
            )
    if max_running is None:
        max_running = preset.default_max_running_requests

    architecture = _architecture(ns.json_model_override_args, default=preset.architecture)
    gpu_kind = _gpu_kind(ns.reference_gpu_kind, device=device)
    path = predict(gpu_kind=GpuKind.parse(gpu_kind), architecture=architecture, tp_size=ns.tp_size,
                   disable_custom_all_reduce=ns.disable_custom_all_reduce,
                   enforce_disable_fusion=ns.enforce_disable_flashinfer_allreduce_fusion,
                   fusion_backend=ns.flashinfer_allreduce_fusion_backend)
    if path.fusion_line:
        logger.info("%s", path.fusion_line)  # SGLang's own line (srt/arg_groups/overrides.py)
    node = GpuKind.parse(gpu_kind)
    if (ns.flashinfer_allreduce_fusion_backend is not None and ns.tp_size > 1
            and not ns.enforce_disable_flashinfer_allreduce_fusion):
        resolved, why = resolve_fusion_backend(ns.flashinfer_allreduce_fusion_backend, gpu_kind=node, nnodes=ns.nnodes)
        if resolved is None:  # SGLang raises this ValueError at start (layers/flashinfer_comm_fusion.py _resolve_backend)
            raise ValueError(f"--flashinfer-allreduce-fusion-backend {ns.flashinfer_allreduce_fusion_backend}: {why}")
    no_effect = {name: getattr(ns, name) for name in NO_EFFECT_FLAGS}
    graph_flags = {name: getattr(ns, name) for name in GRAPH_FLAGS}
    if ns.disable_cuda_graph:
        # SGLang's DeprecatedStoreTrueAction (srt/arg_groups/argparse_actions.py).
        logger.warning("'--disable-cuda-graph' is deprecated and will be removed in a future release. "
                       "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.")
    gpu_memory_mib = _gpu_memory_mib() if device == "cuda" else None
    args = ServerArgs(
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
        enforce_disable_flashinfer_allreduce_fusion=ns.enforce_disable_flashinfer_allreduce_fusion,
        flashinfer_allreduce_fusion_backend=path.fusion_backend,
        architecture=architecture,
        reference_gpu_kind=gpu_kind,
        enable_symm_mem=ns.enable_symm_mem,
        enable_torch_symm_mem=ns.enable_torch_symm_mem,
        enable_mscclpp=ns.enable_mscclpp,
        reference_mscclpp_installed=ns.reference_mscclpp_installed,
        enable_nccl_nvls=ns.enable_nccl_nvls,
        decode_log_interval=ns.decode_log_interval,
        dist_init_addr=ns.dist_init_addr,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        skip_server_warmup=ns.skip_server_warmup,
        log_level=ns.log_level,
        graph_flags=graph_flags,
        no_effect=no_effect,
        gpu_memory_mib=gpu_memory_mib,
    )
    return _fit_static_cache(args, preset=preset)


def _fit_static_cache(args: ServerArgs, *, preset: Any) -> ServerArgs:
    """Shrink ``max_running_requests`` so a whole KV cache fits ``--mem-fraction-static``.

    Raises:
        ValueError: not even one request fits.
    """
    if not args.captures_decode_graphs or args.gpu_memory_mib is None:
        return args
    from serving.reference.kv_cache import cache_cols

    dtype_bytes = DTYPE_BYTES[args.dtype]
    fraction = args.graph_flags.get("mem_fraction_static") or DEFAULT_MEM_FRACTION_STATIC
    budget = args.gpu_memory_mib * 2**20 * fraction - preset.weight_elements(args.tp_size) * dtype_bytes
    cols = cache_cols(context_length=args.context_length, scratch=args.scratch_cols)
    row_bytes = cols * preset.kv_elements_per_token(args.tp_size) * dtype_bytes
    rows = int(budget // row_bytes) if budget > 0 else 0
    if rows < 1:
        raise ValueError(
            f"decode CUDA graphs need the KV cache allocated whole: one request of --context-length "
            f"{args.context_length} takes {row_bytes / 2**30:.1f} GiB, and --mem-fraction-static {fraction} "
            f"of this GPU leaves {max(budget, 0) / 2**30:.1f} GiB after the weights; lower --context-length, "
            "raise --mem-fraction-static, or pass --disable-decode-cuda-graph"
        )
    if rows >= args.max_running_requests:
        return args
    logger.warning(
        "max_running_requests is reduced from %d to %d: decode CUDA graphs need the KV cache allocated whole "
        "(%d requests x %d positions, %.1f GiB each), and --mem-fraction-static %s of this GPU holds %d; "
        "lower --context-length for more", args.max_running_requests, rows, args.max_running_requests, cols,
        row_bytes / 2**30, fraction, rows,
    )
    return dataclasses.replace(args, max_running_requests=rows)


def _gpu_memory_mib() -> float:
    """The GPU's total memory in MiB."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**20


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _architecture(overrides: str, *, default: str) -> str:
    """``architectures[0]`` from ``--json-model-override-args``, else ``default``."""
    try:
        data = json.loads(overrides or "{}")
    except ValueError as exc:
        raise ValueError(f"--json-model-override-args is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--json-model-override-args must be a JSON object, got {overrides!r}")
    names = data.get("architectures")
    if names is None:
        return default
    if not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
        raise ValueError(f"--json-model-override-args: 'architectures' must be a non-empty list of names, got {names!r}")
    return names[0]


def _gpu_kind(declared: Optional[str], *, device: str) -> str:
    """``--reference-gpu-kind``, else ``cpu`` on the CPU and the device's sm with PCIe on CUDA."""
    if declared is not None:
        return GpuKind.parse(declared).name  # ValueError names the kinds allowed
    if device == "cpu":
        return "cpu"
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm{major}{minor}-pcie"


def _check_nodes(ns: argparse.Namespace) -> None:
    """Check ``--nnodes`` / ``--node-rank`` / ``--dist-init-addr`` (SGLang's rules, plus the node rank).

    Raises:
        ValueError: a rule is broken; the message names the flag.
    """
    if ns.tp_size % ns.nnodes:
        raise ValueError(
            f"--tp-size {ns.tp_size} is not divisible by --nnodes {ns.nnodes}: tp_size must be divisible by "
            "number of nodes (SGLang's rule; each node holds tp_size / nnodes ranks)"
        )
    if not 0 <= ns.node_rank < ns.nnodes:
        raise ValueError(
            f"--node-rank must be an integer in [0, {ns.nnodes - 1}] (a node of --nnodes {ns.nnodes}), got {ns.node_rank}"
        )
    if ns.dist_init_addr is not None:
        _check_address(ns.dist_init_addr)
    elif ns.nnodes > 1:
        logger.warning(
            "--nnodes %d without --dist-init-addr: as in SGLang, node_rank %d's ranks meet at a free port "
            "of its own host, so the nodes never meet and this engine will not become healthy; pass "
            "--dist-init-addr <node rank 0's host>:<port> on every node",
            ns.nnodes, ns.node_rank,
        )


def _check_address(addr: str) -> None:
    """``--dist-init-addr`` must be ``host:port``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--dist-init-addr must be host:port with a port in [1, 65535], got {addr!r}")


def _speculative_numbers(
    steps: Optional[int], topk: Optional[int], draft_tokens: Optional[int], *, preset: Any
) -> tuple[int, int, int]:
    """Apply SGLang's speculative rules (``serving.speculative_rules``); ``ValueError`` on a conflict."""
    if steps is None and topk is None and draft_tokens is None:
        steps, topk, draft_tokens = preset.auto_speculative
        logger.warning(
            "speculative_num_steps/speculative_eagle_topk/speculative_num_draft_tokens are unset; "
            "auto-chose (%d, %d, %d) for %s (SGLang's auto choice)",
            steps, topk, draft_tokens, preset.name,
        )
    adjusted = draft_tokens
    if topk == 1 and isinstance(steps, int) and draft_tokens is not None:
        adjusted = chain_num_draft_tokens(steps)
    problem = speculative_problem(num_steps=steps, eagle_topk=topk, num_draft_tokens=adjusted, names=FLAG_NAMES)
    if problem is not None:
        raise ValueError(problem)
    assert steps is not None and topk is not None and adjusted is not None
    if adjusted != draft_tokens:
        logger.warning(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1 (%d -> %d)", draft_tokens, adjusted,
        )
    return steps, topk, adjusted
