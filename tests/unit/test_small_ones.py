"""Issue 58's small ones: what a user meets around the sweep reads as the spec checker does and
points where the answer is.

- a hand-edited best.yaml's typo gets the spec checker's "did you mean" (``spectune serve``);
- the emitted Serve config installs spectune as the README does;
- ``spectune examples`` shows each spec's description;
- ``--resume`` of a missing directory says so (exit 2), not "invalid spec";
- ``--help`` names the page that holds the answer, never "see the README";
- the dry run ends with where results land, the morning's files and the serve command.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import click
import pytest
import typer
import yaml
from rich.console import Console
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.spec import SweepSpec

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _best_yaml(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump({"kind": "reference", "model_path": "ref-tiny", **extra}), encoding="utf-8")
    return path


def test_a_best_yaml_typo_gets_the_spec_checkers_did_you_mean(tmp_path: Path) -> None:
    path = _best_yaml(tmp_path, speculative_num_step=3, serve={"num_replica": 2}, provenance={"trial_lable": "x"})
    result = runner.invoke(app, ["serve", str(path), "--emit-serve-config", str(tmp_path / "serve.yaml")])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())  # the console wraps long lines
    assert "speculative_num_step: unknown key (did you mean 'speculative_num_steps'?); allowed here: kind, " in out
    assert "serve.num_replica: unknown key (did you mean 'num_replicas'?)" in out
    assert "provenance.trial_lable: unknown key (did you mean 'trial_label'?)" in out
    assert "Extra inputs are not permitted" not in out
    assert not (tmp_path / "serve.yaml").exists()


def test_the_emitted_serve_config_installs_spectune_as_the_readme_does() -> None:
    from serving.engine.config import EngineConfig
    from serving.serve.app import INSTALL_COMMAND, serve_config_file
    from serving.serve.options import ServeOptions

    header = serve_config_file(EngineConfig(kind="reference", model_path="ref-tiny"), ServeOptions())
    assert INSTALL_COMMAND in header and "pip install spectune" not in header
    readme_installs = re.findall(r"^(pip install [^&#\n]*?)\s*(?:&&|#|$)", (REPO / "README.md").read_text(), re.M)
    assert INSTALL_COMMAND in readme_installs, readme_installs


def test_examples_show_each_specs_description() -> None:
    result = runner.invoke(app, ["examples"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    shipped = sorted((REPO / "experiments").glob("*.yaml"))
    assert set(lines) == {p.name for p in shipped}
    for path in shipped:
        description = yaml.safe_load(path.read_text())["description"]
        assert description and " ".join(description.split()) in lines[path.name], (path.name, lines[path.name])


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_resume_of_what_is_not_a_sweeps_directory_says_so(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "results"
    if kind == "file":
        target.write_text("")
    elif kind == "empty":
        target.mkdir()
    result = runner.invoke(app, ["sweep", "--resume", str(target)])
    out = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "invalid spec" not in out
    said = {"missing": "no such directory", "file": "not a directory", "empty": "not a sweep's results directory"}
    assert f"cannot resume: --resume {target}: {said[kind]}" in out, out
    assert "spec.yaml, sweep-state.json and trials.jsonl" in out


def _help_texts(command: click.Command, name: str = "spectune") -> dict[str, str]:
    texts = {name: command.help or ""}
    for param in command.params:
        texts[f"{name} {param.opts[0] if param.opts else param.name}"] = getattr(param, "help", None) or ""
    for sub_name, sub in getattr(command, "commands", {}).items():
        texts.update(_help_texts(sub, f"{name} {sub_name}"))
    return texts


def test_help_names_the_page_that_holds_the_answer() -> None:
    texts = _help_texts(typer.main.get_command(app))
    assert [where for where, text in texts.items() if "see the README" in text] == []
    results_help = texts["spectune sweep --results-dir"]
    page, section = re.search(r"(docs/[\w./-]+\.md), \"([^\"]+)\"", results_help).groups()
    text = (REPO / page).read_text()
    heading = re.search(rf"^#+ {re.escape(section)}$", text, re.M)
    assert heading, (page, section)
    assert "| `best.yaml` |" in text[heading.end():heading.end() + 4000]  # the files are described there


def test_the_dry_run_ends_with_where_results_land_the_morning_files_and_the_serve_command(tmp_path: Path) -> None:
    from orchestrator.sweep.execution.preview import dry_run
    from orchestrator.sweep.output.morning import MORNING_FILES
    from orchestrator.sweep.records.results import TRIALS_FILE

    buf = io.StringIO()
    out_dir = tmp_path / "night"
    dry_run(SweepSpec.from_yaml(REPO / "experiments" / "reference-cpu.yaml"), first=0,
            console=Console(file=buf, width=10_000), results_dir=str(out_dir))
    lines = buf.getvalue().rstrip("\n").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("results will land in "))
    end = lines[start:]
    assert end[0] == f"results will land in {out_dir}", end[0]
    assert 'docs/sweep.md, "Where results land"' in end[1]  # the page the help test finds the table on
    for name in (*MORNING_FILES, TRIALS_FILE):
        assert any(name in line for line in end), (name, end)
    assert any(f"MLflow: sqlite:///{out_dir / 'mlflow.db'}" in line for line in end), end
    assert end[-1] == f"serve the answer: spectune serve {out_dir / 'best.yaml'}"


def test_the_dry_runs_end_says_where_a_relative_results_dir_goes_under_a_ray_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.sweep.execution.preview import morning_lines

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECTUNE_RESULTS_ROOT", str(tmp_path / "root"))
    spec = SweepSpec.from_yaml(REPO / "experiments" / "reference-cpu.yaml")
    first = morning_lines(spec)[0]
    assert first.startswith(f"results will land in {tmp_path / spec.results_dir} ")
    assert f"without --results-dir: {tmp_path / 'root' / spec.results_dir}" in first
    given = morning_lines(spec, results_dir=str(tmp_path / "chosen"))[0]
    assert "ray job submit" not in given
