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
from orchestrator.space import ALL_REDUCE_ARMS

from helpers.spec_cases import BROKEN  # the broken specs test_spec.py checks, here through the CLI

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
    counts = {d["name"]: d["count"] for d in summary["dimensions"]}
    # steps 1-5 x topk {1, 2, 4} x drafts {4, 6, 8, 12, 16}: 5 chains + 14 (topk 2) + 21 (topk 4) + auto
    assert counts == {
        "speculative (steps, topk, draft)": 41,
        "all_reduce": 3,
        "NCCL_ALGO": 3,
        "NCCL_BUFFSIZE": 2,
        "NCCL_PROTO": 3,
    }
    assert summary["valid_configurations"] == 2214  # 41 x 3 x 3 x 2 x 3: the node (gpu_kind auto) is not known yet
    assert "depend on the node" in summary["text"]["all_reduce"]


@pytest.mark.parametrize(("spec", "arms", "configurations"), [
    # eight PCIe GPUs: FlashInfer's PCIe-IPC (NCCL's defaults only), NCCL (whatever the switches) and NCCL on
    # symmetric memory, the presets on those two: 41 x (1 + 6 x 2)
    ("kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml", "pcie_ipc, default, nccl_symm_mem", 533),
    # eight NVLink GPUs: fusion (trtllm), custom, NCCL, fusion on MNNVL, torch and NCCL symmetric memory;
    # NCCL_* on the two NCCL arms: 41 x (1 + 1 + 3 x 3 + 1 + 1 + 3 x 3)
    ("kimi-k2.5-eagle3-8x-h200.yaml", "default, no_fusion, nccl, fusion_mnnvl, torch_symm_mem, nccl_symm_mem", 902),
    # two nodes of eight: NCCL (plain and on symmetric memory) across nodes, the network variables too:
    # 41 x 2 x 3 x 3 x 2 x 2
    ("kimi-k2.5-eagle3-2x8-h100.yaml", "default, nccl_symm_mem", 2952),
])
def test_validate_of_each_node_kinds_spec_states_its_arms(spec: str, arms: str, configurations: int) -> None:
    result = runner.invoke(app, ["validate", "--json", str(KIMI_SPEC.parent / spec)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert {d["name"]: d["values"] for d in summary["dimensions"]}["all_reduce"] == arms
    assert summary["valid_configurations"] == configurations


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
    listed_names = {line.split()[0] for line in listed.output.splitlines() if line.strip()}  # each: name, description
    assert listed_names == {p.name for p in (REPO / "experiments").glob("*.yaml")}
    copied = runner.invoke(app, ["examples", "reference-cpu", "--to", str(tmp_path)])
    assert copied.exit_code == 0, copied.output
    assert (tmp_path / "reference-cpu.yaml").read_text() == CPU_SPEC.read_text()
    again = runner.invoke(app, ["examples", "reference-cpu", "--to", str(tmp_path)])
    assert again.exit_code == 2 and "not overwriting" in again.output
    missing = runner.invoke(app, ["examples", "nope"])
    assert missing.exit_code == 2 and "reference-cpu.yaml" in missing.output


@pytest.mark.parametrize(("case", "data", "field", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_every_broken_spec_exits_2_naming_field(tmp_path: Path, case: str, data: dict, field: str, words: str) -> None:
    """The broken specs of helpers/spec_cases.py, through the command a user runs: exit 2, field named."""
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


def _spec_file(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(CPU_SPEC.read_text())
    edit(data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_refuses_a_huge_space_naming_field_and_size(tmp_path: Path) -> None:
    """A space of 10^9 points is refused at the bounds, naming each field; the widest allowed one validates."""
    huge = {"num_steps": {"low": 1, "high": 1000}, "eagle_topk": {"low": 1, "high": 1000},
            "num_draft_tokens": {"low": 2, "high": 1000}}
    path = _spec_file(tmp_path, lambda d: d["search"].update(speculative=huge))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "search.speculative.num_steps: high=1000 is outside [1, 16]" in result.output
    assert "search.speculative.eagle_topk: high=1000 is outside [1, 16]" in result.output
    assert "search.speculative.num_draft_tokens: high=1000 is outside [2, 64]" in result.output
    widest = {"num_steps": {"low": 1, "high": 16}, "eagle_topk": {"low": 1, "high": 16},
              "num_draft_tokens": {"low": 2, "high": 64}}
    path = _spec_file(tmp_path, lambda d: d["search"].update(speculative=widest))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output


def test_validate_non_utf8_file_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(bytes(range(256)))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert "is not UTF-8 text" in result.output and "binary.yaml" in result.output


def test_validate_duplicate_key_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(CPU_SPEC.read_text() + "search: {}\n")
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "duplicate key 'search'" in result.output


def test_audit_refuses_a_pid_that_is_not_positive() -> None:
    for pid in ("-1", "0"):
        result = runner.invoke(app, ["audit", "--pid", pid, "--expect", "NCCL_ALGO=Ring"], terminal_width=200)
        assert result.exit_code == 2, result.output
        assert "--pid" in result.output and "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


SECRETS = {"HF_TOKEN": "hf_very_secret", "OPENAI_API_KEY": "sk-very-secret", "DB_PASSWORD": "pw-very-secret"}


def _secret_spec(tmp_path: Path) -> Path:
    def edit(data: dict) -> None:
        data["engine"]["env"] = dict(SECRETS)
        data["engine"]["kind"] = "sglang"  # --api-key is SGLang's; the reference engine has no such flag
        data["engine"]["extra_args"]["api_key"] = "flag-very-secret"

    return _spec_file(tmp_path, edit)


def test_engine_cmd_redacts_secrets_in_text_and_json(tmp_path: Path) -> None:
    path = _secret_spec(tmp_path)
    text = runner.invoke(app, ["engine-cmd", str(path)], terminal_width=400)
    assert text.exit_code == 0, text.output
    as_json = runner.invoke(app, ["engine-cmd", str(path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    for output in (text.output, as_json.output):
        assert "very-secret" not in output and "very_secret" not in output
    assert "HF_TOKEN='<redacted>'" in text.output and "--api-key '<redacted>'" in text.output
    shown = json.loads(as_json.output)
    assert shown["env"] == {name: "<redacted>" for name in SECRETS}
    assert shown["argv"][shown["argv"].index("--api-key") + 1] == "<redacted>"


def test_engine_cmd_show_secrets_prints_them(tmp_path: Path) -> None:
    path = _secret_spec(tmp_path)
    result = runner.invoke(app, ["engine-cmd", str(path), "--json", "--show-secrets"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["env"] == SECRETS
    assert shown["argv"][shown["argv"].index("--api-key") + 1] == "flag-very-secret"


def test_validate_hides_a_tracking_uri_password(tmp_path: Path) -> None:
    path = _spec_file(tmp_path, lambda d: d.update(tracking={"mlflow_uri": "postgresql://me:pw-very-secret@db/ml"}))
    result = runner.invoke(app, ["validate", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert "pw-very-secret" not in result.output
    assert "postgresql://me:<redacted>@db/ml" in json.loads(result.output)["text"]["tracking"]


def test_engine_cmd_membership_note_without_listing_the_space() -> None:
    outside = runner.invoke(
        app, ["engine-cmd", str(KIMI_SPEC), "--set", "num_steps=7", "--set", "eagle_topk=1"], terminal_width=200
    )
    assert outside.exit_code == 0, outside.output
    assert "outside the spec's search space" in outside.output
    inside = runner.invoke(
        app, ["engine-cmd", str(KIMI_SPEC), "--set", "num_steps=3", "--set", "eagle_topk=4", "--set",
              "num_draft_tokens=16", "--set", "all_reduce=nccl", "--set", "NCCL_PROTO=LL"], terminal_width=200
    )
    assert inside.exit_code == 0, inside.output
    assert "outside the spec's search space" not in inside.output


def test_validate_prints_the_first_problems_and_counts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(CPU_SPEC.read_text() + "".join(f"unknown_{i}: 1\n" for i in range(150)))
    result = runner.invoke(app, ["validate", str(path)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "unknown_99: unknown key" in result.output and "unknown_100:" not in result.output
    assert "... and 50 more problems" in result.output


def test_engine_cmd_reproduces_a_trial_every_node_rank_and_its_start_flags() -> None:
    """A trial's command: the sweep-only start flags (--as-served leaves them out, as best.yaml serves),
    and for an engine across nodes one command per node rank; --help names today's arms."""
    two_node = REPO / "experiments" / "kimi-k2.5-eagle3-2x8-h100.yaml"
    result = runner.invoke(app, ["engine-cmd", str(two_node)], terminal_width=400)
    assert result.exit_code == 0, result.output
    commands = [line for line in result.output.splitlines() if "sglang.launch_server" in line]
    assert len(commands) == 2 and "--node-rank 0" in commands[0] and "--node-rank 1" in commands[1], result.output
    assert all("--skip-server-warmup" in c and "--cuda-graph-max-bs-decode" in c for c in commands)
    assert "# node rank 1 of 2" in result.output and "best.yaml serves without them" in result.output
    served = runner.invoke(app, ["engine-cmd", str(two_node), "--as-served"], terminal_width=400)
    assert served.exit_code == 0 and "--skip-server-warmup" not in served.output, served.output
    as_json = json.loads(runner.invoke(app, ["engine-cmd", str(two_node), "--json"]).output)
    assert [c["node_rank"] for c in as_json["commands"]] == [0, 1]
    help_text = runner.invoke(app, ["engine-cmd", "--help"], terminal_width=400).output
    assert f"all_reduce ({', '.join(ALL_REDUCE_ARMS)})" in help_text  # today's arms, the opt-in paths' among them


def test_engine_cmd_warns_when_an_nccl_setting_reaches_no_kernel_on_the_arm() -> None:
    h200 = REPO / "experiments" / "kimi-k2.5-eagle3-8x-h200.yaml"  # sm90-nvlink: FlashInfer fusion on 'default'
    fused = runner.invoke(app, ["engine-cmd", str(h200), "--set", "all_reduce=default", "--set", "NCCL_ALGO=Ring"],
                          terminal_width=400)
    assert fused.exit_code == 0, fused.output
    assert "warning: NCCL_ALGO=Ring: on sm90-nvlink the all_reduce arm 'default'" in fused.output
    assert "NCCL's variables reach no decode kernel; use an arm where NCCL carries decode (nccl, nccl_symm_mem)" in fused.output
    on_nccl = runner.invoke(app, ["engine-cmd", str(h200), "--set", "all_reduce=nccl", "--set", "NCCL_ALGO=Ring"],
                            terminal_width=400)
    assert on_nccl.exit_code == 0 and "reach no decode kernel" not in on_nccl.output, on_nccl.output
