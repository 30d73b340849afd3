"""SweepSpec validation: the shipped specs load, broken ones name the field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec
from orchestrator.spec_file import MAX_SPEC_BYTES, yaml_data

from helpers.spec_cases import BASE, BROKEN, with_

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_specs_are_valid(path: Path) -> None:
    spec = SweepSpec.from_yaml(path)
    assert spec.name == path.stem


def test_base_is_valid_and_defaults_resolve(tmp_path: Path) -> None:
    spec = SweepSpec.from_dict(BASE)
    assert spec.objective.direction == "max"
    assert spec.objective_concurrency == 8  # the highest default level
    assert spec.gpus_per_trial == 2  # sglang: tp_size
    assert spec.mlflow_uri(base=tmp_path) == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    assert spec.experiment_name == "t"


def test_nccl_values_are_normalised_and_default_kept() -> None:
    spec = SweepSpec.from_dict(with_("search.nccl_env", {"NCCL_ALGO": ["default", "ring,tree"]}))
    assert spec.search.nccl_env["NCCL_ALGO"] == [None, "Ring,Tree"]


def test_engine_config_of_a_candidate_merges_env() -> None:
    spec = SweepSpec.from_dict(with_("engine.env", {"NCCL_DEBUG": "info"}))
    config = spec.engine_config(num_steps=3, eagle_topk=1, num_draft_tokens=4, all_reduce="nccl", nccl_env={"NCCL_ALGO": "Ring"})
    assert config.env == {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"}
    assert config.disable_custom_all_reduce is True
    assert config.speculative_draft_model_path == "org/draft"


@pytest.mark.parametrize(("case", "data", "field", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_names_the_field(case: str, data: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_dict(data)
    problems = excinfo.value.problems
    named = [p for p in problems if p.field == field]
    assert named, f"{case}: no problem names {field!r}; got {[str(p) for p in problems]}"
    assert any(words in p.message for p in named), f"{case}: {words!r} not in {[p.message for p in named]}"


def test_every_problem_is_reported_not_just_the_first() -> None:
    data = with_("engine.tp_size", "x")
    data["objective"] = {"metric": "nope"}
    data["budget"] = {"num_trials": 0}
    fields = {p.field for p in pytest.raises(SpecError, SweepSpec.from_dict, data).value.problems}
    assert {"engine.tp_size", "objective.metric", "budget.num_trials"} <= fields


def test_allow_dangerous_admits_exactly_the_named_value() -> None:
    data = with_("search.nccl_env", {"NCCL_PROTO": [None, "LL128", "LL"]})
    data["search"]["allow_dangerous"] = ["NCCL_PROTO=ll128"]
    spec = SweepSpec.from_dict(data)
    assert spec.search.nccl_env["NCCL_PROTO"] == [None, "LL128", "LL"]
    data["search"]["allow_dangerous"] = ["NCCL_ALGO=NVLS"]
    with pytest.raises(SpecError, match="LL128"):
        SweepSpec.from_dict(data)


def test_dangerous_engine_flags_pass_when_named() -> None:
    data = with_("engine.extra_args", {"enable_symm_mem": True})
    data["search"]["allow_dangerous"] = ["enable_symm_mem"]
    assert SweepSpec.from_dict(data).engine.extra_args == {"enable_symm_mem": True}


def test_yaml_errors_are_spec_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        SweepSpec.from_yaml(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="mapping"):
        SweepSpec.from_yaml(bad)
    with pytest.raises(SpecError, match="cannot read"):
        SweepSpec.from_yaml(tmp_path / "missing.yaml")


def test_schema_documents_every_field() -> None:
    """Every field carries a description, so the JSON schema is the spec's reference doc."""

    def walk(schema: dict, defs: dict, path: str) -> list[str]:
        missing = []
        for name, prop in schema.get("properties", {}).items():
            ref = prop.get("$ref") or next((a.get("$ref") for a in prop.get("anyOf", []) if "$ref" in a), None)
            # pydantic leaves a field's description out when it equals the referenced model's.
            described = "description" in prop or (ref and "description" in defs[ref.split("/")[-1]])
            if not described:
                missing.append(f"{path}{name}")
            if ref:
                missing += walk(defs[ref.split("/")[-1]], defs, f"{path}{name}.")
        return missing

    schema = SweepSpec.model_json_schema()
    assert walk(schema, schema.get("$defs", {}), "") == []


def test_shipped_yaml_roundtrips_through_model_dump() -> None:
    for path in SHIPPED:
        spec = SweepSpec.from_yaml(path)
        again = SweepSpec.from_dict(yaml.safe_load(yaml.safe_dump(spec.model_dump(mode="json"))))
        assert again == spec


# --- reading the file: what YAML would let through -------------------------------------------

SHIPPED_TEXT = (REPO / "experiments" / "reference-cpu.yaml").read_text()


