"""Only flags SGLang has: every engine flag spectune renders, accepts, prints or documents is an exact
SGLang 0.5.23 server flag (serving/data/sglang_server_flags.json, generated from SGLang's own
parser by scripts/write_sglang_flags.py), or one of the reference engine's own flags.

SGLang's launcher refuses a name it lacks and an ambiguous prefix (``--cuda-graph-bs``) with exit 2,
and reads an unambiguous prefix (``--tp``) as the longer flag; none of that shows before a GPU node
runs the command. The rule for text (docs, help, messages) is in ``helpers.flag_tokens``.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.space import ALL_REDUCE_ARMS, ARM_FLAGS, BASELINE_PLAIN, Candidate, TrialPlan
from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.adaptive_schedule import _capture_note
from serving.all_reduce_rules import FUSION_BACKENDS
from serving.engine.command import build_command
from serving.engine.config import EngineConfig
from serving.reference.server_args import REFERENCE_ONLY_FLAGS, build_parser, option_strings
from serving.sglang_flags import flag_problem, sglang_flags

from helpers.flag_tokens import NOT_FLAGS, ROOT, line_problems, script_options, spectune_options, unwrap

SPECS = sorted((ROOT / "experiments").glob("*.yaml"))
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


# --- the list ------------------------------------------------------------------------------------


def test_the_list_is_sglang_0_5_23s_parser_with_its_aliases_and_deprecations() -> None:
    table = sglang_flags()
    data = json.loads((ROOT / "serving" / "data" / "sglang_server_flags.json").read_text())
    assert table.version == data["sglang_version"] == "0.5.23"
    assert data["generated_by"] == "python scripts/write_sglang_flags.py --version 0.5.23"
    assert (ROOT / "scripts" / "write_sglang_flags.py").is_file()
    assert len(table.names) == 561  # 532 argparse actions; docs/reference-engine.md says so
    for alias, canonical in [("--model", "--model-path"), ("--tensor-parallel-size", "--tp-size"),
                             ("--speculative-draft-model", "--speculative-draft-model-path")]:
        assert table.flags[alias].dest == table.flags[canonical].dest
    assert {"--tp", "--speculative-algo", "--cuda-graph-bs", "--cuda-graph-max-bs"}.isdisjoint(table.names)
    assert {"--cuda-graph-bs-decode", "--cuda-graph-max-bs-decode", "--speculative-adaptive-config"} <= table.accepted
    assert "--disable-cuda-graph" in table.deprecated and "--disable-cuda-graph" not in table.accepted
    assert not table.flags["--trust-remote-code"].takes_value and table.flags["--cuda-graph-bs-decode"].nargs == "+"
    for name, flag in table.flags.items():  # each entry is one action: its spellings share it
        assert name in flag.option_strings
        assert all(table.flags[other].dest == flag.dest for other in flag.option_strings)


def test_flag_problem_is_exact_and_says_what_was_meant() -> None:
    assert flag_problem("--tp-size") is None and flag_problem("--tensor-parallel-size") is None
    assert "did you mean --tp-size?" in flag_problem("--tp")
    ambiguous = flag_problem("--cuda-graph-bs")
    assert "ambiguous" in ambiguous and "--cuda-graph-bs-decode or --cuda-graph-bs-prefill" in ambiguous
    assert "deprecated" in flag_problem("--disable-cuda-graph")
    assert "did you mean --mem-fraction-static?" in flag_problem("--mem-fracton-static")


# --- engine commands -----------------------------------------------------------------------------


def _flags_of(argv: list[str]) -> list[str]:
    return [arg for arg in argv[3:] if arg.startswith("-")]


def command_problems(argv: list[str], *, kind: str) -> list[str]:
    """What is wrong with one rendered engine command (program, -m, module, flags...)."""
    accepted = sglang_flags().accepted | (frozenset(REFERENCE_ONLY_FLAGS) if kind == "reference" else frozenset())
    problems = [f"{flag}: {flag_problem(flag)}" for flag in _flags_of(argv) if flag not in accepted]
    if kind == "reference":
        try:
            build_parser().parse_args(argv[3:])
        except SystemExit:
            problems.append(f"the reference engine's parser refuses {argv[3:]}")
    return problems


def _plans(spec: SweepSpec) -> list[TrialPlan]:
    """The baselines, the first points of the space, and the first point on every all-reduce arm."""
    space = spec.space()
    first = next(iter(space))
    plans = DefineByRunSpace(spec).baselines() + [TrialPlan("search", c) for c in itertools.islice(space, 12)]
    plans += [TrialPlan("search", Candidate(first.speculative, arm, first.nccl_env)) for arm in ALL_REDUCE_ARMS]
    return plans


def _engine_config(spec: SweepSpec, plan: TrialPlan) -> EngineConfig:
    # orchestrator.sweep.execution.trial.engine_config_for, without importing Ray here
    config = plan.candidate.applied_to(spec.engine.template())
    if plan.kind == BASELINE_PLAIN:
        off = dict.fromkeys(("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                             "speculative_eagle_topk", "speculative_num_draft_tokens"))
        config = EngineConfig.model_validate({**config.model_dump(), **off})
    return config


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_shipped_spec_renders_only_flags_its_engine_and_sglang_take(path: Path) -> None:
    spec = SweepSpec.from_yaml(path)
    seen: set[str] = set()
    for plan in _plans(spec):
        argv = build_command(_engine_config(spec, plan), port=30000).argv
        assert not command_problems(argv, kind=spec.engine.kind), (plan.label(), argv)
        seen.update(_flags_of(argv))
    arm_flags = {"--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion",
                 "--flashinfer-allreduce-fusion-backend", "--enable-mscclpp", "--enable-torch-symm-mem",
                 "--enable-symm-mem"}  # the opt-in paths' arms (issue 44): SGLang 0.5.23's names, both engines
    assert arm_flags <= seen, "every all-reduce arm was rendered"


def test_each_fusion_backend_arm_renders_a_value_sglang_offers() -> None:
    # exec_.py's Literal["auto", "trtllm", "mnnvl", "cutedsl"]: each quoted in the flag's help text too
    help_text = sglang_flags().flags["--flashinfer-allreduce-fusion-backend"].help
    reference = next(a for a in build_parser()._actions if "--flashinfer-allreduce-fusion-backend" in a.option_strings)
    backends = [flags["flashinfer_allreduce_fusion_backend"] for flags in ARM_FLAGS.values()
                if "flashinfer_allreduce_fusion_backend" in flags]
    assert sorted(backends) == ["cutedsl", "mnnvl", "trtllm"]  # 'auto' is the default arm's, where SGLang turns it on
    for backend in backends:
        assert f"'{backend}':" in help_text and backend in FUSION_BACKENDS and backend in reference.choices


def test_the_command_check_catches_a_name_sglang_lacks() -> None:
    good = build_command(EngineConfig(kind="reference", model_path="ref-tiny"), port=1).argv
    assert not command_problems(good, kind="reference") and not command_problems(good, kind="sglang")
    for bad in ("--cuda-graph-bs", "--tp", "--disable-cuda-graph"):
        assert command_problems([*good, bad], kind="sglang"), bad
    assert command_problems([*good, "--api-key", "k"], kind="reference")  # SGLang's, not the reference engine's


# --- extra_args ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "extra", "words"),
    [
        ("sglang", {"cuda_graph_bs": [1, 8, 32]}, "did you mean --cuda-graph-bs-decode or --cuda-graph-bs-prefill"),
        ("sglang", {"cuda_graph_max_bs": 8}, "did you mean --cuda-graph-max-bs-decode"),
        ("sglang", {"disable_cuda_graph": True}, "deprecated in SGLang 0.5.23"),
        ("sglang", {"mem_fraction": 0.8}, "did you mean --mem-fraction-static"),
        ("sglang", {"trust_remote_code": 1}, "is a switch"),
        ("sglang", {"mem_fraction_static": True}, "takes a value"),
        ("sglang", {"mem_fraction_static": [0.8, 0.9]}, "takes one value, not a list"),
        ("sglang", {"help": True}, "prints the help"),
        ("reference", {"api_key": "k"}, "is not a flag of the reference engine"),
        ("reference", {"disable_cuda_graph": True}, "deprecated"),
    ],
)
def test_extra_args_must_be_exact_current_flags_of_the_engine(kind: str, extra: dict, words: str) -> None:
    with pytest.raises(ValidationError, match="extra_args") as info:
        EngineConfig(kind=kind, model_path="m", extra_args=extra)
    assert words in str(info.value)
    data = {"name": "t", "engine": {"kind": kind, "model_path": "m", "draft_model_path": "d", "extra_args": extra}}
    with pytest.raises(ValueError, match="engine.extra_args") as spec_info:
        SweepSpec.from_dict(data)
    assert words in str(spec_info.value)


def test_extra_args_take_every_current_sglang_flag() -> None:
    table = sglang_flags()
    sample = ["--cuda-graph-bs-decode", "--attention-backend", "--dist-timeout", "--enable-symm-mem"]
    extra = {name[2:]: ([1, 8] if table.flags[name].nargs == "+" else "x" if table.flags[name].takes_value else True)
             for name in sample}
    assert set(EngineConfig(kind="sglang", model_path="m", extra_args=extra).extra_args) == {
        "cuda_graph_bs_decode", "attention_backend", "dist_timeout", "enable_symm_mem"}
    assert EngineConfig(kind="reference", model_path="ref-tiny", extra_args={"cuda_graph_bs_decode": [1, 8]})


# --- the reference engine's parser ---------------------------------------------------------------


def _foreign(names: frozenset[str]) -> set[str]:
    return set(names - sglang_flags().names - set(REFERENCE_ONLY_FLAGS))


def test_the_reference_engine_registers_only_sglang_names_or_its_own() -> None:
    assert _foreign(option_strings() | {"--tp", "--cuda-graph-max-bs"}) == {"--tp", "--cuda-graph-max-bs"}
    foreign = _foreign(option_strings())
    assert not foreign, f"SGLang 0.5.23 has no {sorted(foreign)}: rename, remove or add to REFERENCE_ONLY_FLAGS"
    for name, why in REFERENCE_ONLY_FLAGS.items():
        assert name not in sglang_flags().names, f"{name} is SGLang's: not an own flag"
        assert name in option_strings() and why.strip(), name
    parser = build_parser()
    assert not parser.allow_abbrev
    assert all(isinstance(a, argparse._HelpAction) or a.option_strings for a in parser._actions)  # no positionals


# --- advice, help and messages -------------------------------------------------------------------


def test_the_line_rule_catches_what_sglang_would_refuse() -> None:
    assert line_problems("capture with --cuda-graph-bs-decode 1 8 32 and --tp-size 2") == []
    assert line_problems("capture with --cuda-graph-bs 1 8 32")  # SGLang: ambiguous, exit 2
    assert line_problems("--speculative-algo EAGLE3") and line_problems("--cuda-graph-max-bs 8")
    assert line_problems("--disable-cuda-graph") and not line_problems("--disable-cuda-graph (deprecated)")
    assert line_problems("--speculative-num-step 3")  # an abbreviation SGLang would read, spectune does not
    assert line_problems("python -m sglang.launch_server --model-path m --json")  # spectune's, not the engine's
    assert not line_problems("spectune validate --json spec.yaml")
    assert line_problems("spectune sweep --no-such-option")
    assert not line_problems("the reference engine rejects --tp")
    assert line_problems(unwrap("use ``--cuda-graph-\n    bs`` here")) and not line_problems(unwrap(
        "``--enforce-disable-\n    flashinfer-allreduce-fusion``"))
    assert {"--json", "--set", "--results-dir", "--help"} <= spectune_options()
    assert {"--version", "--src", "--deps"} <= script_options()  # scripts/write_sglang_flags.py's own
    assert set(NOT_FLAGS).isdisjoint(sglang_flags().names)


def test_the_adaptive_schedule_advises_sglangs_decode_graph_flag() -> None:
    on_grid = _capture_note([1, 8, 32])
    off_grid = _capture_note([1, 10, 33, 100])
    assert "--cuda-graph-max-bs-decode" in on_grid and "1 8 32" in on_grid
    assert "33, 100 are not among" in off_grid and "--cuda-graph-bs-decode" in off_grid
    for note in (on_grid, off_grid):
        assert line_problems(note) == [], note


def _string_constants(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_strings_in_the_code_name_only_real_flags() -> None:
    """Messages, help, advice and docstrings of orchestrator/ and serving/ (every string constant,
    the constant parts of f-strings included)."""
    problems = [
        f"{path.relative_to(ROOT)}:{lineno}: {problem}"
        for top in ("orchestrator", "serving")
        for path in sorted((ROOT / top).rglob("*.py"))
        for lineno, text in _string_constants(path)
        for line in unwrap(text).splitlines()
        for problem in line_problems(line)
    ]
    assert not problems, "\n".join(problems)


def test_the_cli_help_names_only_real_flags() -> None:
    runner = CliRunner()
    commands = [[], *[[name] for name in ("validate", "sweep", "serve", "bench", "probe", "audit", "engine-cmd",
                                          "examples")]]
    problems = []
    for command in commands:
        # wide enough that rich never shortens an option name ("--allow-random-pro…")
        result = runner.invoke(app, [*command, "--help"], terminal_width=300, env={"COLUMNS": "300"})
        assert result.exit_code == 0 and "…" not in result.output, result.output
        problems += [f"spectune {' '.join(command)} --help: {p}" for line in result.output.splitlines()
                     for p in line_problems(line)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_name_only_real_flags(path: Path) -> None:
    problems = [f"{path.name}:{i}: {problem}"
                for i, line in enumerate(unwrap(path.read_text(encoding="utf-8")).splitlines(), 1)
                for problem in line_problems(line)]
    assert not problems, "\n".join(problems)


def test_the_preflight_names_an_installed_sglang_the_flag_list_was_not_read_from() -> None:
    """The extra pins the version the list was generated for; a node with another SGLang gets a
    preflight line naming both versions and the two ways out (an engine may still start)."""
    from serving.engine.node_checks import engine_problems, sglang_version_note

    table = sglang_flags()
    assert sglang_version_note(table.version, expected=table.version, node="gpu-1") is None
    assert sglang_version_note(None, expected=table.version, node="gpu-1") is None  # not installed: another problem
    note = sglang_version_note("0.5.25", expected=table.version, node="gpu-1")
    assert note is not None and note.startswith("engine.kind: sglang: SGLang 0.5.25 is installed on node gpu-1")
    assert f"pip install 'sglang[all]=={table.version}'" in note
    assert "python scripts/write_sglang_flags.py --version 0.5.25" in note
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert extras["sglang"] == [f"sglang[all]=={table.version}"]
    # no SGLang on this machine: the problem names the pinned version to install
    problems = engine_problems(kind="sglang", model_path="org/model", draft_path=None)["problems"]
    (problem,) = [p for p in problems if p.startswith("engine.kind: sglang: the package 'sglang' cannot be imported")]
    assert f"pip install 'sglang[all]=={table.version}'" in problem
