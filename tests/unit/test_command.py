"""Engine command rendering: SGLang's flag names and rules, the same flags for the reference engine."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.space import candidate_from_settings
from orchestrator.spec import SweepSpec
from serving.engine.command import build_command, engine_managed_env, render_flags
from serving.engine.config import EngineConfig

REPO = Path(__file__).resolve().parents[2]
KIMI = SweepSpec.from_yaml(REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml")


def flags_of(argv: list[str]) -> dict[str, list[str]]:
    """``--a 1 --b --c x y`` -> {"a": ["1"], "b": [], "c": ["x", "y"]}."""
    out: dict[str, list[str]] = {}
    current = None
    for item in argv:
        if item.startswith("--"):
            current = item[2:]
            out[current] = []
        elif current is not None:
            out[current].append(item)
    return out


def test_render_flags() -> None:
    assert render_flags({"a_b": 1, "c": True, "d": False, "e": None, "f": [1, "x"], "g": 0.5}) == [
        "--a-b", "1", "--c", "--f", "1", "x", "--g", "0.5",
    ]


def test_sglang_command_uses_sglang_names() -> None:
    config = candidate_from_settings(KIMI, {"num_steps": "3", "eagle_topk": "1", "all_reduce": "nccl"}).applied_to(KIMI.engine.template())
    command = build_command(config, host="0.0.0.0", port=31000, python="python")
    assert command.argv[:3] == ["python", "-m", "sglang.launch_server"]
    flags = flags_of(command.argv)
    assert flags["model-path"] == ["moonshotai/Kimi-K2.5"]
    assert flags["tp-size"] == ["8"]
    assert flags["speculative-algorithm"] == ["EAGLE3"]
    assert flags["speculative-draft-model-path"] == ["lightseekorg/kimi-k2.5-eagle3-mla"]
    assert (flags["speculative-num-steps"], flags["speculative-eagle-topk"], flags["speculative-num-draft-tokens"]) == (
        ["3"], ["1"], ["4"],  # topk 1: draft = steps + 1
    )
    assert flags["disable-custom-all-reduce"] == [] and flags["enable-metrics"] == []
    assert flags["host"] == ["0.0.0.0"] and flags["port"] == ["31000"]
    assert command.url == "http://0.0.0.0:31000"
    assert command.env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


def test_auto_choice_leaves_all_three_unset() -> None:
    config = candidate_from_settings(KIMI, {}).applied_to(KIMI.engine.template())  # include_auto: first point is auto
    flags = flags_of(build_command(config, port=1).argv)
    assert not {"speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"} & set(flags)
    assert "disable-custom-all-reduce" not in flags


def test_tree_capacity_checked_when_reproducing_by_hand() -> None:
    candidate = candidate_from_settings(KIMI, {"num_steps": "2", "eagle_topk": "2", "num_draft_tokens": "8"})
    with pytest.raises(ValueError, match="holds 6"):
        candidate.applied_to(KIMI.engine.template())


def test_symm_mem_and_nvls_are_flags_not_env() -> None:
    config = EngineConfig(kind="sglang", model_path="m", tp_size=2, extra_args={"enable_symm_mem": True})
    command = build_command(config, port=1)
    assert "--enable-symm-mem" in command.argv
    assert "NCCL_CUMEM_ENABLE" not in command.env


_MANAGED_CASES = [
    # (extra_args, launching environment, expected NCCL_CUMEM_ENABLE, expected NCCL_NVLS_ENABLE)
    ({}, {}, "0", "0"),
    # a launching environment that already has them (exported before `ray start`, a container):
    # SGLang keeps them, so a correct launch must not fail the audit
    ({}, {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}, "1", "1"),
    ({}, {"NCCL_CUMEM_ENABLE": "0"}, "0", "0"),
    # symmetric memory overrides whatever was there, for both
    ({"enable_symm_mem": True}, {}, "1", "1"),
    ({"enable_symm_mem": True}, {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}, "1", "1"),
    # --enable-nccl-nvls overrides NVLS only; CUMEM still follows the launching environment
    ({"enable_nccl_nvls": True}, {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "1"}, "1", "1"),
    ({"enable_nccl_nvls": True}, {}, "0", "1"),
]


@pytest.mark.parametrize(("args", "launch_env", "cumem", "nvls"), _MANAGED_CASES)
def test_managed_env_follows_sglangs_rule_given_the_launching_environment(
    args: dict, launch_env: dict, cumem: str, nvls: str
) -> None:
    config = EngineConfig(kind="sglang", model_path="m", tp_size=2, extra_args=args)
    assert engine_managed_env(config, launch_env=launch_env) == {
        "NCCL_CUMEM_ENABLE": cumem, "NCCL_NVLS_ENABLE": nvls, "CUDA_DEVICE_MAX_CONNECTIONS": None,
    }


@pytest.mark.parametrize(
    ("args", "launch_env", "cumem"),
    [
        ({"moe_a2a_backend": "deepep_v2"}, {}, "1"),  # moe_hook.py setdefault("NCCL_CUMEM_ENABLE", "1")
        ({"moe_a2a_backend": "deepep_v2"}, {"NCCL_CUMEM_ENABLE": "0"}, "0"),  # setdefault keeps a set value
        ({"enable_kv_cache_sharding": True}, {}, None),  # 1 unless SGLANG_* / the memory saver: presence only
        ({"nnodes": 2}, {}, None),  # 1 on an MNNVL fabric (a GPU query): presence only
        ({"nnodes": 2}, {"NCCL_CUMEM_ENABLE": "0"}, "0"),
        ({"nnodes": 2, "enable_symm_mem": True}, {}, "1"),
    ],
)
def test_managed_cumem_where_more_than_the_flags_decide(args: dict, launch_env: dict, cumem: str | None) -> None:
    args = dict(args)
    nnodes = args.pop("nnodes", 1)  # the engine's own field, not an extra flag
    config = EngineConfig(kind="sglang", model_path="m", tp_size=2, nnodes=nnodes, extra_args=args)
    assert engine_managed_env(config, launch_env=launch_env)["NCCL_CUMEM_ENABLE"] == cumem


@pytest.mark.parametrize(("args", "launch_env", "cumem", "nvls"), _MANAGED_CASES)
def test_reference_engine_sets_what_the_audit_expects(
    monkeypatch: pytest.MonkeyPatch, args: dict, launch_env: dict, cumem: str, nvls: str
) -> None:
    # The reference engine copies SGLang's rule on its own (it does not call engine_managed_env),
    # so the two agreeing is evidence, not a tautology.
    from serving.reference.server import prepare_environment
    from serving.reference.server_args import parse_args

    for name in ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS"):
        monkeypatch.setenv(name, "")  # so that teardown restores what prepare_environment sets
        monkeypatch.delenv(name)
    for name, value in launch_env.items():
        monkeypatch.setenv(name, value)
    config = EngineConfig(kind="reference", model_path="ref-tiny", extra_args=args)
    expected = engine_managed_env(config, launch_env=dict(os.environ))
    flags = [f"--{name.replace('_', '-')}" for name, on in args.items() if on]
    prepare_environment(parse_args(["--model-path", "ref-tiny", *flags], cuda_available=False, cuda_device_count=0))
    assert {name: os.environ.get(name) for name in expected if expected[name] is not None} == {
        "NCCL_CUMEM_ENABLE": cumem, "NCCL_NVLS_ENABLE": nvls,
    }
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ


@pytest.mark.parametrize(
    # SGLang 0.5.23's own aliases (serving/data/sglang_server_flags.json), then abbreviations
    "flag", ["tensor_parallel_size", "model", "speculative_draft_model", "speculative_algo", "tp",
             "speculative-num-step", "--port", "hos"]
)
def test_aliases_and_abbreviations_of_managed_flags_are_refused(flag: str) -> None:
    # rendered after the typed flags, argparse's last value would silently win
    with pytest.raises(ValueError, match="set by spectune"):
        EngineConfig(kind="sglang", model_path="m", extra_args={flag: 1})


def test_reference_command_has_the_same_flags() -> None:
    sglang = EngineConfig(kind="sglang", model_path="ref-tiny", tp_size=2, env={"NCCL_ALGO": "Ring"})
    reference = sglang.model_copy(update={"kind": "reference"})
    a, b = build_command(sglang, port=5), build_command(reference, port=5)
    assert a.argv[2] == "sglang.launch_server" and b.argv[2] == "serving.reference"
    assert a.argv[3:] == b.argv[3:] and a.env == b.env


def test_shell_line_reproduces_argv_and_env() -> None:
    config = EngineConfig(kind="reference", model_path="ref tiny", env={"NCCL_DEBUG": "INFO"})
    command = build_command(config, port=7, python=sys.executable)
    line = command.shell()
    assert line.startswith("NCCL_DEBUG=INFO ")
    assert shlex.split(line)[1:] == command.argv


def test_shell_line_for_logs_redacts_secrets() -> None:
    config = EngineConfig(kind="reference", model_path="m", env={"HF_TOKEN": "hf_x", "NCCL_ALGO": "Ring"})
    command = build_command(config, port=7)
    assert "HF_TOKEN=hf_x" in command.shell()  # by hand, the user needs the real value
    logged = command.shell(redacted=True)
    assert "hf_x" not in logged and "HF_TOKEN='<redacted>'" in logged and "NCCL_ALGO=Ring" in logged


def test_redacted_env_and_json_form() -> None:
    env = {"HF_TOKEN": "hf_x", "OPENAI_API_KEY": "sk-1", "NCCL_ALGO": "Ring"}
    command = build_command(EngineConfig(kind="reference", model_path="m", env=env), port=7)
    assert command.redacted_env() == {"HF_TOKEN": "<redacted>", "OPENAI_API_KEY": "<redacted>", "NCCL_ALGO": "Ring"}
    assert command.env == env  # the command itself keeps the real values, for the launch
    shown = command.to_dict()  # redacted unless asked otherwise
    assert shown == {"argv": command.argv, "env": command.redacted_env(), "url": "http://127.0.0.1:7"}
    assert "hf_x" not in json.dumps(shown) and "sk-1" not in json.dumps(shown)
    assert command.to_dict(redacted=False)["env"] == env


def test_engine_cmd_cli_prints_sglang_command() -> None:
    exe = Path(sys.executable).with_name("spectune")
    spec = REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml"
    run = subprocess.run(
        [str(exe), "engine-cmd", str(spec), "--set", "steps=3", "--set", "topk=2", "--set", "draft=6",
         "--set", "NCCL_PROTO=LL"], capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    words = shlex.split(run.stdout)
    assert "NCCL_PROTO=LL" in words and "sglang.launch_server" in words
    flags = flags_of(words)
    assert flags["speculative-num-draft-tokens"] == ["6"]
    bad = subprocess.run([str(exe), "engine-cmd", str(spec), "--set", "steps=3", "--set", "topk=2", "--set", "draft=40"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "holds 10" in bad.stderr.replace("\n", " ")
    typo = subprocess.run([str(exe), "engine-cmd", str(spec), "--set", "stpes=3"], capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and "unknown setting" in typo.stderr
