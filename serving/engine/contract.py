"""The engine contract: what the harness reads from a running engine, checked on its first answers.

Each trial checks, after its engine is healthy (started with ``--skip-server-warmup``), one short
greedy ``/generate`` (8 tokens) and then ``/server_info`` and the log
(``orchestrator.sweep.execution.trial``). It asks only what SGLang 0.5.23 guarantees at that moment
(paths under ``sglang/srt/``), and sorts what is missing in two:

* **needed to measure** (``ContractCheck.problems``; the sweep stops, exit 2, with a diagnostic
  bundle): ``output_ids`` (``managers/tokenizer_manager.py`` l.2665-2670, set for every finished
  request), ``meta_info.completion_tokens`` (l.2552-2558), and under speculation
  ``meta_info.spec_verify_ct`` (l.2755-2756, l.3148-3172: once a request had a verify cycle, which an
  8-token request has).
* **read by a blind reader** (``ContractCheck.blind``; the trial goes on, the night is flagged):
  ``/server_info``'s resolved ``speculative_*`` numbers (``entrypoints/http_server.py`` l.863-891,
  ``arg_groups/speculative_hook.py`` l.1159-1174: an auto choice's label) and with TP > 1
  ``disable_custom_all_reduce`` (``arg_groups/fields/exec_.py`` l.725: the all-reduce observation);
  ``meta_info.prompt_tokens`` (l.2507-2513) and ``spec_correct_drafts_histogram`` (l.3193-3201:
  chain prediction); on the no-speculation engine, asked with ``return_logprob``,
  ``top_logprobs_num`` and ``logprob_start_len: 0``, ``input_token_logprobs`` and
  ``output_top_logprobs`` as ``(logprob, token_id, text)`` triples (l.2849-2873: the probe's near-tie
  rule; without them it compares token for token); the log's ``[... TPn]`` line from every rank
  (``managers/scheduler.py`` l.6279-6298, ``model_executor/model_runner.py`` l.1371-1379) and with
  ``NCCL_DEBUG=INFO`` NCCL's own ``host:pid:tid [dev] NCCL INFO`` lines (NCCL's, TP > 1: the per-rank
  NCCL proof, ``serving.engine.nccl_log``).

Not asked: ``internal_states[0].avg_spec_accept_length``. SGLang adds it only once
``spec_total_num_forward_ct > 0`` (``managers/scheduler_components/internal_state.py`` l.243-253),
which grows every ``--decode-log-interval`` (40) decode batches (``metrics_reporter.py`` l.934,
l.999-1000), never on idle: after one short request it is absent. The benchmark reads it as a
cross-check only.

Pure functions on what was read; standard library only.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from serving.engine.log_lines import rank_lines

__all__ = ["TOP_LOGPROBS", "ContractCheck", "check_engine_contract", "contract_request", "greedy_request"]

_NCCL_LINE = re.compile(r"^[^\s:]+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN) ", re.MULTILINE)
_SHOWN = 400  # characters of what the engine sent, quoted in a problem


TOP_LOGPROBS = 5
"""Alternatives the probe's baseline asks for per output token (the rule reads the baseline's own
token and the best others; the rest name a mismatching token's rank in the report)."""


def greedy_request(prompt: str | list[int], *, max_new_tokens: int, logprobs: bool) -> dict[str, Any]:
    """A greedy, non-streamed native ``/generate`` body (``text`` or ``input_ids``); with ``logprobs``
    (the no-speculation engine only) SGLang's ``return_logprob``, ``top_logprobs_num`` and
    ``logprob_start_len: 0``, so ``input_token_logprobs`` carries the prompt's token ids."""
    body: dict[str, Any] = {
        "text" if isinstance(prompt, str) else "input_ids": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "stream": False,
    }
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=TOP_LOGPROBS, logprob_start_len=0)
    return body


def contract_request(*, speculative: bool, max_new_tokens: int = 8) -> dict[str, Any]:
    """The ``/generate`` body whose answer the contract is checked on: a short greedy request;
    on the no-speculation engine with the logprobs the probe's baseline asks for."""
    return greedy_request("The capital city of France is", max_new_tokens=max_new_tokens, logprobs=not speculative)


