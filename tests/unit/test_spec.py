"""SweepSpec validation: the shipped specs load, broken ones name the field, value and fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))

BASE = {
    "name": "t",
    "engine": {
        "kind": "sglang",
        "model_path": "org/model",
        "draft_model_path": "org/draft",
        "tp_size": 2,
    },
    "search": {
        "speculative": {"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": {"low": 2, "high": 8}},
        "nccl_env": {"NCCL_ALGO": [None, "Ring"]},
    },
}


def with_(path: str, value) -> dict:
    """BASE with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    data = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is ...:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return data


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
    config = spec.engine_config(num_steps=3, topk=1, num_draft_tokens=4, all_reduce="nccl", nccl_env={"NCCL_ALGO": "Ring"})
    assert config.env == {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"}
    assert config.disable_custom_all_reduce is True
    assert config.speculative_draft_model_path == "org/draft"


BROKEN = [
    # (what is broken, spec, field that must be named, words the message must contain)
    ("unknown top-level key", with_("budgte", {"num_trials": 3}), "budgte", "did you mean 'budget'"),
    ("unknown engine key", with_("engine.modle_path", "x"), "engine.modle_path", "did you mean 'model_path'"),
    ("wrong type", with_("engine.tp_size", "eight"), "engine.tp_size", "integer"),
    ("bad engine kind", with_("engine.kind", "vllm"), "engine.kind", "sglang"),
    ("NCCL value outside NCCL's set", with_("search.nccl_env", {"NCCL_ALGO": [None, "Rnig"]}),
     "search.nccl_env.NCCL_ALGO", "Ring"),
    ("unknown NCCL variable", with_("search.nccl_env", {"NCCL_ALOG": [None, "Ring"]}),
     "search.nccl_env.NCCL_ALOG", "unknown NCCL variable"),
    ("dangerous protocol not allowed", with_("search.nccl_env", {"NCCL_PROTO": [None, "LL128"]}),
     "search.nccl_env.NCCL_PROTO", "allow_dangerous"),
    ("dangerous buffer size not allowed", with_("search.nccl_env", {"NCCL_BUFFSIZE": [None, 8388608]}),
     "search.nccl_env.NCCL_BUFFSIZE", "hangs"),
    ("NVLS algorithm not allowed", with_("search.nccl_env", {"NCCL_ALGO": [None, "NVLS"]}),
     "search.nccl_env.NCCL_ALGO", "NVLink multicast"),
    ("SGLang-managed variable in the env space", with_("search.nccl_env", {"NCCL_CUMEM_ENABLE": [None, "1"]}),
     "search.nccl_env.NCCL_CUMEM_ENABLE", "enable-symm-mem"),
    ("SGLang-managed variable in fixed env", with_("engine.env", {"NCCL_NVLS_ENABLE": "1"}),
     "engine.env.NCCL_NVLS_ENABLE", "enable-nccl-nvls"),
    ("NVLS through an exclusion list", with_("search.nccl_env", {"NCCL_PROTO": [None, "^LL,Simple"]}),
     "search.nccl_env.NCCL_PROTO", "LL128"),
    ("NVLS engine flag not allowed", with_("engine.extra_args", {"enable_nccl_nvls": True}),
     "engine.extra_args.enable_nccl_nvls", "allow_dangerous"),
    ("symmetric memory (NVLS) not allowed", with_("engine.extra_args", {"enable-symm-mem": True}),
     "engine.extra_args.enable_symm_mem", "NVLink multicast"),
    ("Ray-managed variable in fixed env", with_("engine.env", {"CUDA_VISIBLE_DEVICES": "0,1"}),
     "engine.env.CUDA_VISIBLE_DEVICES", "Ray assigns"),
    ("NCCL space without the default", with_("search.nccl_env", {"NCCL_ALGO": ["Ring", "Tree"]}),
     "search.nccl_env.NCCL_ALGO", "default"),
    ("tree cannot hold the draft tokens", with_("search.speculative", {"num_steps": 1, "eagle_topk": 2, "num_draft_tokens": 8}),
     "search.speculative", "num_draft_tokens - 1 <= topk"),
    ("draft tokens missing for a tree", with_("search.speculative", {"num_steps": 2, "eagle_topk": [1, 4]}),
     "search.speculative", "num_draft_tokens is required"),
    ("range upside down", with_("search.speculative", {"num_steps": {"low": 5, "high": 2}}),
     "search.speculative.num_steps", "below low"),
    ("speculation off but searched", with_("engine.speculative_algorithm", None),
     "search.speculative", "speculative_algorithm is null"),
    ("draft model missing", with_("engine.draft_model_path", ...), "engine", "needs draft_model_path"),
    ("managed flag in extra_args", with_("engine.extra_args", {"speculative-num-steps": 3}),
     "engine.extra_args", "search.speculative"),
    ("objective metric unknown", with_("objective", {"metric": "throughput"}), "objective.metric", "output_tok_per_s"),
    ("objective direction backwards", with_("objective", {"metric": "ttft_ms_p99", "mode": "max"}),
     "objective", "mode: min"),
    ("objective concurrency not measured", with_("objective", {"concurrency": 3}), "objective.concurrency", "[1, 8]"),
    ("random prompts for tuning", with_("benchmark", {"dataset": "random"}), "benchmark.dataset",
     "allow_random_prompts"),
    ("sharegpt without a file", with_("benchmark", {"dataset": "sharegpt"}), "benchmark.dataset", "dataset_path"),
    ("too few GPUs", with_("resources", {"gpus_per_trial": 1}), "resources.gpus_per_trial", "tp_size=2"),
    ("NCCL space on one rank", with_("engine.tp_size", 1), "search.nccl_env", "tp_size > 1"),
    ("negative repetitions", with_("benchmark", {"repetitions": 0}), "benchmark.repetitions", "greater than or equal to 1"),
    ("bad name", with_("name", "my sweep!"), "name", "pattern"),
]


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
