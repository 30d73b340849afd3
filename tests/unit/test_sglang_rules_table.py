"""spectune's copies of SGLang's rules against SGLang's own answers (issue 59).

``serving/data/sglang_rules.json`` is written by ``scripts/write_sglang_rules.py`` from SGLang 0.5.23's
own functions (executed from the wheel's source with only the platform queries set per node kind),
its constant tables (``ast.literal_eval``) and, where a rule only runs in a GPU process, a hand case
citing SGLang's file:line. Each test below recomputes one family with spectune's rule modules and
names every row where they part. No SGLang is imported. A new SGLang version: regenerate the JSON,
read its diff, run this file, fix the rule modules it names.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

import serving.all_reduce_rules as rules
from orchestrator.space.define_by_run import RULES_OF_THUMB
from serving.all_reduce_rules import GpuKind, attention_dp_of, decode_kernel, predict
from serving.cuda_graph_rules import decode_batch_sizes
from serving.reference.config import PRESETS
from serving.speculative_rules import SPECULATIVE_MAX_RUNNING_REQUESTS, chain_num_draft_tokens, speculative_problem

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "serving" / "data" / "sglang_rules.json").read_text(encoding="utf-8"))
FAMILIES = DATA["families"]


def _check(family: str, rows: Iterable[list], sglang: Callable[[list], Any], spectune: Callable[[list], Any],
           source: Any) -> None:
    """Fail naming every row where spectune's answer is not SGLang's (first 8 quoted)."""
    misses = []
    count = 0
    for row in rows:
        count += 1
        want, got = sglang(row), spectune(row)
        if want != got:
            misses.append(f"  row {json.dumps(row)[:140]}: SGLang {want!r}, spectune {got!r}")
    where = "; ".join(source) if isinstance(source, list) else source
    assert not misses, (f"{family}: spectune disagrees with SGLang {DATA['sglang_version']} on {len(misses)} of "
                        f"{count} rows ({where}):\n" + "\n".join(misses[:8]))


def test_the_table_is_sglang_0_5_23s_and_marks_what_was_taken_by_hand() -> None:
    assert DATA["sglang_version"] == rules.SGLANG_VERSION == "0.5.23"
    assert DATA["generated_by"] == "python scripts/write_sglang_rules.py --version 0.5.23"
    assert set(DATA["node_kinds"]) == set(rules.DECLARED_GPU_KINDS)
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in DATA["source_sha256"].values())

    def leaves(node: dict) -> Iterable[dict]:
        if "how" in node:
            yield node
        else:
            for value in node.values():
                yield from leaves(value)

    hows = [leaf["how"] for family in FAMILIES.values() for leaf in leaves(family)]
    assert set(hows) <= {"executed", "imported", "literal"} and "executed" in hows
    assert DATA["hand_cases"], "the rules only a GPU process runs are listed as hand cases"
    for case in DATA["hand_cases"]:
        assert case["sglang"] and all(re.fullmatch(r"sglang/srt/\S+\.py:\d+", ref) for ref in case["sglang"]), case
        assert case["why"] and case["family"]


# --- speculative ----------------------------------------------------------------------------------


def test_speculative_auto_choice_and_number_rules() -> None:
    spec = FAMILIES["speculative"]
    auto = {(algo, arch): tuple(triple) for algo, arch, triple in spec["auto_choice"]["rows"]}
    _check("speculative auto choice (reference presets)", [[name, p.architecture, p.auto_speculative]
                                                           for name, p in PRESETS.items()],
           lambda r: auto[("EAGLE3", r[1])], lambda r: tuple(r[2]), spec["auto_choice"]["source"])
    eagle3 = {triple for (algo, _), triple in auto.items() if algo == "EAGLE3"}
    assert eagle3 == {(t.num_steps, t.eagle_topk, t.num_draft_tokens) for t in RULES_OF_THUMB}, (
        f"RULES_OF_THUMB {RULES_OF_THUMB} are not SGLang's auto choices {sorted(eagle3)} "
        f"({spec['auto_choice']['source']})")
    _check("max_running_requests under speculation", [[SPECULATIVE_MAX_RUNNING_REQUESTS]],
           lambda r: spec["max_running_requests"]["value"], lambda r: r[0], spec["max_running_requests"]["source"])
    _check("chain num_draft_tokens (topk 1)", spec["chain_num_draft_tokens"]["rows"], lambda r: r[1],
           lambda r: chain_num_draft_tokens(r[0]), spec["chain_num_draft_tokens"]["source"])
    for steps, draft in spec["chain_num_draft_tokens"]["rows"]:
        assert speculative_problem(num_steps=steps, eagle_topk=1, num_draft_tokens=draft) is None


# --- FlashInfer fusion ------------------------------------------------------------------------------


def test_fusion_auto_enable_and_attention_dp() -> None:
    fusion = FAMILIES["fusion"]
    assert set(fusion["architectures"]["value"]) == rules.FUSION_ARCHITECTURES, fusion["architectures"]["source"]
    _check("attention DP", fusion["attention_dp"]["rows"], lambda r: r[1],
           lambda r: attention_dp_of({"attn_dp_size": r[0]}), fusion["attention_dp"]["source"])

    def spectune(row: list) -> tuple:
        kind, tp, nnodes, arch, attn, a2a, off = row[:7]
        path = predict(gpu_kind=GpuKind.parse(kind), architecture=arch, tp_size=tp, disable_custom_all_reduce=False,
                       enforce_disable_fusion=off, nnodes=nnodes, attention_dp=attention_dp_of({"attn_dp_size": attn}),
                       moe_a2a_backend=a2a)
        return path.fusion_backend, path.fusion_line

    # SGLang logs the auto-enable line, then the enforce-disable line; spectune keeps the last one it says
    _check("fusion auto-enable", fusion["auto_enable"]["rows"], lambda r: (r[7], r[8][-1] if r[8] else None),
           spectune, fusion["auto_enable"]["source"])


def test_fusion_backend_resolution() -> None:
    family = FAMILIES["fusion"]["resolve_backend"]
    _check("fusion backend", family["rows"], lambda r: (r[3], r[4]),
           lambda r: (lambda res: (res[0], None if res[0] else res[1]))(
               rules.resolve_fusion_backend(r[2], gpu_kind=GpuKind.parse(r[0]), nnodes=r[1])),
           family["source"])


# --- custom all-reduce -------------------------------------------------------------------------------


def test_custom_all_reduce_world_sizes_and_eligibility() -> None:
    ca = FAMILIES["custom_all_reduce"]
    assert ca["v2_default"]["value"] is True, f"V2 is no longer SGLang's default ({ca['v2_default']['source']})"
    _check("legacy custom all-reduce world sizes", [[list(rules.CUSTOM_ALL_REDUCE_WORLD_SIZES)]],
           lambda r: ca["legacy_world_sizes"]["value"], lambda r: r[0], ca["legacy_world_sizes"]["source"])
    _check("custom all-reduce V2 world sizes", [[kind, sizes] for kind, sizes in ca["v2_world_sizes"]["value"].items()],
           lambda r: r[1], lambda r: list(rules.CUSTOM_ALL_REDUCE_V2_WORLD_SIZES.get(
               GpuKind.parse(r[0]).capability_major, rules.CUSTOM_ALL_REDUCE_V2_WORLD_SIZES[None])),
           ca["v2_world_sizes"]["source"])

    def spectune(row: list) -> tuple:
        kind, tp, nnodes = row[:3]
        node = GpuKind.parse(kind)
        path = predict(gpu_kind=node, architecture=None, tp_size=tp, disable_custom_all_reduce=False,
                       enforce_disable_fusion=True, nnodes=nnodes)
        engaged = None
        if path.custom_all_reduce:
            engaged = "CustomAllReduceV2" if "CustomAllReduceV2" in path.reason else "CustomAllreduce"
        return engaged, rules.custom_all_reduce_off_lines(gpu_kind=node, world_size=tp, nnodes=nnodes)

    _check("custom all-reduce eligibility", ca["eligibility"]["rows"], lambda r: (r[3], r[4]), spectune,
           ca["eligibility"]["source"])


# --- PCIe-IPC, MSCCL++, symmetric memory ------------------------------------------------------------------


def test_pcie_ipc_eligibility_and_lines() -> None:
    family = FAMILIES["pcie_ipc"]
    _check("PCIe-IPC world sizes", [[list(rules.PCIE_IPC_WORLD_SIZES)]], lambda r: family["world_sizes"]["value"],
           lambda r: r[0], family["world_sizes"]["source"])

    def spectune(row: list) -> tuple:
        kind, tp, on, det = row[:4]
        node = GpuKind.parse(kind)
        lines = [list(line) for line in rules.opt_in_rank_lines(gpu_kind=node, world_size=tp, enable_pcie_ipc=on,
                                                                 deterministic=det)]
        kernel, _ = decode_kernel(gpu_kind=node, architecture=None, tp_size=tp, disable_custom_all_reduce=True,
                                  enforce_disable_fusion=True, enable_pcie_ipc=on, deterministic=det)
        return kernel == "pcie_ipc", lines

    # "up" is SGLang's communicator coming up; on a CPU kind GroupCoordinator builds none (no lines, no kernel)
    _check("PCIe-IPC", family["eligibility"]["rows"], lambda r: (r[5], r[6]), spectune,
           family["eligibility"]["source"])


def test_mscclpp_and_torch_symmetric_memory_tables() -> None:
    consts = FAMILIES["opt_in_constants"]
    pairs = [("mscclpp_world_sizes", list(rules.MSCCLPP_WORLD_SIZES)),
             ("mscclpp_single_node_world_sizes", list(rules._MSCCLPP_SINGLE_NODE_WORLD_SIZES)),
             ("mscclpp_ipc_domain_counts", list(rules._MSCCLPP_IPC_DOMAIN_COUNTS)),
             ("torch_symm_mem_world_sizes", {str(k): list(v) for k, v in rules.TORCH_SYMM_MEM_WORLD_SIZES.items()})]
    _check("MSCCL++ / torch symmetric memory tables", [[name, mine] for name, mine in pairs],
           lambda r: consts[r[0]]["value"], lambda r: r[1], [consts[name]["source"] for name, _ in pairs])


# --- precedence ---------------------------------------------------------------------------------------

_METHOD = {"pymscclpp": "mscclpp", "ca": "custom_all_reduce"}
_FLAG = {"mscclpp": dict(enable_mscclpp=True, mscclpp_installed=True), "custom_all_reduce": {},
         "nccl_symm_mem": dict(enable_symm_mem=True), "pcie_ipc": dict(enable_pcie_ipc=True),
         "torch_symm_mem": dict(enable_torch_symm_mem=True)}


def _winner(paths: list[str]) -> str:
    """decode_kernel's answer on an 8-GPU sm90 NVLink node where every path of ``paths`` comes up."""
    kwargs: dict[str, Any] = {}
    for path in paths:
        kwargs.update(_FLAG[path])
    kernel, _ = decode_kernel(gpu_kind=GpuKind.parse("sm90-nvlink"), architecture=None, tp_size=8,
                              disable_custom_all_reduce="custom_all_reduce" not in paths,
                              enforce_disable_fusion=True, **kwargs)
    return kernel


