#!/usr/bin/env python3
"""Write SGLang's decision rules as a truth table (serving/data/sglang_rules.json) from SGLang's own code.

    python scripts/write_sglang_rules.py --version 0.5.23

spectune decides before any engine starts what SGLang will do on a node (the speculative auto choice,
FlashInfer fusion and its backend, custom all-reduce V1/V2, PCIe-IPC, MSCCL++ and symmetric memory,
the all-reduce precedence, the CUDA-graph batch list); those rules are copied by hand into
``serving/all_reduce_rules.py``, ``serving/cuda_graph_rules.py``, ``serving/speculative_rules.py`` and
``orchestrator/space/arms.py``. This script evaluates SGLang's own functions over the inputs those
copies answer for and writes the answers; ``tests/unit/test_sglang_rules_table.py`` compares the copies
with the table, importing no SGLang.

How each function runs (``how`` in every family of the JSON):
  * ``executed``: the function's own source, taken unchanged from the wheel with ``ast`` (the ``def``
    node, line numbers kept, decorators dropped), compiled and called. Its module is not imported:
    SGLang's modules pull triton, flashinfer, CUDA kernels and a torch of their own pin. The names the
    function reads are SGLang's own functions loaded the same way, except the platform queries, which
    are set per declared node kind: compute capability (``get_platform()``, ``torch.cuda``), NVLink
    (``is_full_nvlink``), P2P (``can_p2p``), world size and node membership (``dist``,
    ``in_the_same_node_as``), and whether FlashInfer ships a class (a stub module). Every stub is
    listed in the family's ``stubs``.
  * ``imported``: the module file itself is executed (``configs/custom_all_reduce_v2.py``, which needs
    only torch), with ``torch.cuda``'s capability and SM count set per kind.
  * ``literal``: a constant table read with ``ast.literal_eval`` (keys only where values are
    expressions), never imported.
  * ``hand``: a rule that only runs inside a GPU process (a communicator's constructor that opens
    CUDA IPC, symmetric memory or mscclpp); the table carries the case written by hand with SGLang's
    file:line. ``hand_cases`` lists every one of them.

The ``arms`` family composes the others into the decode kernel of each of spectune's all-reduce arms
(the flags and environment ``orchestrator.space.points`` gives it) on each node: fusion first (it runs at
the RMSNorm call site), else the precedence rows over the communicators that come up.

Steps: ``pip download sglang==VERSION --no-deps`` into ``--work-dir`` and unzip (or ``--src`` an unpacked
wheel); run with an interpreter that has torch (the repo's venv: the CPU build does); nothing is
installed. To refresh for a new SGLang version: run it with that ``--version``, read the JSON's diff,
run ``pytest tests/unit/test_sglang_rules_table.py`` and fix the rule modules it names.

Exit status: 0 when the file was written; 1 when a step failed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as _dt
import hashlib
import itertools
import json
import logging
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "serving" / "data" / "sglang_rules.json"
DEFAULT_VERSION = "0.5.23"

# --- what is read -------------------------------------------------------------------------------------

SPEC_HOOK = "srt/arg_groups/speculative_hook.py"
OVERRIDES = "srt/arg_groups/overrides.py"
RUNTIME_CONTEXT = "srt/runtime_context.py"
OVERRIDE_BASE = "srt/arg_groups/model_override_base.py"
FUSION = "srt/layers/flashinfer_comm_fusion.py"
CA = "srt/distributed/device_communicators/custom_all_reduce.py"
CA_UTILS = "srt/distributed/device_communicators/custom_all_reduce_utils.py"
CA_V2 = "srt/distributed/device_communicators/custom_all_reduce_v2.py"
CA_V2_CONFIGS = "srt/distributed/device_communicators/configs/custom_all_reduce_v2.py"
PCIE_IPC = "srt/distributed/device_communicators/pcie_ipc_ar.py"
MSCCLPP = "srt/distributed/device_communicators/pymscclpp.py"
AR_UTILS = "srt/distributed/device_communicators/all_reduce_utils.py"
TORCH_SYMM = "srt/distributed/device_communicators/torch_symm_mem.py"
PARALLEL_STATE = "srt/distributed/parallel_state.py"
CUDA_GRAPH_HOOK = "srt/arg_groups/cuda_graph_hook.py"
ENVIRON = "srt/environ.py"
UTILS_COMMON = "srt/utils/common.py"

NODE_KINDS = {
    "cpu": {"capability": None, "full_nvlink": False},
    "sm80-nvlink": {"capability": [8, 0], "full_nvlink": True},
    "sm80-pcie": {"capability": [8, 0], "full_nvlink": False},
    "sm90-nvlink": {"capability": [9, 0], "full_nvlink": True},
    "sm90-pcie": {"capability": [9, 0], "full_nvlink": False},
    "sm100-nvlink": {"capability": [10, 0], "full_nvlink": True},
    "sm120-pcie": {"capability": [12, 0], "full_nvlink": False},
}
"""spectune's declared node kinds (``serving.all_reduce_rules.DECLARED_GPU_KINDS``) as platform facts."""

GPU_KINDS = [kind for kind, facts in NODE_KINDS.items() if facts["capability"]]
TP_SIZES = (1, 2, 3, 4, 6, 8, 16)
NNODES = (1, 2)
ARCHITECTURES = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Qwen3MoeForCausalLM",
                 "GptOssForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM", "Grok1ForCausalLM")
