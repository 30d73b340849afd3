"""The sweep's traffic: the spec's rules for it, the dataset pinned into the results directory, its
fingerprint and the warnings a person reads (orchestrator.sweep.execution.traffic_setup)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
from helpers.spec_cases import BASE
from orchestrator.bench.datasets import DatasetError
from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.traffic_setup import pin_dataset, read_traffic

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "experiments" / "traffic" / "chat-log.jsonl"


def _spec(**benchmark) -> SweepSpec:
    data = copy.deepcopy(BASE)
    data["benchmark"] = {**data.get("benchmark", {}), **benchmark}
    return SweepSpec.from_dict(data)


@pytest.mark.parametrize(("benchmark", "words"), [
    ({"dataset": "request_log"}, "needs dataset_path"),
    ({"dataset": "request_log", "dataset_path": "x.jsonl"}, "set api: chat"),
    ({"dataset": "request_log", "dataset_path": "x.jsonl", "api": "generate"}, "not generate"),
    ({"dataset": "builtin", "dataset_path": "x.jsonl"}, "only used with dataset: sharegpt or request_log"),
    ({"api": "completions", "chat_template_kwargs": {"thinking": False}}, "only sent with api: chat"),
    ({"api": "grpc"}, "api"),
])
def test_the_spec_refuses_traffic_it_cannot_replay_saying_what_to_set(benchmark: dict, words: str) -> None:
    with pytest.raises(SpecError) as info:
        _spec(**benchmark)
    assert words in str(info.value), str(info.value)


def test_the_dataset_is_copied_into_the_results_and_a_resume_keeps_its_copy(tmp_path: Path) -> None:
    log = tmp_path / "gateway.jsonl"
    log.write_bytes(SAMPLE.read_bytes())
    results = tmp_path / "results"
    spec = pin_dataset(_spec(dataset="request_log", dataset_path=str(log), api="chat"), results, resume=False)
    pinned = results / "traffic" / "gateway.jsonl"
    assert spec.benchmark.dataset_path == str(pinned.resolve()) and pinned.read_bytes() == SAMPLE.read_bytes()
    log.write_text('{"prompt": "changed since"}\n', encoding="utf-8")  # the user's file moves on; the sweep's does not
    again = pin_dataset(_spec(dataset="request_log", dataset_path=str(log), api="chat"), results, resume=True)
    assert again.benchmark.dataset_path == str(pinned.resolve()) and pinned.read_bytes() == SAMPLE.read_bytes()
    assert pin_dataset(_spec(), results, resume=False).benchmark.dataset_path is None, "builtin: nothing to pin"
    with pytest.raises(DatasetError, match="does not exist"):
        pin_dataset(_spec(dataset="request_log", dataset_path=str(tmp_path / "missing.jsonl"), api="chat"),
                    tmp_path / "other", resume=False)


def test_the_fingerprint_names_the_file_its_hash_and_what_was_not_replayable() -> None:
    spec = _spec(dataset="request_log", dataset_path=str(SAMPLE), api="chat", num_prompts=8,
                 chat_template_kwargs={"thinking": False})
    traffic, _ = read_traffic(spec)
    assert traffic.sha256 == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    assert traffic.source == "request_log" and traffic.api == "chat" and traffic.selected == 8
    assert traffic.not_replayable == {"images": 2, "tools": 2, "not_json": 1}
    assert traffic.chat_template_kwargs == {"thinking": False}
    params = traffic.mlflow_params()
    assert params["traffic.sha256"] == traffic.sha256 and json.loads(params["traffic.chat_template_kwargs"]) == {
        "thinking": False}
    assert "not: images 2, tools 2, not_json 1" in traffic.short(), traffic.short()


def test_logged_requests_without_a_temperature_are_named(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(line) for line in (
        {"messages": [{"role": "user", "content": "one"}], "temperature": 0.7},
        {"messages": [{"role": "user", "content": "two"}]},
    )) + "\n", encoding="utf-8")
    _, lines = read_traffic(_spec(dataset="request_log", dataset_path=str(log), api="chat", num_prompts=4))
    assert len(lines) == 1 and "2 of the 4 requests sent carry no temperature" in lines[0], lines
    assert "benchmark.temperature 0 (greedy)" in lines[0]
    assert read_traffic(_spec())[1] == [], "built-in prompts: the spec's sampling is the traffic's"