def test_all_reduce_precedence() -> None:
    family = FAMILIES["precedence"]
    rows = [row for row in family["rows"] if "flashinfer_allreduce" not in row[0]]
    for path in _FLAG:  # each comes up alone on this node, so a pair's answer is spectune's precedence
        assert _winner([path]) == path, path
    # FlashInfer's plain all-reduce on fusion-tagged groups is not a decode kernel of spectune's (fusion runs at
    # the RMSNorm, ahead of all); its rows stay in the table for the reader.
    _check("all-reduce precedence", rows, lambda r: _METHOD.get(r[1], r[1]),
           lambda r: _winner(r[0]) if r[0] else "nccl", family["source"])


# --- the arms ------------------------------------------------------------------------------------------


def test_each_arm_runs_the_kernel_sglang_runs() -> None:
    from orchestrator.space.arms import arm_path
    from orchestrator.space.points import ARM_ENV, ARM_FLAGS

    family = FAMILIES["arms"]
    assert family["arm_flags"] == {arm: {**flags, **ARM_ENV.get(arm, {})} for arm, flags in ARM_FLAGS.items()}, (
        "an arm's flags changed since the table was written: regenerate it (scripts/write_sglang_rules.py)")

    def spectune(row: list) -> tuple:
        kind, tp, nnodes, arch, arm = row[:5]
        path = arm_path(GpuKind.parse(kind), arm, architecture=arch, tp_size=tp, nnodes=nnodes, extra_args={})
        return ("refused", None) if path.refused else (path.kernel, path.fusion_backend)

    _check("arms", family["rows"], lambda r: (r[5], r[6]), spectune, family["source"][0])


