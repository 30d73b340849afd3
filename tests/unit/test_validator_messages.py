"""What ``spectune validate`` tells a new user (issue 44): the values shown are the spec's own, every
piece of advice for a flag spectune sets names a field that exists and, followed, validates, every
problem of a section comes at once, and a wrong type says what is allowed with an example."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.spec_summary import describe_spec
from orchestrator.validation import _target, validation_problems
from serving.engine.config import MANAGED_FLAGS, EngineConfig

from helpers.spec_cases import with_

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {p.name: yaml.safe_load(p.read_text()) for p in sorted((REPO / "experiments").glob("*.yaml"))}
KIMI = "kimi-k2.5-eagle3-8gpu.yaml"

def _problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_dict(data)
    return [str(p) for p in excinfo.value.problems]


def _speculative_row(data: dict) -> str:
    rows = {d["name"]: d["values"] for d in describe_spec(SweepSpec.from_dict(data))["dimensions"]}
    return rows["speculative (steps, topk, draft)"]


# --- 1. the values shown are the spec's own ----------------------------------------------------


def test_the_kimi_spec_shows_the_lists_it_wrote_not_the_derived_chain_drafts() -> None:
    """Before: ``steps 1-5; topk 1-2, 4; draft 2-6, 8, 12, 16 + auto`` (2, 3, 5 are top-k 1's derived
    drafts, not the spec's)."""
    assert _speculative_row(SHIPPED[KIMI]) == (
        "steps [1, 2, 3, 4, 5]; topk [1, 2, 4]; draft [4, 6, 8, 12, 16] (top-k 1: steps + 1) + auto")


@pytest.mark.parametrize(("speculative", "shown"), [
    ({"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": {"low": 2, "high": 8}},
     "steps [1, 3]; topk [1, 2]; draft 2-8 (top-k 1: steps + 1)"),
    ({"num_steps": {"low": 1, "high": 9, "step": 2}, "eagle_topk": 4, "num_draft_tokens": [16, 8]},
     "steps 1-9 step 2; topk 4; draft [16, 8]"),  # a list in its own order
    ({"num_steps": [5, 1, 3]}, "steps [5, 1, 3]; topk 1; draft steps + 1"),  # top-k 1 alone: the chain's rule
    ({"num_steps": list(range(1, 11)), "eagle_topk": 2, "num_draft_tokens": 4},
     "steps [1, 2, 3, 4, 5, 6, 7, 8, ... (+2 more)]; topk 2; draft 4"),
])
def test_a_list_is_shown_as_written_and_a_range_as_a_range(speculative: dict, shown: str) -> None:
    assert _speculative_row(with_("search.speculative", speculative)) == shown


def test_values_sglang_refuses_are_shown_as_written_and_still_warned() -> None:
    data = with_("search.speculative", {"num_steps": [1, 2], "eagle_topk": [2], "num_draft_tokens": [3, 4, 16]})
    assert _speculative_row(data) == "steps [1, 2]; topk [2]; draft [3, 4, 16]"
    warnings = SweepSpec.from_dict(data).warnings()
    assert any(w.startswith("search.speculative.num_draft_tokens: 16 is in no combination SGLang accepts")
               for w in warnings), warnings


def test_listed_triples_are_still_listed() -> None:
    data = with_("search.speculative", {"triples": [[3, 1, 4], [2, 2, 4]], "include_auto": True})
    assert _speculative_row(data) == "(3,1,4), (2,2,4) + auto"


# --- 2. advice for a flag spectune sets: followed, the spec loads --------------------------------

VALUES: dict[str, Any] = {
    "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "org/another-draft",
    "speculative_draft_model": "org/another-draft", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
    "speculative_num_draft_tokens": 4, "disable_custom_all_reduce": True,
    "enforce_disable_flashinfer_allreduce_fusion": True, "host": "0.0.0.0", "port": 30000, "node_rank": 0,
    "dist_init_addr": "10.0.0.1:5000", "nccl_init_addr": "10.0.0.1:5001", "reference_mscclpp_installed": True,
}
"""The value a user puts in ``extra_args`` for each flag; flags missing here take the spec's own
setting (a model, a TP size, a node count, a node kind: another value would break other rules)."""

OWN: dict[str, str] = {"model_path": "model_path", "model": "model_path", "tp_size": "tp_size",
                       "tensor_parallel_size": "tp_size", "nnodes": "nnodes", "reference_gpu_kind": "gpu_kind"}
ENGINE_DEFAULTS = {"nnodes": 1, "gpu_kind": "auto"}

_PATH = re.compile(r"^(?:engine|search)(?:\.[a-z_]+)+")


def _advice(message: str) -> list[str]:
    """The alternatives of ``... use A, B or C instead`` (commas inside parentheses kept)."""
    match = re.search(r"; use (.*) instead$", message)
    assert match, message
    parts, depth, current = [], 0, ""
    text = match.group(1)
    i = 0
    while i < len(text):
        if depth == 0 and text.startswith(", ", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        if depth == 0 and text.startswith(" or ", i):
            parts.append(current)
            current, i = "", i + 4
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        current += text[i]
        i += 1
    return [*parts, current]


def _field_exists(path: str) -> bool:
    return _target(SweepSpec, path.split(".")) is not None


def _followed(data: dict, flag: str, value: Any, alternative: str) -> dict:
    """``data`` with ``engine.extra_args.<flag>`` removed and ``alternative`` done with ``value``."""
    out = copy.deepcopy(data)
    out["engine"]["extra_args"].pop(flag)
    if alternative.startswith("nothing"):
        return out
    match = _PATH.match(alternative)
    assert match, f"{flag}: the advice {alternative!r} names no field"
    path = match.group(0)
    *parents, leaf = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    arm = re.search(r"its '(\w+)' arm", alternative)
    if arm:  # an all-reduce arm: added to the arms searched
        node[leaf] = [*node.get(leaf, ["default"]), *([arm.group(1)] if arm.group(1) not in node.get(leaf, []) else [])]
    else:
        node[leaf] = value
    return out


def _advice_cases() -> list[Any]:
    cases = []
    for name, spec in SHIPPED.items():
        engine = spec["engine"]
        for flag, owner in MANAGED_FLAGS.items():
            if owner in ("disable_custom_all_reduce", "enforce_disable_flashinfer_allreduce_fusion") \
                    and engine.get("tp_size", 1) == 1:
                continue  # one rank has no all-reduce: the arms are refused there for that reason
            if flag in ("reference_gpu_kind", "reference_mscclpp_installed") and engine["kind"] != "reference":
                continue  # the reference engine's own flag
            cases.append(pytest.param(name, flag, id=f"{name}-{flag}"))
    return cases


@pytest.mark.parametrize(("spec", "flag"), _advice_cases())
def test_following_the_advice_for_a_flag_spectune_sets_gives_a_valid_spec(spec: str, flag: str) -> None:
    data = copy.deepcopy(SHIPPED[spec])
    own = OWN.get(flag)
    value = VALUES[flag] if own is None else data["engine"].get(own, ENGINE_DEFAULTS.get(own))
    data["engine"].setdefault("extra_args", {})[flag] = value
    (message,) = [p.removeprefix(f"engine.extra_args.{flag}: ") for p in _problems(data)
                  if p.startswith(f"engine.extra_args.{flag}: ")]
    for alternative in _advice(message):
        if not alternative.startswith("nothing"):
            assert _field_exists(_PATH.match(alternative).group(0)), f"{alternative!r} is no field of a spec"
        followed = _followed(data, flag, value, alternative)
        try:
            SweepSpec.from_dict(followed)
        except SpecError as exc:
            pytest.fail(f"{flag}: followed {alternative!r}, the spec still fails: {exc}")


def test_the_misspelled_flag_of_the_issue_points_at_the_search() -> None:
    (problem,) = _problems(with_("engine.extra_args", {"speculative_num_step": 3}))
    assert problem == ("engine.extra_args.speculative_num_step: set by spectune: SGLang reads it as "
                       "--speculative-num-steps; use search.speculative.num_steps instead")


def test_an_ambiguous_prefix_names_every_field_it_could_mean_and_each_exists() -> None:
    (problem,) = _problems(with_("engine.extra_args", {"speculative": 3}))
    message = problem.removeprefix("engine.extra_args.speculative: ")
    assert message.startswith("set by spectune: a prefix of --speculative-algorithm, ")
    alternatives = _advice(message)
    assert len(alternatives) == 5, alternatives
    assert all(_field_exists(_PATH.match(a).group(0)) for a in alternatives), alternatives


def test_every_flag_spectune_sets_is_refused_at_once_each_under_its_own_name() -> None:
    problems = _problems(with_("engine.extra_args", {"--tp": 2, "speculative-num-steps": 3, "host": "x"}))
    assert [p.split(":")[0] for p in problems] == [
        "engine.extra_args.tp", "engine.extra_args.speculative_num_steps", "engine.extra_args.host"]
    assert problems[0].startswith("engine.extra_args.tp: set by spectune: SGLang reads it as --tp-size; "
                                  "use engine.tp_size")


@pytest.mark.parametrize("flag", sorted(MANAGED_FLAGS))
def test_engine_config_advice_names_its_own_field(flag: str) -> None:
    """EngineConfig (``spectune engine-cmd``) refuses the same flags and names its typed field."""
    with pytest.raises(ValidationError) as excinfo:
        EngineConfig(kind="sglang", model_path="m", extra_args={flag: 1})
    (problem,) = [str(p) for p in validation_problems(excinfo.value, model=EngineConfig)]
    owner = MANAGED_FLAGS[flag]
    if owner == "(chosen at launch)":
        assert problem.endswith("use nothing: it is (chosen at launch) instead"), problem
    else:
        assert problem.endswith(f"use the field {owner!r} instead") and owner in EngineConfig.model_fields, problem


# --- 3. every problem of a section at once -------------------------------------------------------


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("search.speculative", {"eagle_topk": [1, 2]}, [
        "search.speculative: num_steps is required (or list the exact points in triples)",
        "search.speculative: num_draft_tokens is required when eagle_topk has values above 1"]),
    ("search.speculative", {"triples": [[1, 1, 2], [1, 1, 2], [1, 2, 8], "x"]}, [
        "search.speculative.triples: [1] = [1, 1, 2] is listed twice",
        "search.speculative.triples: [2] = [1, 2, 8]: ",
        "search.speculative.triples: [3] = 'x': a triple is [num_steps, eagle_topk, num_draft_tokens], three "
        "integers"]),
    ("search.speculative.num_steps", [1, 20, 3, 40], ["search.speculative.num_steps: 20, 40 are outside [1, 16]"]),
    ("search.nccl_env", {"NCCL_ALGO": ["Ring"], "NCCL_PROTO": [None, "LL", "ll"], "NCCL_BUFFSIZE": []}, [
        "search.nccl_env.NCCL_ALGO: the choices ['Ring'] leave out NCCL's default",
        "search.nccl_env.NCCL_PROTO: repeated values in [None, 'LL', 'll']",
        "search.nccl_env.NCCL_BUFFSIZE: give at least one value"]),
    ("search.nccl_presets", [{"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Ring"}], [
        "search.nccl_presets: preset 1 ({'NCCL_ALGO': 'Ring'}) repeats preset 0",
        "search.nccl_presets: the presets leave out NCCL's defaults; add {}"]),
    ("search.allow_dangerous", ["NCCL_DEBUG", "OMP_NUM_THREADS=4"], [
        "search.allow_dangerous: 'NCCL_DEBUG': only ", "search.allow_dangerous: 'OMP_NUM_THREADS=4': only "]),
])
def test_every_problem_of_a_search_rule_is_reported_at_once(path: str, value: Any, expected: list[str]) -> None:
    data = with_(path, value)
    if path == "search.nccl_presets":
        data["search"].pop("nccl_env")
    problems = _problems(data)
    for start in expected:
        assert any(p.startswith(start) for p in problems), (start, problems)
    assert len(problems) == len(expected), problems