@dataclass(frozen=True)
class ContractCheck:
    """What the check found.

    Attributes:
        problems: Items without which nothing can be measured (``MEASURED_BY``), missing or
            mistyped: where it is read, what was expected, what the engine sent instead. Any one
            stops the sweep.
        blind: Items a blind reader uses (an accept-length cross-check, the all-reduce observation,
            the probe's near-tie rule, chain prediction, NCCL's proof), missing or mistyped: the
            trial goes on without that reader, and the night is flagged.
        checked: Every item checked, in words (for the trial's artifact).
    """

    problems: list[str] = field(default_factory=list)
    blind: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the engine can be measured (blind readers may still be missing)."""
        return not self.problems

    def summary(self) -> str:
        if self.ok:
            blind = f"; blind: {'; '.join(self.blind)}" if self.blind else ""
            return f"the engine answers what a measurement needs ({len(self.checked)} items checked){blind}"
        return (f"the engine does not answer what a measurement needs (SGLang 0.5.23's fields): "
                f"{'; '.join(self.problems)}")

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": list(self.problems), "blind": list(self.blind),
                "checked": list(self.checked)}


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _triple(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 3 and _is_int(value[1]) and (
        value[0] is None or _is_number(value[0]))


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.blind: list[str] = []
        self.checked: list[str] = []

    def need(self, where: str, ok: bool, expected: str, got: Any, *, keys_of: Any = None,
             measured: bool = False) -> None:
        """Record ``where`` as checked, and unless ``ok`` a problem (``measured``: nothing can be
        measured without it) or a blind reader; an absent key is shown with the keys of the object it
        was looked up in that resemble it (a rename shows as itself)."""
        self.checked.append(where)
        if ok:
            return
        sent = "absent" if got is _ABSENT else _shown(got)
        if isinstance(keys_of, dict) and got is _ABSENT:
            name = where.split(" (")[0].rsplit(" ", 1)[-1].rsplit(".", 1)[-1]
            near = difflib.get_close_matches(name, [str(k) for k in keys_of], n=3, cutoff=0.6)
            sent += f" (the object has {len(keys_of)} keys" + (f"; nearest: {', '.join(near)})" if near else ")")
        (self.problems if measured else self.blind).append(f"{where}: expected {expected}, got {sent}")


_ABSENT: Any = object()


def check_engine_contract(
    *,
    server_info: Any,
    generate_reply: Any,
    log_text: str,
    speculative: bool,
    tp_size: int,
    nccl_info: bool,
) -> ContractCheck:
    """Check what one engine answered against what the harness reads (module docstring).

    Args:
        server_info: The ``/server_info`` body (None: it did not answer JSON).
        generate_reply: The answer to :func:`contract_request` (a dict; SGLang may wrap it in a
            one-item list).
        log_text: The engine's log so far (every node's).
        speculative: The engine runs a speculative algorithm.
        tp_size: Its tensor-parallel size.
        nccl_info: ``NCCL_DEBUG=INFO`` is set for its ranks.
    """
    c = _Checker()
    info = server_info if isinstance(server_info, dict) else None
    c.need("GET /server_info", info is not None, "a JSON object", server_info if server_info is not None else _ABSENT)
    info = info or {}
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else None
    args = {**(first or {}), **info}
    device = args.get("device")
    if speculative:
        for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            value = args.get(name, _ABSENT)
            c.need(f"/server_info {name}", _is_int(value), "an integer (the resolved server arg)", value, keys_of=info)
    if tp_size > 1:
        value = args.get("disable_custom_all_reduce", _ABSENT)
        c.need("/server_info disable_custom_all_reduce", isinstance(value, bool), "true or false", value, keys_of=info)

    reply = generate_reply[0] if isinstance(generate_reply, list) and generate_reply else generate_reply
    c.need("POST /generate", isinstance(reply, dict), "a JSON object", reply if reply is not None else _ABSENT,
           measured=True)
    reply = reply if isinstance(reply, dict) else {}
    ids = reply.get("output_ids", _ABSENT)
    c.need("/generate output_ids", isinstance(ids, list) and all(_is_int(t) for t in ids), "a list of token ids", ids,
           keys_of=reply, measured=True)
    meta = reply.get("meta_info", _ABSENT)
    c.need("/generate meta_info", isinstance(meta, dict), "a JSON object", meta, keys_of=reply, measured=True)
    meta = meta if isinstance(meta, dict) else {}
    for name in ("prompt_tokens", "completion_tokens"):
        value = meta.get(name, _ABSENT)
        c.need(f"/generate meta_info.{name}", _is_int(value), "an integer", value, keys_of=meta,
               measured=name == "completion_tokens")
    if speculative:
        value = meta.get("spec_verify_ct", _ABSENT)
        c.need("/generate meta_info.spec_verify_ct", _is_int(value) and value > 0, "a positive integer (verify cycles)",
               value, keys_of=meta, measured=True)
        value = meta.get("spec_correct_drafts_histogram", _ABSENT)
        c.need("/generate meta_info.spec_correct_drafts_histogram",
               isinstance(value, list) and bool(value) and all(_is_int(v) for v in value),
               "a list of counts (verify cycles by drafts accepted)", value, keys_of=meta)
    else:
        value = meta.get("input_token_logprobs", _ABSENT)
        c.need("/generate meta_info.input_token_logprobs (return_logprob, logprob_start_len 0)",
               isinstance(value, list) and bool(value) and all(_triple(v) for v in value),
               "a list of (logprob, token_id, text) triples, one per prompt token", value, keys_of=meta)
        value = meta.get("output_top_logprobs", _ABSENT)
        c.need(f"/generate meta_info.output_top_logprobs (top_logprobs_num {TOP_LOGPROBS})",
               isinstance(value, list) and bool(value) and all(
                   isinstance(row, list) and row and all(_triple(v) for v in row) for row in value),
               "a list per output token of (logprob, token_id, text) triples", value, keys_of=meta)

    if tp_size > 1:
        ranks = {rank for rank, _ in rank_lines(log_text) if rank is not None}
        missing = sorted(set(range(tp_size)) - ranks)
        c.need("engine log: a '[... TPn]' line from every rank", not missing,
               f"lines from ranks 0-{tp_size - 1}", f"none from rank{'s' if len(missing) > 1 else ''} "
               f"{', '.join(map(str, missing))} (ranks seen: {sorted(ranks) or 'none'})")
        if nccl_info and device != "cpu":
            c.need("engine log: NCCL's 'host:pid:tid [dev] NCCL INFO' lines (NCCL_DEBUG=INFO)",
                   bool(_NCCL_LINE.search(log_text or "")), "at least one line", "none")
    return ContractCheck(problems=c.problems, blind=c.blind, checked=c.checked)