"""Fusion and auto-choice architectures spectune's specs and presets name, and ones outside both lists."""


class Source:
    """The unpacked wheel: files read once, hashed, parsed."""

    def __init__(self, root: Path):
        self.root = root
        self.hashes: dict[str, str] = {}
        self._trees: dict[str, ast.Module] = {}

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            text = (self.root / "sglang" / rel).read_text(encoding="utf-8")
            self.hashes[f"sglang/{rel}"] = hashlib.sha256(text.encode()).hexdigest()
            self._trees[rel] = ast.parse(text, filename=f"sglang/{rel}")
        return self._trees[rel]

    def node(self, rel: str, name: str) -> ast.AST:
        """A top-level def/class ``name``, or ``Class.method``."""
        scope: list[ast.stmt] = self.tree(rel).body
        *outer, last = name.split(".")
        for part in outer:
            scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == part).body
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == last:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == last for t in targets):
                    return node
        raise SystemExit(f"sglang_rules: {name} not found in sglang/{rel}: SGLang moved it; update this script")

    def where(self, rel: str, name: str) -> str:
        node = self.node(rel, name)
        return f"sglang/{rel}:{node.lineno}-{node.end_lineno} {name}"

    def function(self, rel: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
        """SGLang's function ``name`` compiled from its own source into ``namespace`` (decorators dropped)."""
        node = self.node(rel, name)
        assert isinstance(node, ast.FunctionDef), name
        node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
        ast.copy_location(node, self.node(rel, name))
        module = ast.Module(body=[node], type_ignores=[])
        ast.fix_missing_locations(module)
        exec(compile(module, str(self.root / "sglang" / rel), "exec"), namespace)  # noqa: S102 - SGLang's code
        return namespace[node.name]

    def literal(self, rel: str, name: str, *, keys_only: bool = False) -> Any:
        node = self.node(rel, name)
        value = node.value  # type: ignore[attr-defined]
        if keys_only:
            return [ast.literal_eval(k) for k in value.keys]
        return ast.literal_eval(value)


# --- stubs: platform queries only -----------------------------------------------------------------------


class Recorder(logging.Handler):
    """SGLang's logger stand-in: keeps every line as (level, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[list[str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append([record.levelname.lower(), record.getMessage()])


def _logger() -> tuple[logging.Logger, Recorder]:
    log = logging.getLogger(f"sglang_rules.{id(object())}")
    log.propagate = False
    log.handlers[:] = []
    rec = Recorder()
    log.addHandler(rec)
    log.setLevel(logging.DEBUG)
    return log, rec


def _platform(src: Source, kind: str) -> types.SimpleNamespace:
    """``get_platform()``: ``is_sm90`` / ``is_sm100`` / ``is_blackwell`` as ``utils/common.py`` defines them
    (the capability majors each checks, read from its source), for the kind's capability."""
    cap = NODE_KINDS[kind]["capability"]
    majors = {}
    for attr, fn in (("is_sm90", "is_sm90_supported"), ("is_sm100", "is_sm100_supported"),
                     ("is_blackwell", "is_blackwell_supported")):
        node = src.node(UTILS_COMMON, fn)
        call = node.value.args[0]  # type: ignore[attr-defined]  lru_cache(...)(partial(_check, device_capability_majors=[..]))
        majors[attr] = next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "device_capability_majors")
    return types.SimpleNamespace(**{attr: bool(cap) and cap[0] in m for attr, m in majors.items()})


class FakeGroup:
    def __init__(self, world_size: int, nnodes: int):
        self.world_size, self.nnodes = world_size, nnodes


def _fake_dist(torch: Any) -> types.SimpleNamespace:
    def all_gather(gather_list: list, tensor: Any, group: FakeGroup) -> None:
        for i, t in enumerate(gather_list):
            t.fill_(i)

    return types.SimpleNamespace(
        Backend=types.SimpleNamespace(NCCL="nccl"), get_backend=lambda group: "gloo",
        get_rank=lambda group=None: 0, get_world_size=lambda group=None: group.world_size, all_gather=all_gather)