def test_both_engine_rules_are_reported_at_once() -> None:
    data = with_("engine.gpu_kind", "cpu")
    data["engine"].pop("draft_model_path")
    problems = _problems(data)
    assert any(p.startswith("engine.gpu_kind: cpu is only for the reference engine") for p in problems), problems
    assert any(p.startswith("engine: speculative_algorithm=EAGLE3 needs draft_model_path") for p in problems), problems


def test_every_dataset_rule_of_the_benchmark_is_reported_at_once() -> None:
    problems = _problems(with_("benchmark", {"dataset": "random", "dataset_path": "x.json", "api": "generate",
                                             "chat_template_kwargs": {}, "repetitions": 3, "min_repetitions": 4}))
    assert problems == [
        "benchmark: min_repetitions (4) is above repetitions (3), the most repetitions per level; lower "
        "min_repetitions or raise repetitions",
        "benchmark: dataset_path is only used with dataset: sharegpt or request_log (dataset is random)",
        "benchmark: chat_template_kwargs is only sent with api: chat (api is generate)",
        "benchmark.dataset: random is refused for tuning (speculation looks better on random prompts than on real "
        "text); use builtin or sharegpt, or set allow_random_prompts: true",
    ], problems


# --- 4. a wrong type says what is allowed ----------------------------------------------------------


