"""The all-reduce table a user reads (issue 58): one small table for the spec's node in ``validate`` and the
dry run (every GPU kind only with ``--all-nodes``); no ``allow_dangerous`` for a multicast arm on a node
without NVLink; and ``engine-cmd`` of an arm SGLang refuses on the node exits 2 with SGLang's reason and
the arm's row of that table."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.exit_codes import EXIT_BAD_INPUT
from orchestrator.spec import SpecError, SweepSpec

REPO = Path(__file__).resolve().parents[2]
RTX = REPO / "experiments" / "kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml"
runner = CliRunner()


def _rows(out: str, kind: str) -> dict[str, str]:
    """The rows (path -> the rest of its line) of the table headed "decode's all-reduce on KIND"."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if f"decode's all-reduce on {kind} " in line)
    rows = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if not line.startswith("  ") or not cells or "'" in cells[0] or cells[0] in ("if", "SGLang's"):
            break
        rows[cells[0]] = " ".join(cells[1:])
    return rows


def test_validate_prints_one_small_table_for_the_spec_node_and_every_kind_on_request() -> None:
    result = runner.invoke(app, ["validate", str(RTX)], terminal_width=400)
    assert result.exit_code == 0, result.output
    out = result.output
    rows = _rows(out, "sm120-pcie")
    assert list(rows) == ["pcie_ipc", "default", "nccl_symm_mem"]
    assert rows["default"] == "NCCL measured, NCCL settings searched on it"
    assert rows["pcie_ipc"].startswith("FlashInfer's PCIe-IPC all-reduce measured with NCCL's defaults")
    assert "more than two PCIe-only GPUs" in out  # why SGLang's own choice is NCCL here
    assert "sm90-nvlink" not in out and "sm100-nvlink" not in out  # the spec pins sm120-pcie
    assert max(len(line) for line in out.splitlines() if "all-reduce" in line or "all_reduce" in line) < 200
    every = runner.invoke(app, ["validate", "--all-nodes", str(RTX)], terminal_width=400)
    assert every.exit_code == 0, every.output
    assert _rows(every.output, "sm90-nvlink")["pcie_ipc"] == (
        "FlashInfer's fused all-reduce + RMSNorm (trtllm) same as default (measured once)")


def test_a_spec_whose_node_is_auto_says_the_preflight_reads_it() -> None:
    result = runner.invoke(app, ["validate", "--json", str(REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["all_reduce_tables"] == []  # no node kind is guessed
    text = runner.invoke(app, ["validate", str(REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml")],
                         terminal_width=400).output
    assert "engine.gpu_kind: auto): the preflight reads it" in text and "decode's all-reduce on" not in text


def test_the_dry_run_of_the_rtx_spec_shows_only_its_node() -> None:
    from orchestrator.sweep.execution.preview import dry_run

    buf = io.StringIO()
    dry_run(SweepSpec.from_yaml(RTX), first=0, console=Console(file=buf, width=10_000))
    out = buf.getvalue()
    assert list(_rows(out, "sm120-pcie")) == ["pcie_ipc", "default", "nccl_symm_mem"]
    assert "sm90-nvlink" not in out and "on sm90" not in out


def _spec(kind: str, allow: list[str]) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "arms", "engine": {"kind": "sglang", "model_path": "org/model", "draft_model_path": "org/draft",
                                   "tp_size": 8, "gpu_kind": kind, "architecture": "KimiK25ForConditionalGeneration"},
        "search": {"all_reduce": ["default", "torch_symm_mem", "mscclpp", "nccl_symm_mem"], "allow_dangerous": allow},
        "benchmark": {"concurrency": [1]},
    })


def test_multicast_arms_need_allow_dangerous_only_where_nvlink_could_multicast() -> None:
    _spec("sm120-pcie", [])  # PCIe only: each falls back to another kernel, nothing to multicast over
    for kind in ("sm90-nvlink", "auto"):  # NVLink, or a node not known yet
        with pytest.raises(SpecError, match="turns on NVLink multicast"):
            _spec(kind, [])
    _spec("sm90-nvlink", ["torch_symm_mem", "mscclpp", "nccl_symm_mem"])
    shipped = yaml.safe_load(RTX.read_text())["search"]["allow_dangerous"]
    assert shipped == ["NCCL_BUFFSIZE=16777216"]  # its nccl_symm_mem arm needs no entry on sm120-pcie


def test_engine_cmd_of_an_arm_sglang_refuses_on_the_node_exits_2_with_its_reason_and_row() -> None:
    refused = runner.invoke(app, ["engine-cmd", str(RTX), "--set", "all_reduce=fusion_trtllm"], terminal_width=400)
    assert refused.exit_code == EXIT_BAD_INPUT == 2, refused.output
    out = refused.output
    assert "SGLang refuses this configuration on sm120-pcie" in out
    # SGLang 0.5.23's own words (layers/flashinfer_comm_fusion.py:48-50 _resolve_backend)
    assert "--flashinfer-allreduce-fusion-backend trtllm" in out
    assert "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in out
    row = _rows(out, "sm120-pcie")["fusion_trtllm"]
    assert row.startswith("nothing: SGLang does not start refused: SGLang refuses"), row
    assert "sglang.launch_server" not in out  # no command handed out
    started = runner.invoke(app, ["engine-cmd", str(RTX), "--set", "all_reduce=nccl_symm_mem"], terminal_width=400)
    assert started.exit_code == 0 and "--enable-symm-mem" in started.output, started.output
