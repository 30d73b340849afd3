"""The night's answer on disk after every trial (issue 57, build 1): best.yaml holds SGLang's
default until a verdict says otherwise and names the best ok trial as an unconfirmed candidate;
best.yaml and the summary are published as one set, so a kill at any moment leaves a consistent pair;
``--finish`` refuses a directory that holds no sweep."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli.sweep import finish_refusal
from orchestrator.sweep.execution.coordinator import SweepCoordinator
from orchestrator.sweep.execution.finish import FALLBACK, best_yaml_choice, summary_report
from orchestrator.sweep.output import morning
from orchestrator.sweep.output.morning import read_as_of, retire_morning_files, write_morning_files
from orchestrator.bench.files import write_atomic
from orchestrator.sweep.records.results import served_engine_config
from serving.serve.options import read_served

import statistics

from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import Objective, TrialRecord
from serving.engine.config import EngineConfig

LEVEL = 4
AUTO_NUMBERS = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
SPECULATIVE = {"kind": "reference", "model_path": "ref-tiny", "tp_size": 1, "speculative_algorithm": "EAGLE3",
               "speculative_draft_model_path": "ref-tiny-draft"}
PLAIN_ENGINE = EngineConfig.model_validate({"kind": "reference", "model_path": "ref-tiny", "tp_size": 1}).model_dump()


def _engine(**numbers: int) -> dict:
    """An EngineConfig as a trial records it (``model_dump``)."""
    return EngineConfig.model_validate({**SPECULATIVE, **numbers}).model_dump()


def _trial(number: int, kind: str, label: str, values: list[float], *, params: dict, engine: dict | None = None,
           resolved: dict | None = None, status: str = "ok") -> TrialRecord:
    """A record as the trial's writer holds it at its end."""
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=label, params=params, status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else status, objective=Objective(
            metric="output_tok_per_s", concurrency=LEVEL, direction="max", values=values,
            median=statistics.median(values)), level_values={str(LEVEL): values}, repetitions_done=len(values),
        repetitions_planned=3, measured_in_full=status == "ok", resolved_params=resolved, engine_config=engine or {})


def _sweep() -> list[TrialRecord]:
    """No speculation (1), SGLang's default (2), an early-stopped point (3), the search's best (5)."""
    return [
        _trial(1, "baseline_plain", "no speculation", [140.0, 141.0, 139.0], params={"speculative": "off"},
               engine=PLAIN_ENGINE),
        _trial(2, "baseline_auto", "SGLang auto (= steps 3 topk 1 draft 4)", [340.0, 300.0, 380.0],
               params={"speculative": "auto"}, engine=_engine(), resolved=AUTO_NUMBERS),
        _trial(3, "search", "steps=6 topk=1 draft=7", [280.0], params={"speculative": "explicit"},
               status="early_stopped"),
        _trial(5, "search", "steps=5 topk=1 draft=6", [390.0, 392.0, 398.0], params={"speculative": "explicit"},
               engine=_engine(speculative_num_steps=5, speculative_eagle_topk=1, speculative_num_draft_tokens=6),
               resolved={"num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6}),
    ]


def _spec() -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "objective": {"metric": "output_tok_per_s", "concurrency": LEVEL}, "benchmark": {"concurrency": [LEVEL]},
    })


def _published(out: Path) -> tuple[dict, str]:
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return summary, (out / "best.yaml").read_text(encoding="utf-8")


def test_best_yaml_is_sglang_default_and_names_the_best_ok_trial_as_an_unconfirmed_candidate(tmp_path: Path) -> None:
    records = _sweep()  # trial 2 is SGLang's default, trial 5 the search's best
    records[3] = records[3].model_copy(update={"mlflow_run_id": "run5"})
    (tmp_path / "sweep-state.json").write_text(json.dumps({"tracking_uri": "sqlite:////r/mlflow.db"}))
    write_morning_files(_spec(), records, results_dir=tmp_path)
    summary, text = _published(tmp_path)
    served = read_served(tmp_path / "best.yaml")  # what `spectune serve best.yaml` would start
    assert served.engine.model_dump() == served_engine_config(records[1])[0]
    assert served.engine.speculative_num_steps == AUTO_NUMBERS["num_steps"]  # as the engine resolved SGLang's choice
    assert summary["best_yaml"]["trial"] == 2 and summary["candidate"]["trial"] == 5
    assert summary["candidate"]["confirmed"] is False
    assert "unconfirmed candidate: trial 5 steps=5 topk=1 draft=6" in text
    assert "--speculative-num-steps 5" in summary["candidate"]["engine_command"]
    assert summary["candidate"]["engine_command"] in text
    assert f"spectune sweep --finish {tmp_path}" in text
    # the serve line names the sweep's store: --mlflow-run alone finds no run
    assert "spectune serve --mlflow-run run5 --tracking-uri sqlite:////r/mlflow.db" in text


def test_before_sglang_default_is_measured_best_yaml_is_default_as_the_spec_makes_it(tmp_path: Path) -> None:
    plain = _trial(1, "baseline_plain", "no speculation", [140.0, 141.0, 139.0], params={"speculative": "off"},
                   engine=PLAIN_ENGINE)
    write_morning_files(_spec(), [plain], results_dir=tmp_path)
    summary, text = _published(tmp_path)
    engine = read_served(tmp_path / "best.yaml").engine
    assert engine.speculative_algorithm == "EAGLE3" and engine.speculative_num_steps is None
    assert summary["best_yaml"]["trial"] is None and summary["candidate"]["trial"] == 1  # the best measured so far
    assert "not measured yet" in text