@pytest.mark.parametrize(("path", "value", "problem"), [
    ("benchmark", {"num_prompts": "eight"},
     "benchmark.num_prompts: got 'eight' (a string); expected an integer in [1, 100000], e.g. 32"),
    ("engine.tp_size", "8", "engine.tp_size: got '8' (a string); expected an integer in [1, 64], e.g. 8"),
    ("engine.tp_size", 8.0, "engine.tp_size: got 8.0 (a number); expected an integer in [1, 64], e.g. 8"),
    ("engine.tp_size", True, "engine.tp_size: got true (a boolean); expected an integer in [1, 64], e.g. 1"),
    ("budget", {"trial_timeout_s": "60"},
     "budget.trial_timeout_s: got '60' (a string); expected a number in (0, 2592000], e.g. 60"),
    ("objective", {"concurrency": "8"},
     "objective.concurrency: got '8' (a string); expected an integer in [1, 10000] or null, e.g. 8"),
    ("search.speculative.include_auto", "yes",
     "search.speculative.include_auto: got 'yes' (a string); expected true or false, e.g. true"),
    ("benchmark", {"api": "openai"},
     "benchmark.api: got 'openai' (a string); expected one of 'auto', 'generate', 'completions', 'chat'"),
    ("engine.speculative_algorithm", "eagle3", "engine.speculative_algorithm: got 'eagle3' (a string); expected "
     "'EAGLE', 'EAGLE3' or null; did you mean 'EAGLE3'?"),
    ("search.all_reduce", ["nccl", "fused"],
     "search.all_reduce.1: got 'fused' (a string); expected one of 'default', 'no_fusion', 'nccl', 'fusion_trtllm', "
     "'fusion_mnnvl', 'fusion_cutedsl', 'mscclpp', 'torch_symm_mem', 'nccl_symm_mem', 'pcie_ipc'"),
    ("engine.model_path", 7, "engine.model_path: got 7 (an integer); expected a string, e.g. '7'"),
    ("engine.draft_model_path", 5,
     "engine.draft_model_path: got 5 (an integer); expected a string or null, e.g. '5'"),
    ("benchmark", {"concurrency": 8},
     "benchmark.concurrency: got 8 (an integer); expected a list of integers, e.g. [8]"),
    ("engine.extra_args", ["trust_remote_code"],
     "engine.extra_args: got ['trust_remote_code'] (a list); expected a mapping"),
    ("budget", 5, "budget: got 5 (an integer); expected a mapping (keys: num_trials, max_concurrent_trials, "
     "time_limit_s, trial_timeout_s, engine_start_timeout_s, engine_start_estimate_s, tpot_estimate_ms, "
     "derive_time_limits, ...)"),
    ("engine.kind", ..., "engine.kind: missing (required): 'sglang' (GPUs) or 'reference' (the CPU/GPU reference "
     "engine); expected 'sglang' or 'reference'"),
    ("budget", {"num_trial": 5}, "budget.num_trial: unknown key (did you mean 'num_trials'?); allowed here: "
     "num_trials, max_concurrent_trials, time_limit_s, trial_timeout_s, engine_start_timeout_s, "
     "engine_start_estimate_s, tpot_estimate_ms, derive_time_limits, sweep_only_start_flags, max_same_failures"),
    ("budget", {"num_trials": 0}, "budget.num_trials: got 0; expected an integer in [1, 10000], e.g. 20"),
    ("budget", {"time_limit_s": 0}, "budget.time_limit_s: got 0; expected a number in (0, 2592000] or null"),
    ("engine.tp_size", 128, "engine.tp_size: got 128; expected an integer in [1, 64], e.g. 1"),
    ("benchmark", {"warmup": {"tolerance": 1}},
     "benchmark.warmup.tolerance: got 1; expected a number in (0, 1) or null, e.g. 0.05"),
    ("confirmation", {"margin": 0.7},
     "confirmation.margin: got 0.7 (a number); expected a number in (0, 0.5) or 'auto'"),
    ("confirmation", {"repetitions_per_visit": "two"},
     "confirmation.repetitions_per_visit: got 'two' (a string); expected an integer in [1, 20] or 'auto'"),
    ("engine.extra_args", {"mem_fraction_static": {"a": 1}}, "engine.extra_args.mem_fraction_static: got {'a': 1} "
     "(a mapping); expected true or false, an integer, a number, a string or a list"),
])
def test_a_wrong_value_says_what_is_allowed_with_an_example(path: str, value: Any, problem: str) -> None:
    assert _problems(with_(path, value)) == [problem]


