"""Loadgen parsing and payloads, datasets, settings, report JSON, probe comparison, server info."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.bench.datasets import DatasetError, load_builtin, load_prompts, load_sharegpt, random_prompts
from orchestrator.bench.loadgen import RequestRecord, Sampling, _Breaker, _Fail, _Response, build_payload
from orchestrator.bench.metrics import compute_repetition_metrics
from orchestrator.bench.probe import ProbeOutput, _write_new_baseline, compare_outputs
from orchestrator.bench.report import (
    BenchFailure,
    BenchmarkAborted,
    BenchResult,
    DatasetInfo,
    WarmupInfo,
    read_json,
    summarise_level,
    write_json,
)
from orchestrator.bench.control import accept_length_from_info, summarise_server_info
from orchestrator.bench.settings import BenchSettings
from orchestrator.cli import bench as commands
from orchestrator.errors import BenchmarkError
from orchestrator.spec_benchmark import BenchmarkSpec

# --- loadgen ----------------------------------------------------------------------------------


def test_native_stream_counts_tokens_from_meta_info_not_chunks() -> None:
    state = _Response("generate", keep_output=True, t0=10.0)
    state.event({"text": "a", "meta_info": {"completion_tokens": 1, "finish_reason": None}}, 10.1)
    state.event({"text": "abcd", "meta_info": {"completion_tokens": 4, "finish_reason": None}}, 10.2)
    state.event({"text": "abcd", "meta_info": {"completion_tokens": 4, "finish_reason": None}}, 10.25)  # no new tokens
    state.event(
        {"text": "abcdef", "meta_info": {
            "completion_tokens": 6, "prompt_tokens": 3, "spec_verify_ct": 2, "spec_accept_length": 3.0,
            "e2e_latency": 0.3, "finish_reason": {"type": "length", "length": 6}}},
        10.3,
    )
    assert state.ttft_ms == pytest.approx(100.0)
    assert state.num_chunks == 3
    assert state.output_tokens == 6 and state.prompt_tokens == 3
    assert state.verify_ct == 2 and state.spec_accept == 3.0
    assert state.finished and state.finish_reason == "length"
    assert state.output() == "abcdef"


def test_the_accepted_draft_histogram_is_read_from_the_final_meta_info_and_summed_per_level() -> None:
    """SGLang 0.5.23 sends the request's cumulative spec_correct_drafts_histogram ([k] = its verify
    cycles that accepted k drafts, bonus excluded); lengths differ per request, the sum pads."""
    from orchestrator.bench.metrics import sum_histograms

    state = _Response("generate", keep_output=False, t0=0.0)
    state.event({"text": "ab", "meta_info": {"completion_tokens": 2, "finish_reason": None,
                                             "spec_correct_drafts_histogram": [1]}}, 0.1)
    assert state.histogram is None  # only the final chunk's figures count
    state.event({"text": "abcdefg", "meta_info": {"completion_tokens": 7, "spec_verify_ct": 3,
                                                  "spec_correct_drafts_histogram": [1, 0, 2],
                                                  "finish_reason": {"type": "length"}}}, 0.2)
    assert state.histogram == [1, 0, 2]
    assert sum_histograms([[1, 0, 2], None, [3], [0, 1, 0, 4]]) == [4, 1, 2, 4]
    assert sum_histograms([None, []]) is None
    odd = _Response("generate", keep_output=False, t0=0.0)
    odd.event({"text": "a", "meta_info": {"completion_tokens": 1, "spec_correct_drafts_histogram": "1,2",
                                          "finish_reason": {"type": "length"}}}, 0.1)
    assert odd.histogram is None  # not a list of counts: not guessed at


def test_native_error_event_and_abort_are_failures() -> None:
    with pytest.raises(_Fail) as info:
        _Response("generate", False, 0.0).event({"error": {"message": "out of memory"}}, 1.0)
    assert info.value.kind == "server_error" and "out of memory" in str(info.value)
    with pytest.raises(_Fail) as info:
        _Response("generate", False, 0.0).event(
            {"text": "", "meta_info": {"completion_tokens": 0, "finish_reason": {"type": "abort", "message": "too long"}}}, 1.0
        )
    assert "too long" in str(info.value)


def test_openai_stream_takes_tokens_from_usage() -> None:
    state = _Response("chat", keep_output=True, t0=0.0)
    state.event({"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}, 0.05)  # no content
    state.event({"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]}, 0.1)
    state.event({"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}, 0.2)
    state.event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}, 0.21)
    assert state.ttft_ms == pytest.approx(100.0) and state.num_chunks == 2
    assert state.output_tokens == 2 and state.verify_ct is None
    assert state.output() == "Hello" and state.finish_reason == "stop"


def test_non_streamed_native_body_keeps_token_ids() -> None:
    state = _Response("generate", keep_output=True, t0=0.0)
    state.body({"text": "xy", "output_ids": [5, 6], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "length"}}})
    assert state.output_ids == [5, 6] and state.output() == "xy"
    with pytest.raises(_Fail):
        _Response("generate", False, 0.0).body({"text": "x", "meta_info": {}})


def test_payloads_use_each_apis_field_names() -> None:
    sampling = Sampling(max_new_tokens=16, temperature=0.0, seed=3, ignore_eos=True)
    native = build_payload(api="generate", text="hi", sampling=sampling, stream=True, model=None)
    assert native == {"text": "hi", "sampling_params": {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True},
                      "stream": True}
    hot = build_payload(api="generate", text="hi", sampling=Sampling(max_new_tokens=1, temperature=0.7, seed=3),
                        stream=False, model=None)
    assert hot["sampling_params"]["sampling_seed"] == 3
    chat = build_payload(api="chat", text="hi", sampling=sampling, stream=True, model="m")
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and chat["model"] == "m"
    assert chat["max_tokens"] == 16 and chat["stream_options"] == {"include_usage": True}
    completions = build_payload(api="completions", text="hi", sampling=sampling, stream=False, model=None)
    assert completions["prompt"] == "hi" and "model" not in completions and "stream_options" not in completions


def test_a_logged_request_brings_its_messages_cap_and_sampling_and_asks_for_spec_details() -> None:
    from orchestrator.bench.loadgen import WorkItem

    sampling = Sampling(max_new_tokens=64, temperature=0.0, seed=3, ignore_eos=True)
    item = WorkItem(prompt_id="log-1", text="fix it", messages=(("system", "be brief"), ("user", "fix it")),
                    max_tokens=200, temperature=0.7, top_p=0.9)
    chat = build_payload(api="chat", text=item.text, sampling=sampling, stream=True, model="m", item=item,
                         chat_template_kwargs={"thinking": False})
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix it"}]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (64, 0.7, 0.9), "the cap never above the run's"
    assert chat["return_spec_tokens_details"] is True and chat["chat_template_kwargs"] == {"thinking": False}
    short = build_payload(api="chat", text="x", sampling=sampling, stream=False, model=None,
                          item=WorkItem(prompt_id="p", text="x", max_tokens=8))
    assert short["max_tokens"] == 8 and short["temperature"] == 0.0 and "top_p" not in short
    native = build_payload(api="generate", text="x", sampling=sampling, stream=True, model=None, item=item)
    assert "return_spec_tokens_details" not in native and native["sampling_params"]["top_p"] == 0.9
    assert native["sampling_params"]["sampling_seed"] == 3


def test_openai_responses_give_the_spec_counters_from_sglext() -> None:
    """SGLang 0.5.23's ``sglext.spec_tokens_details`` (non-streamed body, and a stream's final chunk)."""
    details = {"spec_verify_ct": 4, "spec_accept_length": 2.5, "spec_num_correct_drafts": 6,
               "spec_num_proposed_drafts": 12, "spec_correct_drafts_histogram": [1, 1, 1, 1]}
    body = _Response("chat", keep_output=False, t0=0.0)
    body.body({"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
               "usage": {"completion_tokens": 10, "prompt_tokens": 3}, "sglext": {"spec_tokens_details": details}})
    assert (body.verify_ct, body.spec_accept, body.correct_drafts, body.proposed_drafts) == (4, 2.5, 6, 12)
    assert body.histogram == [1, 1, 1, 1]
    stream = _Response("completions", keep_output=False, t0=0.0)
    stream.event({"choices": [{"text": "a", "finish_reason": None}]}, 0.1)
    stream.event({"choices": [], "usage": {"completion_tokens": 10}, "sglext": {"spec_tokens_details": [details]}}, 0.2)
    assert stream.verify_ct == 4 and stream.histogram == [1, 1, 1, 1]
    plain = _Response("chat", keep_output=False, t0=0.0)
    plain.body({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    assert plain.verify_ct is None and plain.histogram is None, "absent means not reported, never 0"


def test_breaker_trips_on_timeouts_in_a_row_with_nothing_completing() -> None:
    def record(kind: str | None, status: int | None = None) -> RequestRecord:
        return RequestRecord(index=0, prompt_id="p", error=None if kind is None else "x", error_kind=kind, status=status)

    breaker = _Breaker(limit=3, hang_limit=2)
    breaker.note(record("timeout", status=200))  # timed out mid-stream
    breaker.note(record(None))  # something completed: the engine is alive
    breaker.note(record("timeout"))
    breaker.note(record("http_5xx", status=500))  # an answer, even an error, is not a hang
    breaker.note(record("timeout"))
    assert not breaker.open
    breaker.note(record("timeout"))
    assert breaker.hung and breaker.open and not breaker.refusing
    refused = _Breaker(limit=3, hang_limit=2)
    for _ in range(3):
        refused.note(record("connection"))
    assert refused.refusing and not refused.hung


# --- datasets ---------------------------------------------------------------------------------


def test_builtin_prompts_are_varied_real_text() -> None:
    prompts = load_builtin()
    assert 60 <= len(prompts) <= 80
    assert len({p.id for p in prompts}) == len(prompts)
    lengths = sorted(len(p.text) for p in prompts)
    assert lengths[0] < 100 and lengths[-1] > 800  # short questions and long contexts


def test_prompt_selection_is_seeded_and_repeats_when_asked_for_more() -> None:
    a = load_prompts(dataset="builtin", count=100, seed=1)
    assert a == load_prompts(dataset="builtin", count=100, seed=1)
    assert a != load_prompts(dataset="builtin", count=100, seed=2)
    assert len(a) == 100 and len({p.id for p in a}) == len(load_builtin())


def test_sharegpt(tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"id": "x1", "conversations": [{"from": "human", "value": "Hello?"}, {"from": "gpt", "value": "Hi"}]},
        {"id": "x2", "conversations": [{"from": "gpt", "value": "no human turn"}]},
        {"messages": [{"role": "user", "content": "Chat format"}]},
    ]))
    prompts = load_sharegpt(path)
    assert [(p.id, p.text) for p in prompts] == [("x1", "Hello?"), ("sharegpt-2", "Chat format")]
    with pytest.raises(DatasetError, match="does not exist"):
        load_sharegpt(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DatasetError, match="expected a JSON list"):
        load_sharegpt(tmp_path / "bad.json")


def test_random_prompts_have_the_asked_length() -> None:
    prompts = random_prompts(count=3, input_len=50, seed=0)
    assert all(len(p.text.split()) == 50 for p in prompts)
    assert prompts == random_prompts(count=3, input_len=50, seed=0)


def test_random_input_len_is_words_everywhere_it_is_described() -> None:
    """random_prompts counts words; the spec field, the settings and the CLI option must say so."""
    import typing

    assert "(words)" in BenchSettings.model_fields["random_input_len"].description
    option = typing.get_type_hints(commands.bench, include_extras=True)["random_input_len"].__metadata__[0]
    assert option.help.startswith("Words (not tokens) per random prompt")
    prompts = load_prompts(dataset="random", count=2, seed=0, random_input_len=7)
    assert [len(p.text.split()) for p in prompts] == [7, 7]


# --- settings ---------------------------------------------------------------------------------


def test_settings_are_the_specs_benchmark_section_plus_knobs() -> None:
    spec = BenchmarkSpec(num_prompts=5, concurrency=[8, 1], repetitions=2)
    settings = BenchSettings.from_spec(spec, noise_metrics=["ttft_ms_p99"])
    assert isinstance(settings, BenchmarkSpec)
    assert settings.concurrency == [1, 8] and settings.num_prompts == 5
    assert settings.noise_metrics == ["ttft_ms_p99"]
    with pytest.raises(ValueError, match="allow_random_prompts"):
        BenchSettings(dataset="random")
    with pytest.raises(ValueError, match="unknown metrics"):
        BenchSettings(noise_metrics=["tok_per_s"])


# --- report -----------------------------------------------------------------------------------


def _result(**fields) -> BenchResult:
    from orchestrator.bench.loadgen import RequestRecord

    reps = [
        compute_repetition_metrics(
            records=[RequestRecord(index=0, prompt_id="p", output_tokens=10, ttft_ms=1.0, e2e_ms=10.0, num_chunks=5)],
            duration_s=duration, concurrency=2, repetition=i, request_rate=None, accept_length_server=None,
            accept_length_tolerance=0.1,
        )
        for i, duration in enumerate([1.0, 1.0, 2.0])
    ]
    level = summarise_level(concurrency=2, request_rate=None, repetitions=reps,
                            noise_metrics=["output_tok_per_s"], noisy_cv_threshold=0.05)
    return BenchResult(
        created_at="2026-01-01T00:00:00+00:00", base_url="http://x", api="completions", model="m", server={},
        flush_cache_supported=False, settings=BenchSettings(), dataset=DatasetInfo(
            name="builtin", num_prompts=1, distinct_prompts=1, mean_prompt_chars=3.0),
        warmup=WarmupInfo(num_requests=0, num_errors=0, errors_by_kind={}), levels=[level], num_requests=3,
        num_errors=0, accept_length_mismatch=False, noisy=level.noisy, **fields,
    )


def test_level_summary_flags_noise() -> None:
    result = _result()
    level = result.level(2)
    assert level.summary["output_tok_per_s"].median == 10.0  # 10, 10, 5
    assert level.noisy and level.noisy_metrics[0].startswith("output_tok_per_s")
    assert level.summary["accept_length"].count == 0  # absent, not zero
    assert result.metric("output_tok_per_s") == 10.0
    assert result.flat()["c2.output_tok_per_s"] == 10.0
    with pytest.raises(KeyError):
        result.level(3)


def test_a_level_summary_states_log_scale_intervals_in_its_json(tmp_path: Path) -> None:
    """10, 10, 5 tok/s: the interval is about the geometric mean (10 * 10 * 5)^(1/3) = 7.937005, not
    the arithmetic mean 8.33; a count that is 0 and a one-request sample get none."""
    data = json.loads(write_json(_result(), tmp_path / "r.json").read_text())
    tok = data["levels"][0]["summary"]["output_tok_per_s"]
    assert tok["geomean"] == pytest.approx(500 ** (1 / 3)) and 0 < tok["ci95_low"] < tok["geomean"] < tok["ci95_high"]
    assert data["levels"][0]["summary"]["num_errors"]["ci95_low"] is None  # 0 errors: no geometric mean
    assert data["levels"][0]["repetitions"][0]["ttft_ms"]["ci95_low"] is None  # one request


def test_too_few_repetitions_for_the_target_are_said_so() -> None:
    from rich.console import Console

    from orchestrator.bench.report import summary_table

    result = _result()
    two = summarise_level(concurrency=2, request_rate=None, repetitions=result.levels[0].repetitions[:2],
                          noise_metrics=[], noisy_cv_threshold=0.05, target_ci_rel=0.02)
    assert two.ci_rel is None and two.target_met is False
    shown = result.model_copy(update={"levels": [two]})
    err = Console(record=True, width=400)
    commands._show_trust(shown, err)
    assert "no 95% interval of output_tok_per_s from 2 repetitions (an interval needs 3" in err.export_text()
    table = Console(record=True, width=400)
    table.print(summary_table(shown))
    assert "- NOT met" in table.export_text()


def test_json_round_trip_and_schema_version(tmp_path: Path) -> None:
    result = _result()
    path = write_json(result, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == "spectune.bench/3"
    assert data["status"] == "ok" and data["failure"] is None
    assert data["levels"][0]["repetitions_used"] == 3  # written for readers, ignored when read back
    assert data["levels"][0]["repetitions"][0]["accept_length"] is None
    assert read_json(path) == result
    data["schema_version"] = "spectune.bench/999"
    path.write_text(json.dumps(data))
    with pytest.raises(BenchmarkError, match="schema_version"):
        read_json(path)


def test_a_version_1_document_is_read_as_a_completed_run(tmp_path: Path) -> None:
    result = _result()
    data = json.loads(result.model_dump_json())
    del data["status"], data["failure"]
    data["schema_version"] = "spectune.bench/1"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = read_json(path)
    assert old.schema_version == "spectune.bench/3" and old.status == "ok" and old.failure is None
    assert old == result
    path.write_text("{not json")
    with pytest.raises(BenchmarkError, match="cannot be read as a benchmark result"):
        read_json(path)


def test_a_version_2_document_is_read_with_the_level_facts_it_lacks_left_unknown(tmp_path: Path) -> None:
    data = json.loads(_result().model_dump_json())
    data["schema_version"] = "spectune.bench/2"
    del data["drift"], data["target_met"], data["warmup"]["duration_s"]
    for level in data["levels"]:
        for name in ("warmup", "target_metric", "target_ci_rel", "ci_rel", "target_met", "drift", "repetitions_used"):
            del level[name]
    for name in ("warmup", "min_repetitions", "target_ci_rel", "target_metric"):
        del data["settings"][name]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(data))
    old = read_json(path)
    assert old.schema_version == "spectune.bench/3" and not old.drift and old.target_met is None
    level = old.level(2)
    assert level.warmup is None and level.target_met is None and level.drift is None and level.ci_rel is None
    assert level.repetitions_used == 3 and not level.drifts
    assert old.settings.repetitions == 10 and old.settings.target_ci_rel == 0.02  # what /2 lacks takes today's default


def _failure(**fields) -> BenchFailure:
    return BenchFailure(**{"phase": "measure", "concurrency": 2, "repetition": 3, "reason": "engine died", **fields})


def test_a_failed_run_states_where_and_why(tmp_path: Path) -> None:
    failed = _result(status="failed", failure=_failure())
    assert read_json(write_json(failed, tmp_path / "f.json")) == failed
    assert failed.num_repetitions == 3
    with pytest.raises(ValueError, match="a failed run states its failure"):
        _result(status="failed")
    with pytest.raises(ValueError, match="a completed one has none"):
        _result(failure=_failure())


def test_aborted_carries_the_partial_result_and_survives_pickling() -> None:
    """Ray pickles what a trial raises: the partial result must come through, not just the message."""
    import pickle

    partial = _result(status="failed", failure=_failure())
    error = BenchmarkAborted(partial)
    assert isinstance(error, BenchmarkError) and str(error) == "engine died"
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, BenchmarkAborted) and copy.partial == partial and str(copy) == "engine died"
    with pytest.raises(ValueError, match="needs a failed result"):
        BenchmarkAborted(_result())


def test_json_is_replaced_whole_never_rewritten_in_place(tmp_path: Path) -> None:
    """A reader that opened the old document keeps reading all of it: the new one is renamed over it."""
    path = write_json(_result(), tmp_path / "r.json")
    old_text = path.read_text()
    with path.open(encoding="utf-8") as reader:
        write_json(_result(status="failed", failure=_failure()), path)
        assert reader.read() == old_text  # in-place truncation would leave this reader nothing
    assert read_json(path).status == "failed"
    assert (path.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary file left
    with pytest.raises(OSError):
        write_json(_result(), tmp_path)  # a directory: nothing written, nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_level_is_read_through_the_metric_table() -> None:
    level = _result().level(2)
    assert level.value("queue_delay_ms_p50") is None  # known, absent in closed loop
    with pytest.raises(KeyError, match="unknown metric 'tok_per_s'; known: output_tok_per_s"):
        level.value("tok_per_s")  # a typo is not an absent value
    assert set(_result().flat()) == {f"c2.{name}" for name, dist in level.summary.items() if dist.median is not None}


# --- where things are defined ----------------------------------------------------------------


def test_the_spec_reaches_no_benchmark_code() -> None:
    """Data flows one way: the spec's benchmark section and the metrics a sweep may optimise are the
    spec's (``orchestrator.spec_benchmark``); the bench's settings subclass the section and its metric
    table computes those metrics; spec.py imports nothing of the bench, and the bench nothing of spec.py."""
    import ast

    import orchestrator.bench.metrics as metrics_module
    import orchestrator.bench.settings as settings_module
    import orchestrator.spec as spec
    import orchestrator.spec_benchmark as spec_benchmark

    def imported(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        return {m for m in names | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} if m}

    for module in (settings_module, metrics_module):
        assert "orchestrator.spec" not in imported(module), module.__name__
    for module in (spec, spec_benchmark):
        assert not {m for m in imported(module) if m.startswith("orchestrator.bench")}, module.__name__
    assert BenchmarkSpec.__module__ == "orchestrator.spec_benchmark"
    assert issubclass(settings_module.BenchSettings, BenchmarkSpec)


def test_loading_a_spec_does_not_import_the_http_client_or_scipy() -> None:
    """spec.py imports from orchestrator.bench; that must not pull in aiohttp (the package's exports
    are lazy) or scipy.stats (imported on the first interval computed)."""
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.spec; "
        "print(sorted(m for m in ('aiohttp', 'scipy.stats', 'orchestrator.bench.runner') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


# --- probe ------------------------------------------------------------------------------------


def test_probe_compares_tokens_and_names_first_difference() -> None:
    base = [ProbeOutput(prompt_id="a", output_ids=[1, 2, 3], text="x"), ProbeOutput(prompt_id="b", output_ids=[4, 5], text="y")]
    same = [o.model_copy() for o in base]
    assert compare_outputs(baseline=base, current=same) == ("token", [])
    changed = [base[0], ProbeOutput(prompt_id="b", output_ids=[4, 9], text="y")]
    unit, mismatches = compare_outputs(baseline=base, current=changed)
    assert unit == "token" and len(mismatches) == 1
    assert (mismatches[0].prompt_index, mismatches[0].prompt_id, mismatches[0].position) == (1, "b", 1)
    assert "[5]" in mismatches[0].expected and "[9]" in mismatches[0].got
    shorter = [ProbeOutput(prompt_id="a", output_ids=[1, 2], text="x"), base[1]]
    assert compare_outputs(baseline=base, current=shorter)[1][0].position == 2


def test_probe_falls_back_to_text() -> None:
    base = [ProbeOutput(prompt_id="a", output_ids=None, text="hello world")]
    unit, mismatches = compare_outputs(baseline=base, current=[ProbeOutput(prompt_id="a", output_ids=None, text="hello there")])
    assert unit == "char" and mismatches[0].position == 6


def test_baseline_write_is_atomic_and_never_replaces_one_written_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "baseline.json"
    _write_new_baseline(path, '{"ours": 1}\n')
    assert path.read_text() == '{"ours": 1}\n' and (path.stat().st_mode & 0o777) == 0o644
    with pytest.raises(BenchmarkError, match="created by someone else while this probe ran; not overwritten"):
        _write_new_baseline(path, '{"later": 2}\n')
    assert path.read_text() == '{"ours": 1}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["baseline.json"]  # no temporary file left


# --- server info ------------------------------------------------------------------------------


def test_accept_length_from_server_info() -> None:
    assert accept_length_from_info({"internal_states": [{"avg_spec_accept_length": 2.5}]}) == 2.5
    assert accept_length_from_info({"internal_states": [{"avg_spec_accept_length": 2.0},
                                                        {"avg_spec_accept_length": 3.0}]}) == 2.5
    assert accept_length_from_info({"internal_states": [{"avg_spec_accept_length": None}]}) is None
    assert accept_length_from_info({"avg_spec_accept_length": 1.5}) == 1.5  # older SGLang
    assert accept_length_from_info(None) is None
    assert summarise_server_info({"model_path": "m", "random": 1}) == {"model_path": "m"}


def test_error_messages_quoting_model_output_are_not_read_as_markup(capsys: pytest.CaptureFixture[str]) -> None:
    exit_ = commands._fail(commands.EXIT_FAILED, "HTTP 500: [/INST] then [bold]x[/bold] and a \\")
    assert exit_.exit_code == commands.EXIT_FAILED
    assert "error: HTTP 500: [/INST] then [bold]x[/bold] and a \\" in capsys.readouterr().err



def test_a_repetition_grows_to_last_min_repetition_s_at_the_measured_rate() -> None:
    from orchestrator.bench.runner import MAX_REPETITION_REQUESTS, repetition_size

    spec = BenchSettings(num_prompts=16, min_repetition_s=20.0)
    assert repetition_size(spec, rate_rps=2.0) == 40, "16 requests at 2/s last 8 s; 40 fill 20 s"
    assert repetition_size(spec, rate_rps=0.5) == 16, "already longer than 20 s: never fewer than num_prompts"
    assert repetition_size(spec, rate_rps=None) == 16, "no rate measured yet (no warm-up)"
    assert repetition_size(BenchSettings(num_prompts=16), rate_rps=2.0) == 16, "spectune bench: exactly as asked"
    assert repetition_size(spec, rate_rps=1e9) == MAX_REPETITION_REQUESTS


@pytest.mark.parametrize(
    ("server_info_status", "expected", "alias_asked"),
    [(200, {"via": "server_info"}, False), (404, {"via": "alias"}, True), (503, None, False)],
)
def test_get_server_info_asks_the_deprecated_alias_only_when_server_info_is_missing(
    server_info_status: int, expected: dict | None, alias_asked: bool
) -> None:
    import asyncio

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from orchestrator.bench.control import get_server_info

    asked: list[str] = []

    async def server_info(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"via": "server_info"}, status=server_info_status)

    async def alias(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"via": "alias"})

    async def run() -> dict | None:
        app = web.Application()
        app.router.add_get("/server_info", server_info)
        app.router.add_get("/get_server_info", alias)
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            return await get_server_info(session, str(server.make_url("/")))

    assert asyncio.run(run()) == expected
    assert ("/get_server_info" in asked) is alias_asked


def test_resolved_speculative_reads_an_older_servers_get_server_info() -> None:
    """A server from before the rename (no /server_info) still tells the trial what it resolved,
    from the top level or, failing that, ``internal_states[0]``."""
    import threading

    from aiohttp import web

    from orchestrator.bench.control import resolved_speculative
    from serving.ports import free_port

    numbers = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    port = free_port()
    ready = threading.Event()
    stop: list = []

    def serve() -> None:
        import asyncio

        async def old_info(_request: web.Request) -> web.Response:
            return web.json_response({"internal_states": [numbers]})

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/get_server_info", old_info)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            done = asyncio.Event()
            stop.append((asyncio.get_running_loop(), done))
            ready.set()
            await done.wait()
            await runner.cleanup()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        got = resolved_speculative(f"http://127.0.0.1:{port}")
    finally:
        loop, done = stop[0]
        loop.call_soon_threadsafe(done.set)
        thread.join(30)
    assert got == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