def _only_problem(excinfo: pytest.ExceptionInfo[SpecError]) -> str:
    (problem,) = excinfo.value.problems
    return problem.message


def test_duplicate_top_level_key_is_refused_naming_key_and_lines() -> None:
    text = SHIPPED_TEXT + "search:\n  all_reduce: [custom]\n"
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_yaml_text(text)
    first = 1 + SHIPPED_TEXT.splitlines().index("search:")
    last = len(SHIPPED_TEXT.splitlines()) + 1
    assert f"duplicate key 'search' on line {last} (first on line {first})" in _only_problem(excinfo)


def test_duplicate_nested_key_is_refused() -> None:
    text = SHIPPED_TEXT.replace("  tp_size: 2 ", "  tp_size: 2\n  tp_size: 4 ")
    with pytest.raises(SpecError, match="duplicate key 'tp_size'"):
        SweepSpec.from_yaml_text(text)


def test_merge_keys_may_be_overridden() -> None:
    """``<<: *anchor`` followed by one of its keys is YAML's override, not a duplicate."""
    text = "name: t\nbase: &b {kind: reference, model_path: ref-tiny}\n"
    data = yaml_data(text + "engine:\n  <<: *b\n  model_path: other\n")
    assert data["engine"] == {"kind": "reference", "model_path": "other"}


def test_exponent_without_a_dot_is_a_number() -> None:
    """YAML 1.1 reads ``1e3`` as a string, which the strict float fields would refuse."""
    spec = SweepSpec.from_yaml_text(SHIPPED_TEXT.replace("trial_timeout_s: 600", "trial_timeout_s: 6e2"))
    assert spec.budget.trial_timeout_s == 600.0


def test_non_utf8_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: t\n\xff\xfe\x00\x01")
    with pytest.raises(SpecError) as excinfo:
        SweepSpec.from_yaml(path)
    assert f"{path} is not UTF-8 text (byte 0xff at offset 8)" in _only_problem(excinfo)


def test_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=f"larger than {MAX_SPEC_BYTES:,} bytes"):
        SweepSpec.from_yaml(path)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        SweepSpec.from_yaml(tmp_path)


def test_alias_bomb_and_self_reference_are_refused() -> None:
    bomb = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + prev] * 10)}]\n" for prev, n in zip("abcde", "bcdef")
    )
    with pytest.raises(SpecError, match="more than 5,000 values"):
        SweepSpec.from_yaml_text(bomb)
    with pytest.raises(SpecError, match="refers to itself"):
        SweepSpec.from_yaml_text("name: &x [*x]\n")


def test_integer_too_long_for_python_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="the integer on line 1 has 5000 characters"):
        SweepSpec.from_yaml_text("name: " + "9" * 5000 + "\n")


# --- "try exactly these": listed triples and NCCL presets ------------------------------------------

TRIPLES = {"triples": [[3, 1, 4], [5, 4, 8], [2, 2, 4]], "include_auto": True}
PRESETS = [{}, {"NCCL_ALGO": "ring", "NCCL_PROTO": "LL"}, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "default"}]


def test_listed_triples_are_exactly_the_speculative_points() -> None:
    spec = SweepSpec.from_dict(with_("search.speculative", TRIPLES))
    labels = [t.label() for t in spec.space().speculative]
    assert labels == ["auto", "steps=3 topk=1 draft=4", "steps=5 topk=4 draft=8", "steps=2 topk=2 draft=4"]
    assert len(spec.space()) == 4 * 2  # x NCCL_ALGO default / Ring


def test_nccl_presets_are_normalised_exact_settings() -> None:
    data = with_("search.nccl_env", ...)
    data["search"]["nccl_presets"] = PRESETS
    spec = SweepSpec.from_dict(data)
    # spelled canonically, "default" (or null) dropped: a variable absent is unset
    assert spec.search.nccl_presets == [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}, {"NCCL_ALGO": "Tree"}]
    assert spec.search.nccl_variables() == ["NCCL_ALGO", "NCCL_PROTO"]
    space = spec.space()
    assert space.dimension_sizes()["nccl_presets"] == 3
    assert len(space) == len(space.speculative) * 3


def _presets(presets, **search) -> dict:
    data = with_("search.nccl_env", ...)
    data["search"].update(nccl_presets=presets, **search)
    return data