def test_the_allowed_values_come_from_pydantic_when_the_model_is_not_known() -> None:
    with pytest.raises(ValidationError) as excinfo:
        SweepSpec.model_validate(with_("benchmark", {"num_prompts": 0, "api": "x"}))
    shown = [str(p) for p in validation_problems(excinfo.value)]  # no model: pydantic's context alone
    assert shown == ["benchmark.api: got 'x' (a string); expected one of 'auto', 'generate', 'completions', 'chat'",
                     "benchmark.num_prompts: got 0; expected an integer >= 1, e.g. 1"], shown
    assert _target(SweepSpec, ["engine", "nope"]) is None  # a field it cannot find: no guess


def test_a_preset_whose_channel_minimum_is_above_its_maximum_is_refused() -> None:
    """NCCL keeps NCCL_MAX_NCHANNELS, so a preset forcing a larger minimum would silently not hold."""
    from orchestrator.spec import SweepSpec
    from orchestrator.errors import SpecError

    data = copy.deepcopy(SHIPPED["kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml"])
    data["search"]["nccl_presets"].append({"NCCL_MIN_NCHANNELS": "32", "NCCL_MAX_NCHANNELS": "16"})
    with pytest.raises(SpecError) as info:
        SweepSpec.from_dict(data)
    assert "NCCL_MIN_NCHANNELS=32 is above NCCL_MAX_NCHANNELS=16" in str(info.value), str(info.value)
    data["search"]["nccl_presets"][-1] = {"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "8"}  # the CTA pair alike
    with pytest.raises(SpecError, match="NCCL_MIN_CTAS=16 is above NCCL_MAX_CTAS=8"):
        SweepSpec.from_dict(data)
    shipped = SweepSpec.from_dict(copy.deepcopy(SHIPPED["kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml"]))
    assert {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "8"} in shipped.search.nccl_presets
