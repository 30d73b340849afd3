"""Reading a recorded OpenAI-format request log: every accepted line shape, every reason a request is
not replayable, the errors, the seeded sample, and the log shipped in experiments/traffic/."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.bench.datasets import DatasetError, Prompt, select_prompts
from orchestrator.bench.request_log import NOT_REPLAYABLE_REASONS, RequestLog, load_request_log, sample_requests

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "experiments" / "traffic" / "chat-log.jsonl"


def _write(tmp_path: Path, lines: list[Any], name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n",
                    encoding="utf-8")
    return path


def _chat(text: str = "How do I undo a rebase?", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


GOOD = _chat("a good request")
"""A replayable line, so that a file of otherwise bad lines still loads."""


def _reason(tmp_path: Path, line: Any) -> dict[str, int]:
    return load_request_log(_write(tmp_path, [GOOD, line])).not_replayable


# --- accepted shapes --------------------------------------------------------------------------


def test_a_bare_chat_body_keeps_messages_cap_and_sampling(tmp_path: Path) -> None:
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 3?"},
    ], "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "stream": True, "user": "u-1"}
    log = load_request_log(_write(tmp_path, [body]))
    assert log.lines == 1 and log.kind == "chat" and log.not_replayable == {}
    assert log.prompts == [Prompt(
        id="log-1", text="And times 3?",
        messages=(("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "4"), ("user", "And times 3?")),
        max_tokens=64, temperature=0.7, top_p=0.9,
    )]


def test_a_completions_body_is_a_plain_prompt(tmp_path: Path) -> None:
    log = load_request_log(_write(tmp_path, [{"model": "m", "prompt": "def fib(n):", "max_tokens": 32},
                                             {"model": "m", "prompt": ["only one"]}]))
    assert log.kind == "completions"
    assert log.prompts == [Prompt(id="log-1", text="def fib(n):", max_tokens=32), Prompt(id="log-2", text="only one")]


@pytest.mark.parametrize("key", ["body", "request"])
def test_a_wrapped_body_is_unwrapped_and_named_by_its_custom_id(tmp_path: Path, key: str) -> None:
    line = {"custom_id": "req-7", "method": "POST", "url": "/v1/chat/completions", key: _chat("hi", temperature=0)}
    (prompt,) = load_request_log(_write(tmp_path, [line])).prompts
    assert prompt.id == "req-7" and prompt.text == "hi" and prompt.temperature == 0.0


def test_the_openai_batch_url_for_completions_is_accepted(tmp_path: Path) -> None:
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
    assert load_request_log(_write(tmp_path, [line])).prompts[0].id == "c1"


def test_max_completion_tokens_is_the_cap_and_wins_over_max_tokens(tmp_path: Path) -> None:
    log = load_request_log(_write(tmp_path, [_chat(max_completion_tokens=100),
                                             _chat(max_completion_tokens=100, max_tokens=50)]))
    assert [p.max_tokens for p in log.prompts] == [100, 100]


@pytest.mark.parametrize("cap", [0, -5, 1.5, "64", True, None])
def test_a_cap_that_is_not_a_positive_int_is_none(tmp_path: Path, cap: Any) -> None:
    assert load_request_log(_write(tmp_path, [_chat(max_tokens=cap)])).prompts[0].max_tokens is None


def test_text_parts_are_joined_and_roles_kept(tmp_path: Path) -> None:
    body = {"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}]},
        {"role": "user", "content": [{"type": "text", "text": "line a"}, {"type": "text", "text": "line b"}]},
    ]}
    (prompt,) = load_request_log(_write(tmp_path, [body])).prompts
    assert prompt.messages == (("developer", "Rule one.\nRule two."), ("user", "line a\nline b"))
    assert prompt.text == "line a\nline b"


def test_the_text_is_the_last_user_turn_even_after_an_assistant_turn(tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"},
                         {"role": "user", "content": "second"}, {"role": "assistant", "content": "Sure, "}]}
    (prompt,) = load_request_log(_write(tmp_path, [body])).prompts
    assert prompt.text == "second" and len(prompt.messages or ()) == 4


def test_chat_and_completions_together_are_mixed_and_in_file_order(tmp_path: Path) -> None:
    log = load_request_log(_write(tmp_path, [_chat("one"), "", {"prompt": "two"}, "   ", _chat("three")]))
    assert log.kind == "mixed" and log.lines == 3
    assert [(p.id, p.text) for p in log.prompts] == [("log-1", "one"), ("log-3", "two"), ("log-5", "three")]


def test_a_repeated_custom_id_is_made_unique(tmp_path: Path) -> None:
    line = {"custom_id": "same", "body": _chat()}
    assert [p.id for p in load_request_log(_write(tmp_path, [line, line])).prompts] == ["same", "same-log-2"]


def test_sampling_bounds_are_inclusive_where_the_api_allows(tmp_path: Path) -> None:
    log = load_request_log(_write(tmp_path, [_chat(temperature=2, top_p=1), _chat(temperature=0, top_p=0.01),
                                             _chat(temperature=None, top_p=None)]))
    assert [(p.temperature, p.top_p) for p in log.prompts] == [(2.0, 1.0), (0.0, 0.01), (None, None)]


# --- not replayable ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"messages": [{"role": "user", "content": "cut off', "not_json"),
        ("not json at all", "not_json"),
        ([1, 2], "not_a_request"),
        ({"model": "m", "input": "embed me"}, "not_a_request"),
        ({"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "x", "prompt": "x"}}, "other_endpoint"),
        (_chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (_chat(functions=[{"name": "f"}]), "tools"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "function", "name": "f", "content": "1"}]}, "tools"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
         "images"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
         "images"),
        (_chat(n=2), "n>1"),
        ({"prompt": "x", "best_of": 3}, "n>1"),
        (_chat(temperature=2.5), "bad_sampling"),
        (_chat(temperature=-0.1), "bad_sampling"),
        (_chat(temperature="0.7"), "bad_sampling"),
        (_chat(temperature=True), "bad_sampling"),
        (_chat(top_p=0), "bad_sampling"),
        (_chat(top_p=1.5), "bad_sampling"),
        ({"messages": "hello"}, "bad_message"),
        ({"messages": [{"content": "no role"}]}, "bad_message"),
        ({"messages": [{"role": "user", "content": 7}]}, "bad_message"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "bad_message"),
        ({"prompt": [1, 2, 3]}, "token_prompt"),
        ({"prompt": ["a", "b"]}, "token_prompt"),
        ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "no_user_turn"),
        ({"messages": []}, "no_user_turn"),
        (_chat("   "), "empty_prompt"),
        ({"prompt": ""}, "empty_prompt"),
    ],
)
def test_every_reason_is_counted_not_raised(tmp_path: Path, line: Any, reason: str) -> None:
    assert reason in NOT_REPLAYABLE_REASONS
    assert _reason(tmp_path, line) == {reason: 1}


def test_tools_are_counted_before_images_and_a_request_is_counted_once(tmp_path: Path) -> None:
    both = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
            "tools": [{"type": "function"}], "n": 3, "temperature": 9}
    assert _reason(tmp_path, both) == {"tools": 1}


def test_counts_add_up_and_are_ordered_by_count(tmp_path: Path) -> None:
    lines = [GOOD, "{", "{", _chat(n=4), _chat(tools=[{}]), _chat(tools=[{}]), _chat(tools=[{}]), GOOD]
    log = load_request_log(_write(tmp_path, lines))
    assert log.lines == 8 and len(log.prompts) == 2
    assert list(log.not_replayable.items()) == [("tools", 3), ("not_json", 2), ("n>1", 1)]


# --- errors -----------------------------------------------------------------------------------


def test_a_missing_file_is_a_dataset_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match="nope.jsonl.*does not exist"):
        load_request_log(path)


@pytest.mark.parametrize("text", ["", "\n\n   \n"])
def test_a_file_without_a_non_empty_line_is_a_dataset_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(DatasetError, match="empty.jsonl.*empty"):
        load_request_log(path)


def test_a_file_of_no_replayable_request_names_the_file_the_counts_and_the_first_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, ["", "garbage", _chat(tools=[{}]), "more garbage"], name="bad.jsonl")
    with pytest.raises(DatasetError) as info:
        load_request_log(path)
    message = str(info.value)
    assert "bad.jsonl" in message and "3 request(s)" in message
    assert "not_json 2 (first at line 2)" in message and "tools 1 (first at line 3)" in message
    assert '"messages"' in message  # what is expected


def test_a_file_that_is_not_utf8_is_a_dataset_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match="latin1.jsonl.*not UTF-8"):
        load_request_log(path)


# --- hash, sample -----------------------------------------------------------------------------


def test_the_hash_is_of_the_file_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, [GOOD])
    log = load_request_log(path)
    assert log.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert log.path == str(path)


def _log(n: int) -> RequestLog:
    return RequestLog(path="x", sha256="0" * 64, lines=n, prompts=[Prompt(id=f"p{i}", text=f"t{i}") for i in range(n)])


def test_a_sample_is_reproducible_for_a_seed_and_differs_for_another() -> None:
    log = _log(30)
    first = sample_requests(log, count=12, seed=7)
    assert first == sample_requests(log, count=12, seed=7)
    assert first != sample_requests(log, count=12, seed=8)
    assert first == select_prompts(log.prompts, count=12, seed=7)  # the same rule as the other datasets


def test_a_sample_larger_than_the_log_repeats_the_shuffle() -> None:
    log = _log(5)
    sample = sample_requests(log, count=12, seed=1)
    assert len(sample) == 12 and sample[:5] == sample[5:10] and sorted(p.id for p in sample[:5]) == [
        f"p{i}" for i in range(5)]


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="count"):
        sample_requests(_log(3), count=-1, seed=0)


# --- the shipped log --------------------------------------------------------------------------


def test_the_shipped_log_loads_with_its_documented_counts() -> None:
    log = load_request_log(SHIPPED)
    assert log.lines == 40 and len(log.prompts) == 35 and log.kind == "chat"
    assert log.not_replayable == {"tools": 2, "images": 2, "not_json": 1}
    assert len({p.id for p in log.prompts}) == 35
    greedy = sum(1 for p in log.prompts if p.temperature == 0)
    assert 0.4 <= greedy / 35 <= 0.6
    assert all(p.temperature is None or p.temperature == 0 or 0.3 <= p.temperature <= 1.0 for p in log.prompts)
    assert all(p.max_tokens is not None and 64 <= p.max_tokens <= 256 for p in log.prompts)
    assert {p.top_p for p in log.prompts} - {None} <= {0.9, 0.95} and any(p.top_p for p in log.prompts)
    assert any(len(p.messages or ()) > 2 and any(r == "assistant" for r, _ in p.messages or ()) for p in log.prompts)
    assert any(p.id.startswith("req-") for p in log.prompts) and any(p.id.startswith("log-") for p in log.prompts)


def test_the_shipped_log_differs_from_the_builtin_prompts() -> None:
    from orchestrator.bench.datasets import load_builtin

    builtin = {p.text for p in load_builtin()}
    assert not builtin & {p.text for p in load_request_log(SHIPPED).prompts}