LIST_FORMS_BROKEN = [
    ("triple breaks the chain rule", with_("search.speculative", {"triples": [[3, 1, 4], [3, 1, 5]]}),
     "search.speculative.triples", "[1] = [3, 1, 5]: eagle_topk=1 is a chain"),
    ("tree cannot hold the triple's drafts", with_("search.speculative", {"triples": [[1, 2, 8]]}),
     "search.speculative.triples", "[0] = [1, 2, 8]: num_draft_tokens=8 needs 7 candidates"),
    ("triple of two numbers", with_("search.speculative", {"triples": [[3, 1]]}),
     "search.speculative.triples", "three integers"),
    ("boolean in a triple", with_("search.speculative", {"triples": [[3, True, 4]]}),
     "search.speculative.triples", "three integers"),
    ("triple listed twice", with_("search.speculative", {"triples": [[3, 1, 4], [3, 1, 4]]}),
     "search.speculative.triples", "listed twice"),
    ("empty triples", with_("search.speculative", {"triples": []}), "search.speculative.triples", "non-empty"),
    ("triples and dimensions", with_("search.speculative", {"triples": [[3, 1, 4]], "num_steps": 3}),
     "search.speculative", "give triples or num_steps, not both"),
    ("neither triples nor steps", with_("search.speculative", {"eagle_topk": 1}),
     "search.speculative", "num_steps is required (or list the exact points in triples)"),
    ("presets without NCCL's defaults", _presets([{"NCCL_ALGO": "Ring"}]), "search.nccl_presets", "add {}"),
    ("preset value outside NCCL's set", _presets([{}, {"NCCL_ALGO": "Rnig"}]),
     "search.nccl_presets.1.NCCL_ALGO", "unknown token"),
    ("preset repeated in another spelling", _presets([{}, {"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "ring"}]),
     "search.nccl_presets", "preset 2 ({'NCCL_ALGO': 'Ring'}) repeats preset 1"),
    ("'default' preset repeats {}", _presets([{}, {"NCCL_ALGO": "default"}]), "search.nccl_presets",
     "repeats preset 0"),
    ("dangerous preset not allowed", _presets([{}, {"NCCL_PROTO": "LL128"}]),
     "search.nccl_presets.1.NCCL_PROTO", "allow_dangerous"),
    ("SGLang-managed variable in a preset", _presets([{}, {"NCCL_CUMEM_ENABLE": "1"}]),
     "search.nccl_presets.1.NCCL_CUMEM_ENABLE", "enable_symm_mem"),
    ("boolean in a preset", _presets([{}, {"NCCL_ALGO": True}]),
     "search.nccl_presets.1.NCCL_ALGO", "a string, an integer or null"),
    ("presets and nccl_env", _presets([{}, {"NCCL_ALGO": "Ring"}], nccl_env={"NCCL_PROTO": [None, "LL"]}),
     "search", "not both"),
    ("preset variable also fixed in engine.env",
     {**_presets([{}, {"NCCL_ALGO": "Ring"}]), "engine": {**BASE["engine"], "env": {"NCCL_ALGO": "Tree"}}},
     "search.nccl_presets", "also fixed in engine.env.NCCL_ALGO"),
    ("presets on one rank", {**_presets([{}, {"NCCL_ALGO": "Ring"}]), "engine": {**BASE["engine"], "tp_size": 1}},
     "search.nccl_presets", "tp_size > 1"),
]


@pytest.mark.parametrize(("case", "data", "field", "words"), LIST_FORMS_BROKEN, ids=[b[0] for b in LIST_FORMS_BROKEN])
def test_broken_list_forms_name_the_field(case: str, data: dict, field: str, words: str) -> None:
    test_broken_spec_names_the_field(case, data, field, words)


def test_allow_dangerous_applies_to_presets() -> None:
    spec = SweepSpec.from_dict(_presets([{}, {"NCCL_PROTO": "LL128"}], allow_dangerous=["NCCL_PROTO=LL128"]))
    assert spec.search.nccl_presets == [{}, {"NCCL_PROTO": "LL128"}]


def test_validate_counts_and_shows_the_list_forms() -> None:
    from orchestrator.sweep.output.spec_summary import describe_spec

    data = with_("search.speculative", TRIPLES)
    data["search"].pop("nccl_env")
    data["search"]["nccl_presets"] = PRESETS
    summary = describe_spec(SweepSpec.from_dict(data))
    rows = {d["name"]: d for d in summary["dimensions"]}
    assert rows["speculative (steps, topk, draft)"] == {
        "name": "speculative (steps, topk, draft)", "values": "(3,1,4), (5,4,8), (2,2,4) + auto", "count": 4}
    assert rows["nccl_presets"] == {
        "name": "nccl_presets", "values": "default; NCCL_ALGO=Ring,NCCL_PROTO=LL; NCCL_ALGO=Tree", "count": 3}
    assert summary["valid_configurations"] == 4 * 3


def test_validate_warns_when_settings_cannot_give_an_interval() -> None:
    spec = SweepSpec.from_dict({**BASE, "benchmark": {"repetitions": 2},
                                "confirmation": {"min_visits": 2, "max_visits": 2}})
    warnings = spec.warnings()
    assert any(w.startswith("benchmark.repetitions: 2 gives no interval") and "target_ci_rel can never be met" in w
               for w in warnings), warnings
    assert any(w.startswith("confirmation.max_visits: 2 can never decide") for w in warnings), warnings
    fixed = SweepSpec.from_dict({**BASE, "benchmark": {"repetitions": 2, "target_ci_rel": None}}).warnings()
    assert not any("target_ci_rel" in w for w in fixed), fixed  # no target: nothing to meet
    low = _not_nccl(SweepSpec.from_dict({**BASE, "benchmark": {"repetitions": 6, "min_repetitions": 2}}).warnings())
    assert low == ["benchmark.min_repetitions: 2 acts as 3 (no interval is stated from fewer values, so no level "
                   "stops before 3 repetitions)"], low
    assert _not_nccl(SweepSpec.from_dict(BASE).warnings()) == [], "the defaults give intervals"
    switched_off = {**BASE, "confirmation": {"enabled": False, "min_visits": 1, "max_visits": 2}}
    assert _not_nccl(SweepSpec.from_dict(switched_off).warnings()) == [], "no confirmation: nothing to warn about"


def _not_nccl(warnings: list[str]) -> list[str]:
    return [w for w in warnings if not w.startswith(("engine.env", "benchmark.api"))]


def test_validate_warns_when_an_sglang_sweep_sends_raw_text() -> None:
    """A chat model's draft accepts differently on raw text than on its chat template's: tuned on raw
    text, the best chain length may not be production's. The reference engine is not warned about."""
    raw = [w for w in SweepSpec.from_dict(BASE).warnings() if w.startswith("benchmark.api")]
    assert len(raw) == 1 and "no chat template" in raw[0] and "set benchmark.api: chat" in raw[0], raw
    chat = SweepSpec.from_dict({**BASE, "benchmark": {"api": "chat"}}).warnings()
    assert not any(w.startswith("benchmark.api") for w in chat), chat


def test_validate_says_which_half_of_the_nccl_proof_is_off() -> None:
    """NCCL's own per-rank lines need NCCL_DEBUG=INFO and its ENV subsystem; without them only the
    env audit proves the variables arrived, and validate says so (the shipped Kimi specs need not)."""
    def nccl(env: dict[str, str], **engine) -> list[str]:
        data = with_("engine.env", env)
        data["engine"].update(engine)
        if engine.get("tp_size") == 1:
            data["search"]["nccl_env"] = {}
        return [w for w in SweepSpec.from_dict(data).warnings() if w.startswith("engine.env")]

    (off,) = nccl({"NCCL_DEBUG": "WARN"})
    assert off.startswith("engine.env: NCCL_DEBUG: WARN turns off NCCL's own per-rank proof")
    assert "only the env audit of every process proves" in off and "NCCL_DEBUG_SUBSYS: INIT,ENV" in off
    assert nccl({})[0].startswith("engine.env: NCCL_DEBUG unset turns off")
    assert nccl({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}) == []
    assert nccl({"NCCL_DEBUG": "INFO"}) == []  # NCCL's default subsystems include ENV
    (no_env,) = nccl({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    assert "leaves out ENV" in no_env and "every trial would fail nccl_log" in no_env
    assert "excludes ENV" in nccl({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^ENV"})[0]
    assert nccl({"NCCL_DEBUG": "WARN"}, tp_size=1) == []  # one rank: no all-reduce to prove
    for path in SHIPPED:
        spec = SweepSpec.model_validate(yaml.safe_load(path.read_text()))
        assert not [w for w in spec.warnings() if w.startswith("engine.env")], path.name


def test_validate_prints_the_warnings(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, "benchmark": {"repetitions": 2}}))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "benchmark.repetitions: 2 gives no interval" in " ".join(result.output.split())


def test_values_the_rules_leave_out_are_named_never_dropped_silently() -> None:
    """A listed speculative value in no combination SGLang accepts is a warning naming it."""
    spec = SweepSpec.model_validate({**BASE, "search": {**BASE["search"], "speculative": {
        "num_steps": [2, 3], "eagle_topk": [1, 2], "num_draft_tokens": [4, 8, 32]}}})
    (warning,) = [w for w in spec.warnings() if w.startswith("search.speculative")]
    assert warning.startswith("search.speculative.num_draft_tokens: 32 is in no combination SGLang accepts")
    assert "leaves it out" in warning
    chains = SweepSpec.model_validate({**BASE, "search": {**BASE["search"], "speculative": {
        "num_steps": [2, 3], "eagle_topk": 1, "num_draft_tokens": [4, 8]}}})
    assert any(w.startswith("search.speculative.num_draft_tokens: 4, 8 are in no combination") for w in chains.warnings())
    assert not [w for w in SweepSpec.model_validate(BASE).warnings() if w.startswith("search.speculative")]
