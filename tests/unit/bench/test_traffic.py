"""The traffic fingerprint: hashes per source, quantiles against hand-computed values, the greedy
share, top_p, and what short() and mlflow_params() show."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.bench.datasets import DatasetError, Prompt, load_prompts, random_prompts
from orchestrator.bench.request_log import load_request_log, sample_requests
from orchestrator.bench.traffic import MLFLOW_PARAM_MAX, TrafficFingerprint, fingerprint

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "experiments" / "traffic" / "chat-log.jsonl"


def _prompts(lengths: list[int]) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text="x" * n) for i, n in enumerate(lengths)]


def _fp(prompts: list[Prompt], **kw: object) -> TrafficFingerprint:
    args: dict = dict(source="random", prompts=prompts, selected=len(prompts), seed=0, api="generate",
                      output_len=128, temperature=0.0, ignore_eos=True)
    args.update(kw)
    return fingerprint(**args)


# --- hashes -----------------------------------------------------------------------------------


def test_the_builtin_hash_is_of_the_shipped_prompts_file() -> None:
    data = resources.files("orchestrator.bench").joinpath("data", "prompts.jsonl").read_bytes()
    fp = _fp(load_prompts(dataset="builtin", count=8, seed=3), source="builtin", seed=3)
    assert fp.sha256 == hashlib.sha256(data).hexdigest()
    assert fp.path is None and fp.requests_in_file == fp.replayable == len(data.strip().splitlines())
    assert fp.not_replayable == {}


def test_the_random_hash_is_of_the_prompts_texts() -> None:
    a = _fp(random_prompts(count=4, input_len=16, seed=1))
    assert a.sha256 == _fp(random_prompts(count=4, input_len=16, seed=1)).sha256
    assert a.sha256 != _fp(random_prompts(count=4, input_len=16, seed=2)).sha256
    assert a.path is None and a.requests_in_file is None and a.replayable is None


def test_a_request_log_hash_changes_when_one_byte_changes(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hello"}]}\n')
    before = _fp(load_request_log(path).prompts, source="request_log", api="chat", log=load_request_log(path))
    path.write_text('{"messages": [{"role": "user", "content": "hellp"}]}\n')
    after = _fp(load_request_log(path).prompts, source="request_log", api="chat", log=load_request_log(path))
    assert before.sha256 != after.sha256
    assert before.path == str(path)  # taken from the log when not given


def test_a_sharegpt_hash_is_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}]))
    fp = _fp(_prompts([2]), source="sharegpt", path=str(path))
    assert fp.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and fp.path == str(path)
    with pytest.raises(DatasetError, match="gone.json"):
        _fp(_prompts([2]), source="sharegpt", path=str(tmp_path / "gone.json"))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"source": "nope"}, "source"),
        ({"api": "grpc"}, "api"),
        ({"prompts": []}, "no prompts"),
        ({"output_len": 0}, "output_len"),
        ({"source": "request_log"}, "log"),
        ({"source": "builtin", "path": "x.jsonl"}, "path"),
        ({"source": "sharegpt"}, "path"),
    ],
)
def test_inconsistent_arguments_are_refused(kw: dict, match: str) -> None:
    args = {"prompts": _prompts([1]), **kw}
    with pytest.raises(ValueError, match=match):
        _fp(**args)


# --- the request shape ------------------------------------------------------------------------


def test_input_quantiles_are_inclusive_and_interpolated() -> None:
    # 1..11 characters: inclusive p10 = 1 + 0.1 * 10 = 2, p50 = 6, p90 = 10, max 11.
    fp = _fp(_prompts(list(range(1, 12))))
    assert fp.input_chars == {"p10": 2.0, "p50": 6.0, "p90": 10.0, "max": 11.0}
    # Between ranks: [10, 20] -> p10 = 11, p50 = 15, p90 = 19.
    assert _fp(_prompts([20, 10])).input_chars == {"p10": 11.0, "p50": 15.0, "p90": 19.0, "max": 20.0}


def test_one_prompt_is_every_quantile_of_itself() -> None:
    fp = _fp(_prompts([42]))
    assert fp.input_chars == {"p10": 42.0, "p50": 42.0, "p90": 42.0, "max": 42.0}


def test_a_chat_prompt_counts_its_messages_joined() -> None:
    prompt = Prompt(id="c", text="user!", messages=(("system", "abc"), ("user", "user!")))
    assert _fp([prompt]).input_chars["max"] == len("abc\nuser!")


def test_the_output_cap_is_the_prompt_s_below_the_run_s() -> None:
    prompts = [Prompt(id="a", text="t", max_tokens=64), Prompt(id="b", text="t", max_tokens=500),
               Prompt(id="c", text="t")]
    fp = _fp(prompts, output_len=128)  # effective caps 64, 128, 128
    assert fp.output_cap == {"p50": 128.0, "p90": 128.0, "max": 128.0}
    assert _fp(prompts[:1] * 3 + prompts[2:], output_len=128).output_cap["p50"] == 64.0


def test_the_temperature_is_the_prompt_s_else_the_run_s() -> None:
    prompts = [Prompt(id="a", text="t", temperature=0.0), Prompt(id="b", text="t", temperature=0.8),
               Prompt(id="c", text="t"), Prompt(id="d", text="t")]
    fp = _fp(prompts, temperature=0.0)  # 0, 0.8, 0, 0
    assert fp.temperature == {"greedy_share": 0.75, "min": 0.0, "p50": 0.0, "max": 0.8}
    fp = _fp(prompts, temperature=0.5)  # 0, 0.8, 0.5, 0.5
    assert fp.temperature == {"greedy_share": 0.25, "min": 0.0, "p50": 0.5, "max": 0.8}


def test_top_p_is_none_unless_set_and_the_median_of_the_values_set() -> None:
    assert _fp(_prompts([1, 2])).top_p is None
    same = [Prompt(id=str(i), text="t", top_p=0.9) for i in range(3)] + [Prompt(id="n", text="t")]
    assert _fp(same).top_p == 0.9
    mixed = [Prompt(id="a", text="t", top_p=0.9), Prompt(id="b", text="t", top_p=0.95),
             Prompt(id="c", text="t", top_p=1.0)]
    assert _fp(mixed).top_p == 0.95


def test_the_model_is_strict_and_frozen() -> None:
    fp = _fp(_prompts([1]))
    with pytest.raises(ValidationError):
        TrafficFingerprint.model_validate({**fp.model_dump(), "extra": 1})
    with pytest.raises(ValidationError):
        fp.seed = 2  # type: ignore[misc]
    assert TrafficFingerprint.model_validate_json(fp.model_dump_json()) == fp


# --- what a person and MLflow see -------------------------------------------------------------


def _shipped(count: int = 16, seed: int = 0, **kw: object) -> TrafficFingerprint:
    log = load_request_log(SHIPPED)
    args: dict = dict(source="request_log", prompts=sample_requests(log, count=count, seed=seed), selected=count,
                      seed=seed, api="chat", output_len=128, temperature=0.0, ignore_eos=True, log=log)
    args.update(kw)
    return fingerprint(**args)


def test_the_shipped_log_s_fingerprint() -> None:
    fp = _shipped()
    assert fp.source == "request_log" and fp.path == str(SHIPPED) and fp.selected == 16
    assert fp.requests_in_file == 40 and fp.replayable == 35
    assert fp.not_replayable == {"tools": 2, "images": 2, "not_json": 1}
    assert fp.sha256 == hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    assert 0 < fp.temperature["greedy_share"] < 1 and fp.output_cap["max"] <= 128


def test_short_mentions_the_file_the_counts_and_the_shape() -> None:
    line = _shipped().short()
    assert "\n" not in line
    assert line.startswith("request_log chat-log.jsonl (sha256 ")
    assert "40 requests, 35 replayable, 5 not: images 2, tools 2, not_json 1" in line
    assert "16 per repetition" in line and "api chat" in line and "greedy)" in line and "ignore_eos true" in line


def test_short_of_the_builtin_set() -> None:
    fp = _fp(load_prompts(dataset="builtin", count=4, seed=0), source="builtin", ignore_eos=False)
    line = fp.short()
    assert line.startswith("builtin (sha256 ") and "not:" not in line
    assert "temperature 0," in line and "greedy" not in line and "output cap 128" in line and "ignore_eos false" in line


def test_mlflow_params_are_flat_strings_within_mlflow_s_limit() -> None:
    params = _shipped(chat_template_kwargs={"thinking": False, "note": "y" * 2000}).mlflow_params()
    assert all(key.startswith("traffic.") for key in params)
    assert all(isinstance(v, str) and len(v) <= MLFLOW_PARAM_MAX for v in params.values())
    assert params["traffic.source"] == "request_log"
    assert params["traffic.sha256"] == hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    assert params["traffic.not_replayable"] == "images 2, tools 2, not_json 1"  # by count, then name
    assert params["traffic.requests"].startswith("40 requests, 35 replayable")
    assert params["traffic.api"] == "chat" and params["traffic.ignore_eos"] == "true"
    assert params["traffic.chat_template_kwargs"].startswith('{"note": "yyy') and params[
        "traffic.chat_template_kwargs"].endswith("...")
    assert params["traffic.output_cap"].startswith("p50 ")
    assert params["traffic.temperature"].startswith("greedy_share ")


def test_mlflow_params_spell_absent_values_none() -> None:
    params = _fp(_prompts([3])).mlflow_params()
    assert params["traffic.path"] == params["traffic.chat_template_kwargs"] == params["traffic.top_p"] == "none"
    assert params["traffic.not_replayable"] == "none" and params["traffic.requests"] == "none"
    assert params["traffic.input_chars"] == "p10 3, p50 3, p90 3, max 3"
