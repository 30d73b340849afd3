"""Every figure the plan prints says where it comes from (measured, where and when; assumed, from what; or the
spec's), "does not fit" names what the running sweep would cut and offers only cuts that fit, the dry run
says the start time at which the plan stops fitting, and a sweep's measurements feed the next plan."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import orchestrator.sweep.output.night_plan as night
from orchestrator.cli import app
from orchestrator.sequential import judge
from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.extension import spec_design
from orchestrator.sweep.confirmation.margin import VISIT_CV_PRIOR, visit_cv_prior
from orchestrator.sweep.execution.preview import dry_run
from orchestrator.sweep.output.summary_report import measurement_lines, node_measurements
from orchestrator.sweep.records.results import TRIALS_FILE, TrialRecord
from helpers.timings import produced

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "experiments").glob("*.yaml"))
LABEL = r"(measured|assumed|the spec's)"


def _sources_exist(text: str) -> list[str]:
    """The "measured" labels in ``text`` whose source names no measurement: a docs/measurements directory
    that exists, an issue, or a node of this sweep."""
    bad = []
    for match in re.finditer(r"\(measured[:,]([^()]|\([^()]*\))*\)", text):
        label = match.group(0)
        paths = re.findall(r"docs/measurements/([\w.-]+)", label)
        if paths and all((ROOT / "docs" / "measurements" / p).exists() for p in paths):
            continue
        if re.search(r"issue \d+|\(nodes? ", label):
            continue
        bad.append(label)
    return bad


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_dry_run_of_every_shipped_spec_labels_each_figure(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(night, "DECISION_PATHS", 100)  # the labels, not the chances, are under test
    buf = io.StringIO()
    dry_run(SweepSpec.from_yaml(path), first=0, console=Console(file=buf, width=10_000))
    out = buf.getvalue()
    assert re.search(rf"x \S+ per start \({LABEL}", out), out  # the cost line's start
    assert re.search(rf"a trial = a start \S+ \({LABEL}.*\) \+ \S+ on the engine \({LABEL}", out), out
    cold = re.search(r"a node's cold first start \((\w+)", out)
    assert cold is None or cold.group(1) in ("measured", "assumed")
    for extra in re.findall(r"adds \S+ once \((.*)\)", out):
        assert re.search(r"(assumed|measured)", extra), extra
    spreads = re.findall(r"spread of [\d.]+% \((\w+)", out)
    spec = SweepSpec.from_yaml(path)
    if spec.confirmation.enabled and spec.engine.speculative_algorithm is not None:
        assert spreads and set(spreads) <= {"measured", "assumed"}, out
        assert "an undecided verdict keeps SGLang's default in best.yaml" in out
    assert "measured, median" not in out  # nothing ran: no figure of this sweep is measured
    assert _sources_exist(out) == [], out


def test_the_priors_say_which_are_measured_and_sglangs_is_not() -> None:
    assert visit_cv_prior("sglang").kind == "assumed" and visit_cv_prior("sglang").value == 0.003
    for figure in VISIT_CV_PRIOR.values():
        assert figure.kind in ("measured", "assumed")
        assert figure.kind == "assumed" or not _sources_exist(f"({figure.label()})"), figure


def _spec(**sections: Any) -> SweepSpec:
    data: dict[str, Any] = {
        "name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", "tp_size": 2},
        "search": {"speculative": {"num_steps": [1, 2, 3, 4], "eagle_topk": [1, 2], "num_draft_tokens": [4, 8]}},
        "benchmark": {"num_prompts": 32, "output_len": 100, "concurrency": [8], "repetitions": 3,
                      "min_repetition_s": 0},
        "confirmation": {"top_k": 1, "no_speculation": False, "max_visits": 6},
        "budget": {"num_trials": 16, "engine_start_estimate_s": 600, "tpot_estimate_ms": 10, "time_limit_s": 8 * 3600},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return SweepSpec.from_dict(data)


def test_the_plan_says_at_which_start_time_it_stops_fitting() -> None:
    plan = night.night_plan(_spec())
    limit = plan.fits_up_to_start_s()
    assert plan.fits and limit is not None and limit > plan.start_s
    assert plan.at_start(limit).total_s == pytest.approx(plan.limit_s)  # the cold start scales with it
    assert not plan.at_start(limit * 1.01).fits
    assert f"fits up to {limit / 60:.1f}-minute starts (planned: 10.0" in night.plan_lines(plan)[-1]


def test_does_not_fit_names_the_cut_and_offers_only_cuts_that_fit() -> None:
    # the case: a 16-trial spec whose search fits and whose confirmation does not
    spec = _spec(budget={"engine_start_estimate_s": 1200}, confirmation={"max_visits": 16})
    plan = night.night_plan(spec)
    assert not plan.fits
    line = night.plan_lines(plan)[-1]
    assert plan.affordable_trials() <= plan.trials  # never "after about 20 trials" of 16
    assert "the confirmation would get time for about" in line and "of its 16 visits per contender" in line
    changes = night.changes_to_fit(spec)
    assert changes and all(c.endswith("(fits)") for c in changes), changes
    assert any("confirmation.max_visits 16 -> " in c for c in changes), changes
    # at 20-minute starts and the default confirmation no single setting fits: a cut of trials and visits does
    slow = _spec(budget={"engine_start_estimate_s": 1200, "num_trials": 22}, confirmation={"max_visits": 16, "top_k": 3,
                                                                                           "no_speculation": True})
    changes = night.changes_to_fit(slow)
    assert changes and not any("still" in c for c in changes), changes
    assert changes[-1].endswith("(fits)") or changes[-1].startswith("no cut fits budget.time_limit_s"), changes
    validate = CliRunner().invoke(app, ["validate", str(_write(slow))])
    flat = " ".join(validate.output.split())
    assert validate.exit_code == 0 and flat.count("the night does not fit budget.time_limit_s (8h00m)") == 1, flat



def test_validate_warns_in_one_line_when_a_night_without_a_time_limit_plans_longer_than_a_night() -> None:
    """The issue's hand-written SGLang spec on the default confirmation: no limit, a 20-hour plan, and
    validate used to say nothing."""
    spec = _spec(confirmation={"top_k": 3, "no_speculation": True, "max_visits": 16}, budget={"num_trials": 40})
    unbounded = SweepSpec.from_dict({**spec.model_dump(mode="json", exclude_none=True),
                                     "budget": {**spec.budget.model_dump(mode="json", exclude_none=True),
                                                "time_limit_s": None}})
    assert unbounded.budget.time_limit_s is None and night.night_plan(unbounded).total_s > night.A_NIGHT_S
    flat = " ".join(CliRunner().invoke(app, ["validate", str(_write(unbounded))]).output.split())
    assert flat.count("no budget.time_limit_s bounds the night, and it plans") == 1, flat
    short = SweepSpec.from_dict({**unbounded.model_dump(mode="json", exclude_none=True),
                                 "budget": {"num_trials": 2, "engine_start_estimate_s": 60, "time_limit_s": None}})
    assert night.fit_warning(short) is None  # a short plan without a limit is nothing to warn of


def _write(spec: SweepSpec) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    return path


def test_the_decision_chance_simulates_the_judges_own_claims() -> None:
    spec = _spec(confirmation={"margin": 0.03})
    draws = night._draws(spec, visit_cv=0.02, gain=0.03, paths=60, seed=3)
    decided, better = night._claims(draws, spec, 0.03)
    design = spec_design(spec)
    for row, was_decided, was_better in zip(draws, decided, better):
        claims = [judge(list(row[:n]), margin=0.03, design=design, comparisons=spec.confirmation.top_k).claim
                  for n in range(2, design[-1].last + 1)]
        first = next((c for c in claims if c != "undecided"), "undecided")
        assert (first != "undecided", first == "better") == (bool(was_decided), bool(was_better)), claims


def _trial(number: int, start: float, node: str = "n1") -> TrialRecord:
    return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label="x", params={}, status="ok",
                       node_id=node, started_at=f"2026-12-05T20:{number:02d}:00+00:00", level_values={"8": [1.0] * 3},
                       timings_s=produced(engine_start=start, probe=5.0, bench=30.0, teardown=2.0, other=3.0))


def test_a_sweep_states_what_it_measured_and_the_next_plan_reads_it(tmp_path: Path) -> None:
    records = [_trial(1, 1200.0), _trial(2, 580.0), _trial(3, 620.0)]
    visits = [{"trial": t, "round": r, "status": "ok", "value": v}
              for t, values in ((2, (100.0, 101.0, 99.0)), (5, (90.0, 91.5))) for r, v in enumerate(values)]
    measured = node_measurements(records, visits)
    assert measured["warm_start_s"]["value"] == 600.0 and measured["cold_start_s"]["value"] == 1200.0
    assert measured["trial_s"]["value"] == pytest.approx(620.0 + 40.0)  # median trial, its wall time once
    logs = [[math.log(v) for v in (100.0, 101.0, 99.0)], [math.log(v) for v in (90.0, 91.5)]]
    pooled = sum(float(np.sum((np.array(x) - np.mean(x)) ** 2)) for x in logs) / 3
    assert measured["between_visit_cv"] == {"value": round(math.sqrt(pooled), 4), "df": 3,
                                            "kind": "pooled sd of log level"}
    assert measurement_lines(measured)[0].startswith("measured here (node n1, 2026-12-05): warm start 10m00s")
    (tmp_path / TRIALS_FILE).write_text("".join(r.model_dump_json() + "\n" for r in records))
    (tmp_path / "confirmation.jsonl").write_text("".join(json.dumps(v) + "\n" for v in visits))
    buf = io.StringIO()
    night.DECISION_PATHS, saved = 100, night.DECISION_PATHS
    try:
        dry_run(_spec(), first=0, console=Console(file=buf, width=10_000), previous=tmp_path)
    finally:
        night.DECISION_PATHS = saved
    out = buf.getvalue()
    assert "a start 10m00s (measured, median of 2 warm starts (node n1, 2026-12-05)" in out, out
    assert f"spread of {measured['between_visit_cv']['value']:.1%} (measured: this spec's sweep in {tmp_path}" in out
    assert _sources_exist(out) == [], out