def _same_node(group: FakeGroup, source_rank: int = 0) -> list[bool]:
    per = max(1, group.world_size // group.nnodes)
    return [i < per for i in range(group.world_size)]


@contextlib.contextmanager
def _modules(**mods: types.ModuleType):
    saved = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _env_default(src: Source, name: str) -> Any:
    """An ``EnvBool(default)`` of ``environ.py``'s ``Envs`` class, read with ast."""
    for node in ast.walk(src.tree(ENVIRON)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value.args[0])  # type: ignore[attr-defined]
    raise SystemExit(f"sglang_rules: {name} not in sglang/{ENVIRON}")


def _env_line(src: Source, name: str) -> str:
    for node in ast.walk(src.tree(ENVIRON)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return f"sglang/{ENVIRON}:{node.lineno} {name}"
    raise SystemExit(f"sglang_rules: {name} not in sglang/{ENVIRON}")


# --- the families ----------------------------------------------------------------------------------------


def speculative(src: Source) -> dict:
    ns: dict[str, Any] = {"resolving_view": lambda args: args}
    auto = src.function(SPEC_HOOK, "_auto_choose_speculative_params", ns)
    rows = []
    for algorithm in ("EAGLE3", "EAGLE", "STANDALONE"):
        for arch in ARCHITECTURES:
            rows.append([algorithm, arch, list(auto(types.SimpleNamespace(speculative_algorithm=algorithm), arch))])
    # _handle_eagle_family: the max_running_requests default and the chain adjustment, read from its calls
    handler = src.node(SPEC_HOOK, "_handle_eagle_family")
    max_running, chain_expr, chain_line = None, None, None
    for node in ast.walk(handler):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "declare_resolution":
            for kw in node.keywords:
                if kw.arg == "max_running_requests":
                    max_running = [ast.literal_eval(kw.value), node.lineno]
                if kw.arg == "speculative_num_draft_tokens" and ast.unparse(kw.value) != "draft_tokens":
                    chain_expr, chain_line = ast.unparse(kw.value), node.lineno
    assert max_running and chain_expr, "_handle_eagle_family changed: update this script"
    chain = [[s, eval(chain_expr, {}, {"cfg": types.SimpleNamespace(speculative_num_steps=s)})]  # noqa: S307
             for s in range(1, 17)]
    return {
        "auto_choice": {"how": "executed", "source": src.where(SPEC_HOOK, "_auto_choose_speculative_params"),
                        "stubs": ["resolving_view (the identity: the view over a namespace holding the algorithm)"],
                        "columns": ["speculative_algorithm", "architecture", "(num_steps, eagle_topk, num_draft_tokens)"],
                        "rows": rows},
        "max_running_requests": {"how": "literal", "value": max_running[0],
                                 "source": f"sglang/{SPEC_HOOK}:{max_running[1]} _handle_eagle_family declare_resolution"},
        "chain_num_draft_tokens": {"how": "executed", "expression": chain_expr,
                                   "source": f"sglang/{SPEC_HOOK}:{chain_line} _handle_eagle_family (topk == 1)",
                                   "columns": ["num_steps", "num_draft_tokens"], "rows": chain},
    }


def fusion(src: Source) -> dict:
    joiner = src.function(OVERRIDE_BASE, "ep_scale_joiner_of", {})
    attn_ns: dict[str, Any] = {}
    base_mod = _module("sglang.srt.arg_groups.model_override_base", ep_scale_joiner_of=joiner)
    with _modules(**{"sglang.srt.arg_groups.model_override_base": base_mod}):
        attn_dp = src.function(RUNTIME_CONTEXT, "attn_dp_enabled_of", attn_ns)
        attn_rows = [[n, attn_dp(types.SimpleNamespace(attn_dp_size=n, ep_join_mode=None))] for n in (1, 2, 4, 8)]
        auto_rows, resolve_rows = [], []
        for kind in GPU_KINDS:
            log, rec = _logger()
            platform = _platform(src, kind)
            ns = {"get_platform": lambda p=platform: p, "logger": log, "attn_dp_enabled_of": attn_dp,
                  "_FLASHINFER_ALLREDUCE_FUSION_ARCHS": frozenset(_fusion_archs(src))}
            auto = src.function(OVERRIDES, "_flashinfer_allreduce_fusion_auto_enable", ns)
            enforce = src.function(OVERRIDES, "_enforce_disable_allreduce_fusion", ns)
            for tp, nnodes, arch, attn, a2a, off in itertools.product(
                    (1, 2, 4, 8), NNODES, ARCHITECTURES, (1, 2), ("none", "deepep"), (False, True)):
                rec.lines.clear()
                hf = types.SimpleNamespace(architectures=[arch], model_type=None, hidden_size=None)
                view = types.SimpleNamespace(
                    flashinfer_allreduce_fusion_backend=None, tp_size=tp, nnodes=nnodes, attn_dp_size=attn,
                    ep_join_mode=None, moe_a2a_backend=a2a, disable_custom_all_reduce=False,
                    enforce_disable_flashinfer_allreduce_fusion=off)
                ns["model_config_of"] = lambda v, hf=hf: types.SimpleNamespace(hf_config=hf)
                view.flashinfer_allreduce_fusion_backend = auto(view).get("flashinfer_allreduce_fusion_backend")
                view.flashinfer_allreduce_fusion_backend = enforce(view).get(
                    "flashinfer_allreduce_fusion_backend", view.flashinfer_allreduce_fusion_backend)
                auto_rows.append([kind, tp, nnodes, arch, attn, a2a, off, view.flashinfer_allreduce_fusion_backend,
                                  [m for _, m in rec.lines]])
            resolve = src.function(FUSION, "_resolve_backend", {"get_platform": lambda p=platform: p,
                                                                 "_mnnvl_supported": None})
            src.function(FUSION, "_mnnvl_supported", resolve.__globals__)
            for nnodes in NNODES:
                for backend in ("auto", "trtllm", "mnnvl", "cutedsl"):
                    try:
                        resolve_rows.append([kind, nnodes, backend, resolve(backend, nnodes > 1), None])
                    except ValueError as exc:
                        resolve_rows.append([kind, nnodes, backend, None, " ".join(str(exc).split())])
    return {
        "attention_dp": {"how": "executed", "source": src.where(RUNTIME_CONTEXT, "attn_dp_enabled_of"),
                         "stubs": ["cfg.ep_join_mode None (no EP scale joiner)"],
                         "columns": ["attn_dp_size", "attention DP on"], "rows": attn_rows},
        "auto_enable": {
            "how": "executed",
            "source": [src.where(OVERRIDES, "_flashinfer_allreduce_fusion_auto_enable"),
                       src.where(OVERRIDES, "_enforce_disable_allreduce_fusion"),
                       src.where(OVERRIDES, "_FLASHINFER_ALLREDUCE_FUSION_ARCHS")],
            "stubs": ["get_platform(): is_sm90 / is_sm100 / is_blackwell of the kind (majors read from "
                      f"sglang/{UTILS_COMMON})", "model_config_of(view).hf_config: architectures[0], no model_type "
                      "or hidden_size (so not DeepSeek-V4.1)", "logger (its lines are recorded)"],
            "not_covered": "MiMo's cutedsl branch (it imports torch and flashinfer_mnnvl_cutedsl; spectune does not model MiMo)",
            "columns": ["kind", "tp_size", "nnodes", "architecture", "attn_dp_size", "moe_a2a_backend",
                        "enforce_disable_flashinfer_allreduce_fusion", "flashinfer_allreduce_fusion_backend", "log lines"],
            "rows": auto_rows},
        "resolve_backend": {
            "how": "executed", "source": [src.where(FUSION, "_resolve_backend"), src.where(FUSION, "_mnnvl_supported")],
            "stubs": ["get_platform() of the kind"],
            "columns": ["kind", "nnodes", "backend", "resolved (None: SGLang raises)", "error"],
            "rows": resolve_rows},
        "architectures": {"how": "literal", "source": src.where(OVERRIDES, "_FLASHINFER_ALLREDUCE_FUSION_ARCHS"),
                          "value": sorted(_fusion_archs(src))},
    }


def _fusion_archs(src: Source) -> set[str]:
    node = src.node(OVERRIDES, "_FLASHINFER_ALLREDUCE_FUSION_ARCHS")
    return set(ast.literal_eval(node.value.args[0]))  # type: ignore[attr-defined]  frozenset({...})


def _v2_sizes(src: Source) -> tuple[dict, Callable[[str], tuple]]:
    """``configs/custom_all_reduce_v2.py`` executed as a module, ``torch.cuda`` capability set per kind."""
    import torch

    path = src.root / "sglang" / CA_V2_CONFIGS
    src.tree(CA_V2_CONFIGS)
    mod = types.ModuleType("sglang_rules_ca_v2_configs")
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), mod.__dict__)  # noqa: S102

    def sizes(kind: str) -> tuple[int, ...]:
        cap = tuple(NODE_KINDS[kind]["capability"])
        mod.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            get_device_capability=lambda: cap,
            get_device_properties=lambda: types.SimpleNamespace(multi_processor_count=132)))
        mod._get_all_reduce_configs.cache_clear()
        mod.get_supported_world_sizes.cache_clear()
        out = tuple(mod.get_supported_world_sizes())
        mod.torch = torch
        return out

    return {kind: list(sizes(kind)) for kind in GPU_KINDS}, sizes


