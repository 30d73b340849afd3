"""Prompt sources: the built-in set shipped with spectune, ShareGPT-format files, random text.

``random`` is refused for tuning unless asked for (``BenchmarkSpec.allow_random_prompts``); see
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import BenchmarkError

__all__ = [
    "DatasetError",
    "Prompt",
    "load_builtin",
    "load_prompts",
    "load_sharegpt",
    "random_prompts",
    "select_prompts",
]

# Common short English words: nearly all are one token in BPE vocabularies, so a random prompt
# of N words is about N tokens there (a byte-level tokenizer sees ~5 tokens per word).
_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name team minute idea kid body information back parent face "
    "others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education open red blue green small large old new "
    "good high long great little own other right big different early young important few public "
    "bad same able run walk talk make go see know take get give find think tell become leave feel"
).split()


class DatasetError(BenchmarkError, ValueError):
    """A dataset cannot be read (missing file, wrong format). A bad-input error: fix the file."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (reports and the probe name prompts by it) and its text; a request
    replayed from a log also carries what that request sent.

    Attributes:
        id: Stable id.
        text: The prompt text (a chat request: its last user turn, for display and the probe).
        messages: A chat request's messages as sent, ``(role, content)`` in order (None: a plain prompt,
            sent as one user turn to a chat API).
        max_tokens: The request's own output cap (None: the spec's ``output_len``; a set one is capped by it).
        temperature, top_p: The request's own sampling (None: the spec's).
    """

    id: str
    text: str
    messages: tuple[tuple[str, str], ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


def load_builtin() -> list[Prompt]:
    """The prompt set shipped in ``orchestrator/bench/data/prompts.jsonl`` (one JSON object a line)."""
    path = resources.files("orchestrator.bench").joinpath("data", "prompts.jsonl")
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            prompts.append(Prompt(id=str(item["id"]), text=str(item["text"])))
    return prompts


def _first_human_turn(entry: Any) -> str | None:
    turns = entry.get("conversations") or entry.get("conversation") or entry.get("messages")
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = turn.get("from", turn.get("role"))
        value = turn.get("value", turn.get("content"))
        if role in ("human", "user") and isinstance(value, str) and value.strip():
            return value
    return None


def load_sharegpt(path: str | Path) -> list[Prompt]:
    """The first human turn of every conversation of a ShareGPT-format JSON file.

    The format is a list of ``{"id": ..., "conversations": [{"from": "human", "value": ...},
    {"from": "gpt", "value": ...}, ...]}`` (``role``/``content`` spellings are accepted too).
    Conversations without a human turn are skipped.

    Raises:
        DatasetError: the file is missing, is not JSON, or holds no usable conversation.
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"dataset_path {str(file)!r} does not exist; give a ShareGPT-format JSON file") from None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"dataset_path {str(file)!r} is not a readable JSON file: {exc}") from None
    if not isinstance(data, list):
        raise DatasetError(f"dataset_path {str(file)!r}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts = []
    for index, entry in enumerate(data):
        if isinstance(entry, dict):
            text = _first_human_turn(entry)
            if text is not None:
                prompts.append(Prompt(id=str(entry.get("id", f"sharegpt-{index}")), text=text))
    if not prompts:
        raise DatasetError(
            f"dataset_path {str(file)!r}: no conversation has a human turn "
            '(expected [{"conversations": [{"from": "human", "value": "..."}]}])'
        )
    return prompts


def random_prompts(*, count: int, input_len: int, seed: int) -> list[Prompt]:
    """``count`` prompts of ``input_len`` random common English words each, from ``Random(seed)``
    (words, not token ids: no tokenizer needed; the server's ``prompt_tokens`` gives the tokens)."""
    rng = random.Random(seed)
    return [
        Prompt(id=f"random-{i}", text=" ".join(rng.choice(_WORDS) for _ in range(input_len)))
        for i in range(count)
    ]


def select_prompts(prompts: list[Prompt], *, count: int, seed: int) -> list[Prompt]:
    """``count`` prompts in a seeded order: a shuffle of the whole set, repeated as needed.

    Every repetition and concurrency level uses the same list, so they differ only in load.
    """
    if not prompts:
        raise DatasetError("the dataset has no prompts")
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(count)]


def load_prompts(
    *,
    dataset: Literal["builtin", "sharegpt", "random"],
    count: int,
    seed: int,
    dataset_path: str | None = None,
    random_input_len: int = 128,
) -> list[Prompt]:
    """``count`` prompts from the named source, in the seeded order of :func:`select_prompts`
    (``random_input_len`` is a number of words, see :func:`random_prompts`). Every source, a request
    log included: ``orchestrator.bench.request_log.load_dataset``."""
    if dataset == "builtin":
        return select_prompts(load_builtin(), count=count, seed=seed)
    if dataset == "sharegpt":
        if not dataset_path:
            raise DatasetError("dataset sharegpt needs dataset_path (a ShareGPT-format JSON file)")
        return select_prompts(load_sharegpt(dataset_path), count=count, seed=seed)
    if dataset == "random":
        return random_prompts(count=count, input_len=random_input_len, seed=seed)
    raise DatasetError(f"unknown dataset {dataset!r}; use builtin, sharegpt or random (a request log: "
                       "orchestrator.bench.request_log.load_dataset)")