# --- CUDA graphs ----------------------------------------------------------------------------------------


def test_cuda_graph_decode_batch_sizes() -> None:
    family = FAMILIES["cuda_graph"]
    _check("CUDA-graph decode batch sizes", family["rows"], lambda r: r[3],
           lambda r: decode_batch_sizes(r[0], speculative=r[1], disable_padding=r[2]), family["source"])


# --- the reference engine reports what the table says ------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in rules.DECLARED_GPU_KINDS if k != "cpu"])
def test_reference_engine_reports_the_tables_fusion_backend(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    from serving.reference.server_args import build_parser, resolve

    rows = [r for r in FAMILIES["fusion"]["auto_enable"]["rows"]
            if r[0] == kind and r[2] == 1 and r[4] == 1 and r[5] == "none" and r[1] in (1, 2, 4, 8)]
    parser = build_parser()
    misses = []
    for row in rows:
        _, tp, _, arch, _, _, off, backend, lines = row
        argv = ["--model-path", "ref-gpu-comm", "--tp-size", str(tp), "--reference-gpu-kind", kind,
                "--json-model-override-args", json.dumps({"architectures": [arch]})]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="serving.reference.server_args"):
            args = resolve(parser.parse_args(argv + (["--enforce-disable-flashinfer-allreduce-fusion"] if off else [])),
                           cuda_available=False, cuda_device_count=0)
        said = [rec.getMessage() for rec in caplog.records if "FlashInfer" in rec.getMessage()]
        if args.flashinfer_allreduce_fusion_backend != backend or said != lines[-1:]:
            misses.append(f"  {row[:7]}: SGLang {backend!r} {lines}, reference engine "
                          f"{args.flashinfer_allreduce_fusion_backend!r} {said}")
    assert not misses, "the reference engine's fusion report is not SGLang's:\n" + "\n".join(misses[:8])
