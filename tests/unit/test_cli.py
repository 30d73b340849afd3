"""The spectune command line: validate's output and exit codes, --help everywhere, examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from test_spec import BROKEN  # the same broken specs, checked through the CLI

REPO = Path(__file__).resolve().parents[2]
CPU_SPEC = REPO / "experiments" / "reference-cpu.yaml"
KIMI_SPEC = REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml"
runner = CliRunner()


def test_validate_cpu_spec_summarises_space() -> None:
    result = runner.invoke(app, ["validate", str(CPU_SPEC)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output and "reference-cpu" in result.output
    assert "valid configurations: 78" in result.output  # 26 speculative x 1 all-reduce x 3 NCCL_ALGO
    assert "NCCL_ALGO" in result.output


def test_validate_kimi_spec_json() -> None:
    result = runner.invoke(app, ["validate", "--json", str(KIMI_SPEC)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    names = [d["name"] for d in summary["dimensions"]]
    assert names[:2] == ["speculative (steps, topk, draft)", "all_reduce"]
    assert {"NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE"} <= set(names)
    product = 1
    for dim in summary["dimensions"]:
        product *= dim["count"]
    assert summary["valid_configurations"] == product


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["engine"].update(tp_size="x"), "engine.tp_size"),
        (lambda d: d["search"]["nccl_env"].update(NCCL_PROTO=[None, "LL128"]), "search.nccl_env.NCCL_PROTO"),
        (lambda d: d.update(objectve={}), "objectve"),
    ],
)
def test_validate_broken_spec_exits_2_naming_field(tmp_path: Path, edit, field: str) -> None:
    data = yaml.safe_load(KIMI_SPEC.read_text())
    edit(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert field in result.output


def test_installed_entry_point_runs(tmp_path: Path) -> None:
    """The real console script (not the in-process runner): exit codes reach the shell."""
    exe = Path(sys.executable).with_name("spectune")
    assert exe.exists(), "spectune is not installed in this environment (pip install -e .)"
    ok = subprocess.run([str(exe), "validate", str(CPU_SPEC)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    broken = tmp_path / "b.yaml"
    broken.write_text("name: x\nengine: {kind: sglang}\n")
    bad = subprocess.run([str(exe), "validate", str(broken)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "engine.model_path" in bad.stderr and "Traceback" not in bad.stderr


COMMANDS = ["validate", "sweep", "serve", "bench", "probe", "audit", "engine-cmd", "examples"]


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS], ids=lambda c: " ".join(c) or "spectune")
def test_help_everywhere(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_examples_list_and_copy(tmp_path: Path) -> None:
    listed = runner.invoke(app, ["examples"])
    assert listed.exit_code == 0
    assert set(listed.output.split()) == {p.name for p in (REPO / "experiments").glob("*.yaml")}
    copied = runner.invoke(app, ["examples", "reference-cpu", "--to", str(tmp_path)])
    assert copied.exit_code == 0, copied.output
    assert (tmp_path / "reference-cpu.yaml").read_text() == CPU_SPEC.read_text()
    again = runner.invoke(app, ["examples", "reference-cpu", "--to", str(tmp_path)])
    assert again.exit_code == 2 and "not overwriting" in again.output
    missing = runner.invoke(app, ["examples", "nope"])
    assert missing.exit_code == 2 and "reference-cpu.yaml" in missing.output


@pytest.mark.parametrize(("case", "data", "field", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_every_broken_spec_exits_2_naming_field(tmp_path: Path, case: str, data: dict, field: str, words: str) -> None:
    """The spec cases of test_spec.py, through the command a user runs: exit 2, field named."""
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 2, f"{case}: {result.output}"
    assert f"{field}:" in result.output, f"{case}: {field} not named in {result.output}"
    assert "Traceback" not in result.output


def test_markup_in_a_spec_is_printed_not_interpreted(tmp_path: Path) -> None:
    path = tmp_path / "markup.yaml"
    path.write_text('name: "[/x]"\nengine: {kind: sglang, "[/bold]": 1}\n')
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "engine.[/bold]: unknown key" in result.output and "'[/x]'" in result.output


def test_engine_cmd_normalises_and_warns_about_danger() -> None:
    result = runner.invoke(
        app, ["engine-cmd", str(KIMI_SPEC), "--set", "NCCL_ALGO=ring", "--set", "NCCL_PROTO=LL128"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "NCCL_ALGO=Ring" in result.output
    assert "warning: NCCL_PROTO=LL128 is dangerous" in result.output
    plain = runner.invoke(app, ["engine-cmd", str(KIMI_SPEC), "--set", "NCCL_ALGO=ring"], terminal_width=200)
    assert "outside the spec's search space" not in plain.output  # Ring is in the space, however spelled


def test_validate_redacts_secret_env(tmp_path: Path) -> None:
    data = yaml.safe_load(CPU_SPEC.read_text())
    data["engine"]["env"] = {"HF_TOKEN": "hf_very_secret"}
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "hf_very_secret" not in result.output and "HF_TOKEN=<redacted>" in result.output
