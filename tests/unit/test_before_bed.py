"""What can be checked before bed, is (orchestrator.sweep.execution.before_bed): the request log exists, parses and
shows its fingerprint; GPUs left idle or missing; a TP size that does not divide the attention heads;
``spectune validate`` and ``spectune sweep --dry-run`` refuse an error with exit 2; the shipped specs
are clean."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from helpers.spec_cases import BASE
from typer.testing import CliRunner

from orchestrator.sweep.execution.before_bed import Finding, before_bed, gpu_findings, heads_findings, traffic_findings
from orchestrator.cli import app
from orchestrator.spec import SweepSpec

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "experiments" / "traffic" / "chat-log.jsonl"
SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))
NO_CACHE = {"HF_HUB_CACHE": "/nonexistent/spectune-test-hf-cache"}


def _spec(*, engine: dict | None = None, benchmark: dict | None = None, resources: dict | None = None) -> SweepSpec:
    data = copy.deepcopy(BASE)
    data["engine"].update(engine or {})
    data["benchmark"] = {**data.get("benchmark", {}), **(benchmark or {})}
    if resources:
        data["resources"] = resources
    return SweepSpec.from_dict(data)


def _log_spec(path: Path | str) -> SweepSpec:
    return _spec(benchmark={"dataset": "request_log", "dataset_path": str(path), "api": "chat", "num_prompts": 8})


def _levels(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.level, f.field) for f in findings]


# --- the request log -------------------------------------------------------------------------------


def test_a_missing_request_log_is_an_error_naming_field_value_and_what_is_expected(tmp_path: Path) -> None:
    missing = tmp_path / "gateway.jsonl"
    [finding] = traffic_findings(_log_spec(missing))
    assert (finding.level, finding.field) == ("error", "benchmark.dataset_path")
    assert repr(str(missing)) in finding.message and "does not exist" in finding.message
    assert "OpenAI-format JSONL request log" in finding.message
    [directory] = traffic_findings(_log_spec(tmp_path))
    assert directory.level == "error" and "is not a file" in directory.message


def test_an_unparsable_request_log_is_an_error_with_the_reason_and_line(tmp_path: Path) -> None:
    log = tmp_path / "cut.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "hi"\n\n{"model": "m"}\n', encoding="utf-8")
    [finding] = traffic_findings(_log_spec(log))
    assert (finding.level, finding.field) == ("error", "benchmark.dataset_path")
    assert "none of its 2 request(s) can be replayed" in finding.message
    assert "not_json 1 (first at line 1)" in finding.message and "not_a_request 1 (first at line 3)" in finding.message


def test_a_readable_log_shows_its_fingerprint_replayable_and_not() -> None:
    [note] = traffic_findings(_log_spec(SAMPLE))
    assert (note.level, note.field) == ("note", "benchmark.dataset_path")
    sha = hashlib.sha256(SAMPLE.read_bytes()).hexdigest()[:8]
    assert f"chat-log.jsonl (sha256 {sha}, 40 requests, 35 replayable, 5 not: images 2, tools 2, not_json 1)" \
        in note.message, note.message
    assert traffic_findings(_spec()) == [], "builtin prompts: no file to check"


def test_validate_and_the_dry_run_exit_2_on_a_missing_log_and_show_a_readable_ones_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    spec = yaml.safe_load((REPO / "experiments" / "reference-cpu.yaml").read_text(encoding="utf-8"))
    spec["benchmark"].update(dataset="request_log", dataset_path=str(tmp_path / "missing.jsonl"), api="chat")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    runner = CliRunner()
    for command in (["validate"], ["validate", "--json"], ["sweep", "--dry-run", "--first", "0"]):
        result = runner.invoke(app, [*command, str(path)], terminal_width=400)
        assert result.exit_code == 2, (command, result.output)
        assert "benchmark.dataset_path: " in result.output and "missing.jsonl' does not exist" in result.output
    spec["benchmark"]["dataset_path"] = str(SAMPLE)
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    shown = runner.invoke(app, ["validate", "--json", str(path)])
    assert shown.exit_code == 0, shown.output
    assert any("35 replayable, 5 not" in note for note in json.loads(shown.output)["notes"])


# --- GPUs ------------------------------------------------------------------------------------------


def test_a_tp_size_that_leaves_gpus_idle_is_a_warning_with_the_count() -> None:
    [finding] = gpu_findings(_spec(engine={"tp_size": 6}, resources={"gpus_per_trial": 8}))
    assert (finding.level, finding.field) == ("warning", "resources.gpus_per_trial")
    assert "the engine uses 6 (tp_size 6): 2 GPU(s) sit idle" in finding.message
    assert "set resources.gpus_per_trial: 6" in finding.message
    assert gpu_findings(_spec(engine={"tp_size": 8}, resources={"gpus_per_trial": 8})) == []


def test_pipeline_and_data_parallel_sizes_count_as_sglang_counts_them() -> None:
    """GPUs = dp x tp x pp (SGLang's compute_world_size); attention DP adds none."""
    def found(tp: int, **flags) -> list[tuple[str, str]]:
        return _levels(gpu_findings(_spec(engine={"tp_size": tp, "extra_args": flags}, resources={"gpus_per_trial": 8})))

    assert found(4, pp_size=2) == []
    assert found(4, dp_size=2) == []
    assert found(8, attn_dp_size=4) == []
    assert found(8, dp_size=2) == [("error", "resources.gpus_per_trial")], "16 GPUs needed, 8 reserved"
    assert found(2, pp_size=2) == [("warning", "resources.gpus_per_trial")]
    assert found(8, attn_dp_size=3) == [("error", "engine.tp_size")], "SGLang asserts tp % attn_dp == 0"


# --- attention heads -------------------------------------------------------------------------------


def _model_dir(root: Path, config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def test_a_tp_size_that_does_not_divide_the_heads_of_a_local_config_is_an_error(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "kimi", {"architectures": ["KimiK25ForConditionalGeneration"],
                                           "text_config": {"num_attention_heads": 64, "num_key_value_heads": 64}})
    spec = _spec(engine={"model_path": str(model), "tp_size": 6}, resources={"gpus_per_trial": 8})
    [finding] = [f for f in heads_findings(spec, env=NO_CACHE) if f.field == "engine.tp_size"]
    assert finding.level == "error"
    assert f"6 does not divide num_attention_heads 64 of engine.model_path {model}" in finding.message
    assert "1, 2, 4, 8, 16, 32, 64" in finding.message
    assert not [f for f in heads_findings(_spec(engine={"model_path": str(model), "tp_size": 8}), env=NO_CACHE)
                if f.level == "error"]
    attention_dp = _spec(engine={"model_path": str(model), "tp_size": 8, "extra_args": {"attn_dp_size": 8}})
    assert not [f for f in heads_findings(attention_dp, env=NO_CACHE) if f.level == "error"], "attention-TP 1"
    draft = _model_dir(tmp_path / "draft", {"num_attention_heads": 12})
    context_parallel = _spec(engine={"model_path": str(model), "draft_model_path": str(draft), "tp_size": 8,
                                     "extra_args": {"attn_cp_size": 2}})
    errors = [f for f in heads_findings(context_parallel, env=NO_CACHE) if f.level == "error"]
    assert len(errors) == 1 and "12 of engine.draft_model_path" in errors[0].message, "the draft runs on all 8 ranks"


def test_the_heads_are_read_from_the_hugging_face_cache_and_kv_heads_must_split_evenly(tmp_path: Path) -> None:
    repo = tmp_path / "hf" / "models--org--model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc", encoding="utf-8")
    _model_dir(repo / "snapshots" / "abc", {"num_attention_heads": 12, "num_key_value_heads": 3})
    env = {"HF_HUB_CACHE": str(tmp_path / "hf")}
    [finding] = [f for f in heads_findings(_spec(engine={"tp_size": 2}), env=env) if f.level == "error"]
    assert "num_key_value_heads 3" in finding.message and str(repo / "snapshots" / "abc") in finding.message
    assert [f for f in heads_findings(_spec(engine={"tp_size": 3}), env=env) if f.level == "error"] == []


def test_heads_not_checked_where_no_config_is_on_this_machine_say_so() -> None:
    notes = heads_findings(_spec(engine={"tp_size": 6}, resources={"gpus_per_trial": 8}), env=NO_CACHE)
    assert _levels(notes) == [("note", "engine.model_path"), ("note", "engine.draft_model_path")]
    assert "not checked against engine.tp_size 6" in notes[0].message


def test_the_reference_engine_is_checked_against_its_presets_shape() -> None:
    data = yaml.safe_load((REPO / "experiments" / "reference-cpu.yaml").read_text(encoding="utf-8"))
    data["engine"]["tp_size"] = 3  # ref-tiny has 4 heads
    [finding] = heads_findings(SweepSpec.from_dict(data), env=NO_CACHE)
    assert (finding.level, finding.field) == ("error", "engine.tp_size") and "num_heads=4" in finding.message


# --- the shipped specs ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_spec_is_ready_for_the_night(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No error and no warning: only notes (heads not checked where the model is not on this machine)."""
    monkeypatch.chdir(REPO)
    findings = before_bed(SweepSpec.from_yaml(path), env=NO_CACHE)
    assert [f for f in findings if f.level != "note"] == [], findings
