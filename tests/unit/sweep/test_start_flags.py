"""Sweep-only start flags: what a trial's engine adds to start sooner, and that nothing served carries it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.spec import SweepSpec
from orchestrator.space import BASELINE_PLAIN, Candidate, SpeculativeTriple, TrialPlan
from orchestrator.sweep.execution.coordinator import SweepCoordinator
from orchestrator.sweep.records.results import read_records
from orchestrator.sweep.execution.start_flags import (
    reachable_batch_size,
    sweep_start_flags,
    with_start_flags,
)
from orchestrator.sweep.execution.trial import engine_config_for
from orchestrator.tracking import recorded_config
from serving.cuda_graph_rules import decode_batch_sizes
from serving.engine.command import build_command
from serving.engine.config import EngineConfig

SPEC_SPECULATIVE_DEFAULT = [*range(1, 9), *range(10, 33, 2), 40, 44, 48]
"""SGLang 0.5.23's decode capture under speculation, capped by max_running_requests 48."""


def _spec(**sections: Any) -> SweepSpec:
    data: dict[str, Any] = {"name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return SweepSpec.from_dict(data)


def _config(spec: SweepSpec, *, speculative: bool = True) -> EngineConfig:
    """A speculative point's engine, or the no-speculation baseline's (as a trial builds it)."""
    if not speculative:
        return engine_config_for(spec, TrialPlan(BASELINE_PLAIN, Candidate(SpeculativeTriple(None, None, None),
                                                                           "default", {})))
    return spec.engine_config(num_steps=3, eagle_topk=1, num_draft_tokens=4)


def test_sglangs_own_lists_for_a_given_max() -> None:
    # cuda_graph_hook.generate_decode_cuda_graph_batch_sizes: the pattern up to max_bs, max_bs appended
    assert decode_batch_sizes(48, speculative=True) == SPEC_SPECULATIVE_DEFAULT
    assert decode_batch_sizes(9, speculative=True) == [*range(1, 10)]
    assert decode_batch_sizes(11, speculative=True) == [*range(1, 9), 10, 11]
    assert decode_batch_sizes(48, speculative=False) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert decode_batch_sizes(6, speculative=False) == [1, 2, 4, 6]
    assert decode_batch_sizes(5, speculative=False, disable_padding=True) == [1, 2, 3, 4, 5]


def test_a_trial_starts_without_warmup_and_captures_up_to_its_highest_level() -> None:
    spec = _spec(benchmark={"concurrency": [1, 8]})
    flags = sweep_start_flags(spec, _config(spec))
    assert flags == {"skip_server_warmup": True, "cuda_graph_bs_decode": [1, 2, 3, 4, 5, 6, 7, 8],
                     "cuda_graph_max_bs_decode": 8}
    argv = build_command(with_start_flags(_config(spec), flags), port=1).argv
    tail = argv[argv.index("--skip-server-warmup"):]
    assert tail == ["--skip-server-warmup", "--cuda-graph-bs-decode", *"12345678", "--cuda-graph-max-bs-decode", "8"]


def test_every_reachable_size_pads_to_a_captured_one_no_larger_than_the_level() -> None:
    spec = _spec(benchmark={"concurrency": [2, 11]})
    sizes = sweep_start_flags(spec, _config(spec))["cuda_graph_bs_decode"]
    for batch in range(1, 12):  # SGLang replays the smallest captured size >= the batch (bisect_left)
        assert min(s for s in sizes if s >= batch) <= 11
    assert max(sizes) == 11 and sizes[:-1] == [s for s in SPEC_SPECULATIVE_DEFAULT if s < 11]


def test_the_no_speculation_engine_takes_sglangs_plain_pattern() -> None:
    spec = _spec(benchmark={"concurrency": [1, 16]})
    assert sweep_start_flags(spec, _config(spec, speculative=False))["cuda_graph_bs_decode"] == [1, 2, 4, 8, 12, 16]


def test_the_engines_request_cap_bounds_the_batch() -> None:
    spec = _spec(benchmark={"concurrency": [1, 64]})
    assert reachable_batch_size(spec, _config(spec)) == 48, "speculation caps max_running_requests at 48"
    assert sweep_start_flags(spec, _config(spec))["cuda_graph_bs_decode"] == SPEC_SPECULATIVE_DEFAULT
    assert reachable_batch_size(spec, _config(spec, speculative=False)) == 64, "no 48 cap without speculation"
    capped = _spec(benchmark={"concurrency": [1, 64]}, engine={"extra_args": {"max_running_requests": 20}})
    assert reachable_batch_size(capped, _config(capped)) == 20
    assert sweep_start_flags(capped, _config(capped, speculative=False))["cuda_graph_max_bs_decode"] == 20


def test_no_padding_in_extra_args_captures_every_size() -> None:
    spec = _spec(benchmark={"concurrency": [4]}, engine={"extra_args": {"disable_cuda_graph_padding": True}})
    assert sweep_start_flags(spec, _config(spec))["cuda_graph_bs_decode"] == [1, 2, 3, 4]


@pytest.mark.parametrize("extra", [
    {"cuda_graph_bs_decode": [1, 2, 3]}, {"cuda_graph_max_bs_decode": 16}, {"disable_decode_cuda_graph": True},
    {"cuda_graph_config": '{"decode": {"max_bs": 8}}'},
])
def test_a_spec_that_chooses_the_decode_graphs_keeps_its_choice(extra: dict) -> None:
    spec = _spec(engine={"extra_args": extra})
    flags = sweep_start_flags(spec, _config(spec))
    assert flags == {"skip_server_warmup": True}
    argv = build_command(with_start_flags(_config(spec), flags), port=1).argv
    assert argv.count("--cuda-graph-bs-decode") + argv.count("--cuda-graph-max-bs-decode") <= 1


def test_a_spec_that_keeps_sglangs_warmup_keeps_it() -> None:
    spec = _spec(engine={"extra_args": {"skip_server_warmup": False}})
    flags = sweep_start_flags(spec, _config(spec))
    assert "skip_server_warmup" not in flags and "cuda_graph_bs_decode" in flags
    assert "--skip-server-warmup" not in build_command(with_start_flags(_config(spec), flags), port=1).argv


def test_the_switch_turns_them_all_off() -> None:
    spec = _spec(budget={"sweep_only_start_flags": False})
    assert sweep_start_flags(spec, _config(spec)) == {}
    assert with_start_flags(_config(spec), {}) == _config(spec)


def test_mlflow_tags_them_and_serves_the_config_without_them(results_dir: Path) -> None:
    """What ``spectune serve --mlflow-run`` reads (the trial's engine_config.yaml) is the config the
    trial registered, without its start flags; the flags are a tag and part of the record."""
    results = results_dir
    uri = f"sqlite:///{results / 'mlflow.db'}"
    coordinator = SweepCoordinator(results_dir=str(results), tracking_uri=uri, experiment_name="unit",
                                   sweep_name="unit", spec_text="name: unit\n", resume=False)
    spec = _spec(benchmark={"concurrency": [2]})
    config = _config(spec)
    flags = sweep_start_flags(spec, config)
    command = build_command(with_start_flags(config, flags), port=0).shell()
    run = coordinator.start_trial({"trial_id": "a", "number": 0, "kind": "search", "label": "x", "params": {},
                                   "status": "running", "engine_command": command,
                                   "engine_config": config.model_dump(), "start_flags": flags})
    served = yaml.safe_load(recorded_config(tracking_uri=uri, run_id=run["run_id"]).text)
    assert "skip_server_warmup" not in served["extra_args"] and "cuda_graph_bs_decode" not in served["extra_args"]
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=uri).get_run(run["run_id"]).data.tags
    assert tags["spectune.start_flags"] == ("--skip-server-warmup --cuda-graph-bs-decode 1 2 "
                                           "--cuda-graph-max-bs-decode 2")
    assert coordinator.end_running(trial_id="a", status="failed", reason="error", message="stopped")
    (record,) = read_records(results / "trials.jsonl")
    assert record.start_flags == flags and "--skip-server-warmup" in record.engine_command
    assert "skip_server_warmup" not in record.engine_config["extra_args"]