def custom_all_reduce(src: Source) -> dict:
    import torch

    by_kind, sizes = _v2_sizes(src)
    legacy = src.literal(CA, "CustomAllreduce._SUPPORTED_WORLD_SIZES")
    v2_default = _env_default(src, "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2")
    rows = []
    for kind in GPU_KINDS:
        full_nvlink = NODE_KINDS[kind]["full_nvlink"]
        log, rec = _logger()
        base = {"torch": torch, "dist": _fake_dist(torch), "logger": log, "in_the_same_node_as": _same_node,
                "is_full_nvlink": lambda ids, ws: full_nvlink, "can_p2p": lambda rank, ws: True, "_is_hip": False,
                "List": list, "Optional": Optional,
                "os": types.SimpleNamespace(environ={"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(16)))})}
        with_nvlink = src.function(CA_UTILS, "can_use_custom_all_reduce_with_nvlink", base)
        v2_ns = {**base, "get_supported_world_sizes": lambda k=kind: sizes(k),
                 "can_use_custom_all_reduce_with_nvlink": with_nvlink,
                 "is_one_nvlink_clique": lambda group, device: False,
                 "_is_vmm_backed_allocator": lambda device: False, "ProcessGroup": object}
        v2 = src.function(CA_V2, "can_use_custom_all_reduce_v2", v2_ns)

        class CustomAllReduceV2:  # markers: which class dispatch returns
            pass

        class CustomAllreduce:
            pass

        v2_mod = _module("sglang.srt.distributed.device_communicators.custom_all_reduce_v2",
                         CustomAllReduceV2=CustomAllReduceV2, can_use_custom_all_reduce_v2=v2)
        envs = types.SimpleNamespace(SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=types.SimpleNamespace(get=lambda: v2_default))
        d_ns = {"_is_cuda": True, "_is_musa": False, "_is_hip": False, "envs": envs, "logger": log,
                "CustomAllreduce": CustomAllreduce, "__name__": "sglang.srt.distributed.device_communicators.custom_all_reduce",
                "__package__": "sglang.srt.distributed.device_communicators", "ProcessGroup": object, "torch": torch}
        dispatch = src.function(CA, "dispatch_custom_allreduce", d_ns)
        for tp, nnodes in itertools.product(TP_SIZES, NNODES):
            if tp < nnodes or tp % nnodes:
                continue
            rec.lines.clear()
            group, device = FakeGroup(tp, nnodes), torch.device("cuda", 0)
            with _modules(**{v2_mod.__name__: v2_mod}):
                cls = dispatch(group, device)
            if cls is CustomAllReduceV2:
                engaged = "CustomAllReduceV2"
            else:  # CustomAllreduce.__init__ asks the same check with its own sizes (custom_all_reduce.py)
                full = with_nvlink(group=group, device=device, supported_world_size=legacy, cls_name="CustomAllreduce")
                engaged = None if full is None else "CustomAllreduce"
            if tp == 1:
                engaged = None  # GroupCoordinator builds no communicator for one rank
            rows.append([kind, tp, nnodes, engaged, [m for level, m in rec.lines if level == "warning"]])
    init = src.node(CA, "CustomAllreduce.__init__")
    return {
        "v2_world_sizes": {"how": "imported", "source": src.where(CA_V2_CONFIGS, "get_supported_world_sizes"),
                           "stubs": ["torch.cuda.get_device_capability / get_device_properties of the kind"],
                           "value": by_kind},
        "legacy_world_sizes": {"how": "literal", "source": src.where(CA, "CustomAllreduce._SUPPORTED_WORLD_SIZES"),
                               "value": legacy},
        "v2_default": {"how": "literal", "source": _env_line(src, "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"),
                       "value": v2_default},
        "eligibility": {
            "how": "executed",
            "source": [src.where(CA, "dispatch_custom_allreduce"), src.where(CA_V2, "can_use_custom_all_reduce_v2"),
                       src.where(CA_UTILS, "can_use_custom_all_reduce_with_nvlink"),
                       f"sglang/{CA}:{init.lineno}-{init.end_lineno} CustomAllreduce.__init__ (its call of the check: hand)"],
            "stubs": ["dist (world size, rank, all_gather of device ids)", "os.environ CUDA_VISIBLE_DEVICES (16 GPUs)", "in_the_same_node_as (nnodes)",
                      "is_full_nvlink (the kind)", "can_p2p (True)", "is_one_nvlink_clique and "
                      "_is_vmm_backed_allocator (False: a declared kind cannot say; see hand_cases)",
                      "get_supported_world_sizes (the imported configs module)", "logger (warnings recorded)"],
            "columns": ["kind", "tp_size", "nnodes", "engages (class, None: off)", "warnings"],
            "rows": rows},
    }


def pcie_ipc(src: Source) -> dict:
    import torch

    log, rec = _logger()
    env_on = {"value": False}
    envs = types.SimpleNamespace(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=types.SimpleNamespace(get=lambda: env_on["value"]))
    names = src.node(PCIE_IPC, "_ELIGIBLE_GROUP_NAMES").value.args[0]  # type: ignore[attr-defined]  frozenset({..})
    ns = {"envs": envs, "_ELIGIBLE_GROUP_NAMES": frozenset(ast.literal_eval(names)),
          "_warn_deterministic_wins": None, "Optional": Optional, "logger": log, "torch": torch, "Any": Any}
    src.function(PCIE_IPC, "_warn_deterministic_wins", ns)
    eligible = src.function(PCIE_IPC, "eligible_group", ns)
    ns["dist"] = _fake_dist(torch)
    ns["_SUPPORTED_WORLD_SIZES"] = tuple(src.literal(PCIE_IPC, "_SUPPORTED_WORLD_SIZES"))
    ns["ProcessGroup"] = object
    init = src.function(PCIE_IPC, "PcieIpcCommunicator.__init__", ns)
    flashinfer = _module("flashinfer")
    comm = _module("flashinfer.comm", PcieIpcAllReduceWorkspace=type("PcieIpcAllReduceWorkspace", (), {}))
    flashinfer.comm = comm
    rows = []
    for kind in NODE_KINDS:
        for tp, on, det in itertools.product((1, 2, 3, 4, 6, 8), (False, True), (False, True)):
            env_on["value"] = on
            rec.lines.clear()
            ok = eligible(group_name="tp", world_size=tp, deterministic=det)
            up = False
            if ok:
                me = types.SimpleNamespace()
                device = torch.device("cuda", 0) if NODE_KINDS[kind]["capability"] else torch.device("cpu")
                with _modules(flashinfer=flashinfer, **{"flashinfer.comm": comm}):
                    init(me, FakeGroup(tp, 1), device)
                up = not me.disabled
            rows.append([kind, tp, on, det, ok, up, [[level, m] for level, m in rec.lines if level != "debug"]])
    return {
        "world_sizes": {"how": "literal", "source": src.where(PCIE_IPC, "_SUPPORTED_WORLD_SIZES"),
                        "value": list(src.literal(PCIE_IPC, "_SUPPORTED_WORLD_SIZES"))},
        "eligibility": {
            "how": "executed",
            "source": [src.where(PCIE_IPC, "eligible_group"), src.where(PCIE_IPC, "PcieIpcCommunicator.__init__"),
                       _env_line(src, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")],
            "stubs": ["envs.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (the row's value)", "dist.get_world_size",
                      "flashinfer.comm (a module holding PcieIpcAllReduceWorkspace: FlashInfer 0.7.2, SGLang's pin, "
                      "ships it)", "the device: cuda:0 on a GPU kind, cpu on cpu", "logger (lines recorded)"],
            "columns": ["kind", "tp_size", "env on", "deterministic", "eligible_group", "communicator up", "log lines"],
            "rows": rows},
    }


def precedence(src: Source) -> dict:
    """``GroupCoordinator.all_reduce`` and ``_resolve_outplace_all_reduce_method`` on a stand-in ``self``
    whose communicators accept or not: which one takes a decode-sized bf16 tensor."""
    calls: list[str] = []

    def outplace(input_: Any, group_name: str, outplace_all_reduce_method: str) -> str:
        calls.append(outplace_all_reduce_method)
        return input_

    def inplace(input_: Any, group_name: str) -> None:
        calls.append("nccl")

    def flashinfer_ar(input_: Any, group_name: str) -> Any:
        calls.append("flashinfer_allreduce")
        return input_

    ns = {"outplace_all_reduce": outplace, "inplace_all_reduce": inplace, "flashinfer_allreduce": flashinfer_ar,
          "torch": types.SimpleNamespace(compiler=types.SimpleNamespace(is_compiling=lambda: False), Tensor=object),
          "is_in_tc_piecewise_cuda_graph": lambda: False, "Optional": Optional, "is_shm_available": None,
          "REDUCE_OP_SUM": None}
    all_reduce = src.function(PARALLEL_STATE, "GroupCoordinator.all_reduce", ns)
    resolve = src.function(PARALLEL_STATE, "GroupCoordinator._resolve_outplace_all_reduce_method", ns)
    paths = ("mscclpp", "custom_all_reduce", "nccl_symm_mem", "flashinfer_allreduce", "pcie_ipc", "torch_symm_mem")
    rows = []

    def comm(accepts: bool, method: str) -> Any:
        return types.SimpleNamespace(disabled=False, **{method: lambda _input, a=accepts: a})

    for r in range(0, len(paths) + 1):
        for on in itertools.combinations(paths, r):
            calls.clear()
            me = types.SimpleNamespace(
                world_size=8, hpu_communicator=None, xpu_communicator=None, qr_comm=None, unique_name="tp:0",
                pymscclpp_comm=comm(True, "should_mscclpp_allreduce") if "mscclpp" in on else None,
                ca_comm=comm(True, "should_custom_ar") if "custom_all_reduce" in on else None,
                pcie_ipc_comm=comm(True, "should_pcie_ipc_ar") if "pcie_ipc" in on else None,
                torch_symm_mem_comm=(comm(True, "should_torch_symm_mem_allreduce") if "torch_symm_mem" in on else None),
                pynccl_comm=types.SimpleNamespace(change_state=lambda enable: contextlib.nullcontext(),
                                                  all_reduce=lambda t: calls.append("nccl_symm_mem")),
                is_symmetric_memory_enabled=lambda on=on: "nccl_symm_mem" in on,
                debug_check_symmetric_mempool=lambda *a: None,
                _can_use_flashinfer_allreduce=lambda t, on=on: "flashinfer_allreduce" in on)
            me._resolve_outplace_all_reduce_method = lambda input_, should_use_pymscclpp_allreduce=None, me=me: resolve(
                me, input_, should_use_pymscclpp_allreduce)
            all_reduce(me, types.SimpleNamespace(is_cpu=False))
            rows.append([list(on), calls[0]])
    return {"how": "executed",
            "source": [src.where(PARALLEL_STATE, "GroupCoordinator.all_reduce"),
                       src.where(PARALLEL_STATE, "GroupCoordinator._resolve_outplace_all_reduce_method")],
            "stubs": ["self: a GroupCoordinator stand-in at world size 8 whose listed communicators exist and accept "
                      "the tensor (the others are None); pynccl present, symmetric memory on only where listed",
                      "the custom ops outplace_all_reduce / inplace_all_reduce / flashinfer_allreduce record the method",
                      "torch.compiler.is_compiling() False (decode is not traced), not in a piecewise CUDA graph"],
            "columns": ["communicators that accept", "what takes the all-reduce (nccl: the in-place NCCL op)"],
            "rows": rows}


def cuda_graph(src: Source) -> dict:
    gen = src.function(CUDA_GRAPH_HOOK, "generate_decode_cuda_graph_batch_sizes", {"resolving_view": lambda a: a,
                                                                                  "Any": Any})
    rows = []
    for max_bs, spec, nopad in itertools.product((1, 4, 8, 9, 24, 32, 48, 64, 100, 160, 256, 300, 512, 600, 1024),
                                                 (False, True), (False, True)):
        args = types.SimpleNamespace(disable_cuda_graph_padding=nopad, speculative_algorithm="EAGLE3" if spec else None)
        rows.append([max_bs, spec, nopad, gen(args, max_bs)])
    return {"how": "executed", "source": src.where(CUDA_GRAPH_HOOK, "generate_decode_cuda_graph_batch_sizes"),
            "stubs": ["resolving_view (the identity over a namespace of the two flags)"],
            "columns": ["max_bs", "speculative", "disable_cuda_graph_padding", "batch sizes"], "rows": rows}


def opt_in_constants(src: Source) -> dict:
    return {
        "mscclpp_world_sizes": {"how": "literal", "source": src.where(MSCCLPP, "_SUPPORTED_WORLD_SIZES"),
                                "value": list(src.literal(MSCCLPP, "_SUPPORTED_WORLD_SIZES"))},
        "mscclpp_single_node_world_sizes": {"how": "literal", "source": src.where(MSCCLPP, "_NATIVE_SUPPORTED_WORLD_SIZES"),
                                            "value": list(src.literal(MSCCLPP, "_NATIVE_SUPPORTED_WORLD_SIZES"))},
        "mscclpp_ipc_domain_counts": {"how": "literal", "source": src.where(MSCCLPP, "_MULTI_NODE_IPC_DOMAIN_COUNTS"),
                                      "value": list(src.literal(MSCCLPP, "_MULTI_NODE_IPC_DOMAIN_COUNTS"))},
        "torch_symm_mem_world_sizes": {
            "how": "literal", "source": src.where(AR_UTILS, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"),
            "value": {str(major): sorted(ast.literal_eval(k) for k in inner.keys)
                      for major, inner in zip(src.literal(AR_UTILS, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", keys_only=True),
                                              src.node(AR_UTILS, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES").value.values)}},
    }


def _line_of(src: Source, rel: str, needle: str) -> str:
    src.tree(rel)
    for i, line in enumerate((src.root / "sglang" / rel).read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return f"sglang/{rel}:{i}"
    raise SystemExit(f"sglang_rules: {needle!r} no longer in sglang/{rel}: re-read the hand case")


def hand_cases(src: Source) -> list[dict]:
    """Rules that only run inside a GPU process, written by hand with SGLang's file:line."""
    return [
        {"family": "torch_symm_mem", "case": "TorchSymmMemCommunicator comes up only at capability 9/10, a world size "
         "of TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, and with a multicast pointer from the rendezvous (NVSwitch)",
         "sglang": [_line_of(src, TORCH_SYMM, "Device capability %s not supported"),
                    _line_of(src, TORCH_SYMM, "World size %d not supported"),
                    _line_of(src, TORCH_SYMM, "if handle.multicast_ptr == 0:")],
         "why": "its constructor calls torch symmetric-memory rendezvous on CUDA tensors"},
        {"family": "torch_symm_mem", "case": "should_torch_symm_mem_allreduce takes bf16 only",
         "sglang": [_line_of(src, TORCH_SYMM, "def should_torch_symm_mem_allreduce")],
         "why": "needs the constructed communicator and a CUDA tensor"},
        {"family": "mscclpp", "case": "PyMscclppCommunicator needs the mscclpp package, a world size of "
         "_SUPPORTED_WORLD_SIZES, and runs only inside CUDA-graph capture",
         "sglang": [_line_of(src, MSCCLPP, "PyMscclpp is unavailable"), _line_of(src, MSCCLPP, "world_size not in _SUPPORTED_WORLD_SIZES")],
         "why": "its constructor imports mscclpp and tunes algorithms on the GPUs"},
        {"family": "pcie_ipc", "case": "should_pcie_ipc_ar takes bf16 only, within the decode-sized workspace",
         "sglang": [_line_of(src, PCIE_IPC, "if inp.dtype is not torch.bfloat16:")],
         "why": "needs the workspace, which is built over CUDA IPC"},
        {"family": "pcie_ipc", "case": "across nodes the workspace is assumed not to build (SGLang checks no node count)",
         "sglang": [_line_of(src, PCIE_IPC, "def _ensure_workspace")],
         "why": "CUDA IPC does not reach another node; a runtime failure, not a rule"},
        {"family": "custom_all_reduce", "case": "across nodes CustomAllReduceV2 needs one NVLink clique and a VMM-backed "
         "allocator: taken as absent for every declared kind",
         "sglang": [_line_of(src, CA_V2, "return is_one_nvlink_clique(group, device) and _is_vmm_backed_allocator(device)")],
         "why": "is_one_nvlink_clique queries NVML fabric info; the allocator probe allocates on the GPU"},
        {"family": "custom_all_reduce", "case": "the legacy CustomAllreduce.__init__ asks can_use_custom_all_reduce_with_nvlink "
         "with its own _SUPPORTED_WORLD_SIZES and stays off when it returns None",
         "sglang": [_line_of(src, CA, "full_nvlink = can_use_custom_all_reduce_with_nvlink(")],
         "why": "the constructor then opens CUDA IPC buffers"},
    ]


def arms(src: Source, families: dict) -> dict:
    """Each of spectune's all-reduce arms (the flags and environment it sets) on each node, composed from the
    families above: fusion first (it runs at the RMSNorm call site, ahead of ``GroupCoordinator.all_reduce``),
    else the precedence rows over the communicators that come up. mscclpp is taken as not installed."""
    sys.path.insert(0, str(REPO))
    from orchestrator.space.points import ALL_REDUCE_ARMS, ARM_ENV, ARM_FLAGS

    auto = {tuple(r[:7]): r[7] for r in families["fusion"]["auto_enable"]["rows"]}
    resolve = {tuple(r[:3]): (r[3], r[4]) for r in families["fusion"]["resolve_backend"]["rows"]}
    ca = {tuple(r[:3]): r[3] for r in families["custom_all_reduce"]["eligibility"]["rows"]}
    pcie = {tuple(r[:4]): r[5] for r in families["pcie_ipc"]["eligibility"]["rows"]}
    winner = {frozenset(r[0]): r[1] for r in families["precedence"]["rows"]}
    symm = {int(k): v for k, v in families["opt_in_constants"]["torch_symm_mem_world_sizes"]["value"].items()}
    names = {"pymscclpp": "mscclpp", "ca": "custom_all_reduce"}
    rows = []
    for kind, tp, nnodes, arch, arm in itertools.product(GPU_KINDS, (2, 4, 8), NNODES, ARCHITECTURES[:5],
                                                         ALL_REDUCE_ARMS):
        flags, env = ARM_FLAGS[arm], ARM_ENV.get(arm, {})
        cap, nvlink = NODE_KINDS[kind]["capability"], NODE_KINDS[kind]["full_nvlink"]
        off = bool(flags.get("enforce_disable_flashinfer_allreduce_fusion"))
        given = flags.get("flashinfer_allreduce_fusion_backend")
        backend = auto[(kind, tp, nnodes, arch, 1, "none", off)] if given is None else (None if off else given)
        if backend is not None:
            resolved, error = resolve[(kind, nnodes, backend)]
            rows.append([kind, tp, nnodes, arch, arm, "refused" if error else "flashinfer_fusion", resolved])
            continue
        up = set()
        if not flags.get("disable_custom_all_reduce") and ca.get((kind, tp, nnodes)):
            up.add("custom_all_reduce")
        if flags.get("enable_symm_mem"):
            up.add("nccl_symm_mem")
        if env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") == "1" and nnodes == 1 and pcie[(kind, tp, True, False)]:
            up.add("pcie_ipc")  # across nodes: hand case (the workspace does not build)
        if (flags.get("enable_torch_symm_mem") and cap[0] in symm and tp in symm[cap[0]] and nvlink
                and nnodes == 1):  # hand case: capability, world size, multicast (torch_symm_mem.py)
            up.add("torch_symm_mem")
        kernel = winner[frozenset(up)]
        rows.append([kind, tp, nnodes, arch, arm, names.get(kernel, kernel), None])
    return {"how": "executed",
            "source": ["composed from the families above: fusion (auto_enable, resolve_backend) first, else precedence "
                       "over the communicators that come up (custom_all_reduce eligibility, pcie_ipc eligibility, "
                       "torch symmetric memory's hand case, pynccl on symmetric memory where --enable-symm-mem)",
                       src.where(FUSION, "_resolve_backend"), src.where(PARALLEL_STATE, "GroupCoordinator.all_reduce")],
            "stubs": ["mscclpp not installed (spectune's default; SGLang 0.5.23 does not require it)",
                      "attention DP off, moe_a2a_backend none, bf16, not deterministic, CUDA graphs on"],
            "arm_flags": {arm: {**ARM_FLAGS[arm], **ARM_ENV.get(arm, {})} for arm in ALL_REDUCE_ARMS},
            "columns": ["kind", "tp_size", "nnodes", "architecture", "arm", "decode kernel (refused: SGLang does "
                        "not start)", "fusion backend as resolved"],
            "rows": rows}


def build(src: Source, version: str) -> dict:
    logging.disable(logging.NOTSET)
    families = {
        "speculative": speculative(src),
        "fusion": fusion(src),
        "custom_all_reduce": custom_all_reduce(src),
        "pcie_ipc": pcie_ipc(src),
        "opt_in_constants": opt_in_constants(src),
        "precedence": precedence(src),
        "cuda_graph": cuda_graph(src),
    }
    families["arms"] = arms(src, families)
    cases = hand_cases(src)
    for rel in (UTILS_COMMON, ENVIRON):
        src.tree(rel)
    return {
        "sglang_version": version,
        "generated_by": f"python scripts/write_sglang_rules.py --version {version}",
        "generated_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "node_kinds": NODE_KINDS,
        "source_sha256": dict(sorted(src.hashes.items())),
        "hand_cases": cases,
        "families": families,
    }


def _render(data: dict) -> str:
    """JSON with one row per line, so a refresh's diff reads row by row."""
    def walk(value: Any, indent: int) -> str:
        pad = " " * indent
        if isinstance(value, dict) and value:
            items = [f'{pad} {json.dumps(k)}: {walk(v, indent + 1).lstrip()}' for k, v in value.items()]
            return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            return pad + "[\n" + ",\n".join(f"{pad} {json.dumps(v)}" for v in value) + "\n" + pad + "]"
        return pad + json.dumps(value)
    return walk(data, 0) + "\n"


def _unpack(version: str, work: Path) -> Path:
    wheels = work / "wheel"
    argv = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "--only-binary", ":all:",
            "--dest", str(wheels), "--quiet"]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(f"sglang_rules: pip download failed (exit {result.returncode}):\n{result.stderr[-4000:]}\n")
        raise SystemExit(1)
    (wheel,) = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    src = work / "src"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(src, members=[n for n in archive.namelist()
                                         if n.startswith(("sglang/srt/", f"sglang-{version}.dist-info/"))])
    return src


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"SGLang version (default {DEFAULT_VERSION}).")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="The JSON file to write.")
    parser.add_argument("--work-dir", type=Path, default=None, help="Where the wheel goes (default: a temp dir).")
    parser.add_argument("--src", type=Path, default=None, help="An unpacked sglang wheel to reuse (no download).")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-rules-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        root = args.src or _unpack(args.version, work)
        infos = sorted(root.glob("sglang-*.dist-info"))
        found = infos[0].name.removeprefix("sglang-").removesuffix(".dist-info") if infos else "no dist-info"
        if found != args.version:
            sys.stderr.write(f"sglang_rules: {root} holds sglang {found}, not {args.version}\n")
            return 1
        data = build(Source(root), args.version)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(_render(data), encoding="utf-8")
    rows = sum(len(f.get("rows", [])) for fam in data["families"].values()
               for f in (fam.values() if "how" not in fam else [fam]) if isinstance(f, dict))
    print(f"{args.output}: {rows} rows, {len(data['hand_cases'])} hand cases, sglang {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