def test_each_write_publishes_one_consistent_set(tmp_path: Path) -> None:
    records = _sweep()
    first = write_morning_files(_spec(), records[:2], results_dir=tmp_path)
    assert read_as_of(tmp_path) == {"summary.json": first, "best.yaml": first}
    second = write_morning_files(_spec(), records, results_dir=tmp_path, visits=[{"trial": 5, "round": 0}])
    assert second != first and read_as_of(tmp_path) == {"summary.json": second, "best.yaml": second}
    assert [p.name for p in tmp_path.glob(".morning-*")] == [os.readlink(tmp_path / "morning")]  # the old set went
    assert json.loads((tmp_path / "summary.json").read_text())["state"] == "confirming"


@pytest.mark.parametrize("fails_at", ["summary.txt", "publish"])
def test_a_write_cut_short_leaves_the_previous_set_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fails_at: str) -> None:
    """A kill part-way through a write: the new folder is half-written, or written but not published."""
    records = _sweep()
    before = write_morning_files(_spec(), records[:2], results_dir=tmp_path)
    real_open, real_relink = open, morning._relink

    def dying_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith("summary.txt") and ".morning-" in str(path):
            raise OSError("killed")
        return real_open(path, *args, **kwargs)

    def dying_relink(path: Path, target: str) -> None:
        if path.name == morning.MORNING_LINK:
            raise OSError("killed")
        real_relink(path, target)

    if fails_at == "summary.txt":
        monkeypatch.setattr("builtins.open", dying_open)
    else:
        monkeypatch.setattr(morning, "_relink", dying_relink)
    with pytest.raises(OSError):
        write_morning_files(_spec(), records, results_dir=tmp_path)
    monkeypatch.undo()
    assert read_as_of(tmp_path) == {"summary.json": before, "best.yaml": before}
    assert json.loads((tmp_path / "summary.json").read_text())["as_of"]["trials_recorded"] == 2  # as of trials 1-2
    after = write_morning_files(_spec(), records, results_dir=tmp_path)  # the next write cleans up
    assert read_as_of(tmp_path) == {"summary.json": after, "best.yaml": after}
    assert len(list(tmp_path.glob(".morning-*"))) == 1


def test_the_final_files_replace_the_interim_set(tmp_path: Path) -> None:
    write_morning_files(_spec(), _sweep(), results_dir=tmp_path)
    write_atomic(tmp_path / "summary.json", "{}\n")  # finish_sweep's final summary; no valid best: no best.yaml
    retire_morning_files(tmp_path)
    assert not (tmp_path / "summary.json").is_symlink() and (tmp_path / "summary.json").read_text() == "{}\n"
    assert not (tmp_path / "best.yaml").exists() and not (tmp_path / "best.yaml").is_symlink()
    assert not (tmp_path / "morning").is_symlink() and not list(tmp_path.glob(".morning-*"))


def test_the_writer_rewrites_the_set_after_every_recorded_trial(results_dir: Path) -> None:
    coordinator = SweepCoordinator(results_dir=str(results_dir), tracking_uri=f"sqlite:///{results_dir / 'mlflow.db'}",
                                   experiment_name="unit", sweep_name="unit", spec_text="name: t\n", spec=_spec())
    for record in _sweep():
        coordinator.finish_trial(record.model_dump())
        summary = json.loads((results_dir / "summary.json").read_text())
        assert summary["as_of"]["trials_recorded"] == record.number - (record.number > 3)  # trial 4 never ran
    assert summary["candidate"]["trial"] == 5
    coordinator.record_visit({"trial": 5, "round": 0, "status": "ok", "value": 1.0})
    assert read_as_of(results_dir)["best.yaml"] == "t4-v1"
    coordinator.end_morning()  # the final files are next: no interim write may overwrite them
    coordinator.record_visit({"trial": 2, "round": 0, "status": "ok", "value": 1.0})
    assert read_as_of(results_dir)["best.yaml"] == "t4-v1"


def test_finish_without_a_confirmation_keeps_sglang_default_and_names_the_candidate() -> None:
    records = _sweep()
    why = "--finish without --max-minutes: no confirmation was asked for"
    chosen, because = best_yaml_choice(_spec(), records, None, unconfirmed=why)
    assert chosen is records[1] and because.startswith(FALLBACK) and why in because
    report = summary_report(_spec(), records, None, unconfirmed=why)
    assert report["best_trial"] == 2 and report["candidate"]["trial"] == 5 and report["candidate"]["confirmed"] is False
    assert any(line.startswith("unconfirmed candidate: trial 5") for line in report["lines"])


def test_finish_refuses_what_holds_no_sweep(tmp_path: Path) -> None:
    def refusal(path: Path, **given: object) -> str | None:
        return finish_refusal(path, **{"spec": None, "resume": None, "smoke": False, "dry_run": False,
                                       "max_visits": None, **given})  # type: ignore[arg-type]

    assert "no such directory" in refusal(tmp_path / "missing")  # type: ignore[operator]
    (tmp_path / "file").write_text("x")
    assert "not a directory" in refusal(tmp_path / "file")  # type: ignore[operator]
    assert "not a sweep's results directory (no spec.yaml or sweep-state.json" in refusal(tmp_path)  # type: ignore[operator]
    (tmp_path / "spec.yaml").write_text("name: t\n")
    (tmp_path / "sweep-state.json").write_text("{}")
    assert refusal(tmp_path) is None
    assert "give it alone" in refusal(tmp_path, resume=tmp_path)  # type: ignore[operator]
    assert "--resume DIR --max-visits N" in refusal(tmp_path, max_visits=9)  # type: ignore[operator]
