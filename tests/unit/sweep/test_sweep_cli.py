"""``spectune sweep``: the dry run (no Ray, no GPUs) and where results land."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.spec import SweepSpec
from orchestrator.sweep import resolve_results_dir

REPO = Path(__file__).resolve().parents[3]
KIMI = REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml"


def test_dry_run_names_nccl_presets_as_what_is_searched() -> None:
    """A spec that searches whole NCCL presets says so (it printed 'none' before)."""
    result = CliRunner().invoke(app, ["sweep", "--dry-run", str(REPO / "experiments" / "kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml")])
    assert result.exit_code == 0, result.output
    first = " ".join(result.output.split("all-reduce arms")[0].split())
    assert "NCCL variables searched: 6 presets (search.nccl_presets: default; NCCL_ALGO=Ring," in first, first
    assert "over NCCL_ALGO, NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS, NCCL_MIN_NCHANNELS, NCCL_NTHREADS, NCCL_P2P_LEVEL, " \
        "NCCL_PROTO;" in first, first
    assert "searched: none" not in first


def test_dry_run_of_the_kimi_spec_prints_sglang_commands_without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from orchestrator.sweep.execution import driver

    # Watched where a connection would be made, not by ray.is_initialized(): that is already true
    # whenever the session's Ray cluster is up (the integration tests run first in a full run).
    connects: list[str] = []
    monkeypatch.setattr(driver, "connect_ray", lambda address: connects.append(f"connect_ray({address!r})"))
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: connects.append("ray.init"))
    result = CliRunner().invoke(app, ["sweep", "--dry-run", "--first", "40", str(KIMI)])
    assert connects == [], "a dry run must not connect to or start Ray"
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("baseline: no speculation") < out.index("baseline: SGLang's own choice") < out.index("proposed")
    commands = [line for line in out.splitlines() if "sglang.launch_server" in line and not line.startswith("  ")]
    assert len(commands) == 42  # two baselines + the first forty proposals
    assert "NCCL variables searched: NCCL_ALGO" in out.replace("\n", " ")
    assert "--speculative-algorithm" not in commands[0], "the first baseline runs without speculation"
    assert "--speculative-algorithm EAGLE3" in commands[1] and "--speculative-num-steps" not in commands[1]
    assert all("--speculative-algorithm EAGLE3" in c for c in commands[2:])
    assert any("--speculative-num-steps" in c for c in commands[2:])
    assert any("NCCL_" in c.split("python")[0].replace("NCCL_DEBUG", "") for c in commands[2:]), (
        "the NCCL dimensions are searched: some proposal forces an NCCL variable")
    assert all("NCCL_DEBUG=INFO" in c and "NCCL_DEBUG_SUBSYS=INIT,ENV" in c for c in commands)
    # as each trial starts: no SGLang warm-up, decode graphs up to the highest level (48, speculation's cap too)
    assert all(c.endswith("--skip-server-warmup --cuda-graph-bs-decode " + (
        "1 2 4 8 12 16 24 32 40 48" if i == 0 else "1 2 3 4 5 6 7 8 10 12 14 16 18 20 22 24 26 28 30 32 40 44 48")
        + " --cuda-graph-max-bs-decode 48") for i, c in enumerate(commands)), commands[:2]
    # the plan's cost: 22 trials + (the best, SGLang's default) x 6 visits, at SGLang's default start
    flat = " ".join(out.split())
    assert ("cost: 34 engine starts (22 trials + up to 12 confirmation visits: 2 contenders x 6) x 10m00s per "
            "start (assumed: the default for sglang (spec.DEFAULT_ENGINE_START_S); budget.engine_start_estimate_s sets "
            "it) = ~5h40m of engine starts") in flat
    # ... and the night as a timeline that fits its 8 hours, every path and NCCL setting in its first hours
    # (after the cold first start: assumed twice a warm one)
    assert "7h13m end at max_visits: fits budget.time_limit_s (8h00m); fits up to 11.3-minute starts" in flat
    assert "first started: no_fusion at 1h00m, nccl at 1h13m, nccl NCCL_ALGO=Ring at 1h26m" in flat
    assert "chance of a decided verdict by 6 visits (margin 3.0%, the spec's confirmation.margin" in flat


def test_dry_run_states_each_arms_command_and_kernel_on_a_pcie_and_an_nvlink_node() -> None:
    out = CliRunner().invoke(app, ["sweep", "--dry-run", "--all-nodes", "--first", "1", str(KIMI)]).output
    lines = out.splitlines()  # KIMI's node is auto: its tables only on request (--all-nodes)
    arms = {line.split(":")[0].strip(): i for i, line in enumerate(lines) if line.startswith("  ") and
            "sglang.launch_server" in line}
    assert set(arms) == {"default", "no_fusion", "nccl"}
    default, no_fusion, nccl = (lines[arms[a]] for a in ("default", "no_fusion", "nccl"))
    assert "--enforce-disable-flashinfer-allreduce-fusion" not in default and "--disable-custom-all-reduce" not in default
    assert "--enforce-disable-flashinfer-allreduce-fusion" in no_fusion and "--disable-custom-all-reduce" not in no_fusion
    assert "--enforce-disable-flashinfer-allreduce-fusion" in nccl and "--disable-custom-all-reduce" in nccl

    def kernel(arm: str, node: str) -> str:  # the arm's row of the node's table, and the lines after it
        start = next(i for i, line in enumerate(lines) if f"decode's all-reduce on {node} " in line)
        row = next(i for i in range(start, len(lines)) if lines[i].split()[:1] == [arm])
        return " ".join(lines[row:start + 5])

    assert "FlashInfer's fused all-reduce" in kernel("default", "sm90-nvlink")
    assert "custom all-reduce" in kernel("no_fusion", "sm90-nvlink")
    assert "NCCL" in kernel("nccl", "sm90-nvlink") and "NCCL settings searched on it" in kernel("nccl", "sm90-nvlink")
    assert "measured with NCCL's defaults" in kernel("default", "sm90-nvlink")
    for arm in ("default", "no_fusion", "nccl"):  # eight PCIe GPUs: NCCL everywhere, one arm measured
        assert kernel(arm, "sm120-pcie").split()[1] == "NCCL"
    assert "PCIe-only" in kernel("default", "sm120-pcie") and "NCCL settings searched" in kernel("default", "sm120-pcie")
    assert "same as default (measured once)" in kernel("nccl", "sm120-pcie")


def test_the_same_seed_dry_runs_the_same_trials() -> None:
    first = CliRunner().invoke(app, ["sweep", "--dry-run", "--first", "4", str(KIMI)]).output
    again = CliRunner().invoke(app, ["sweep", "--dry-run", "--first", "4", str(KIMI)]).output
    assert first == again


def test_sweep_needs_a_spec_or_resume() -> None:
    result = CliRunner().invoke(app, ["sweep"])
    assert result.exit_code == 2


def test_resume_of_a_directory_without_a_sweep_is_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "--resume", str(tmp_path)])
    assert result.exit_code == 2


def _spec(results_dir: str) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "results_dir": results_dir,
    })


def test_results_dir_relative_to_where_the_user_runs(tmp_path: Path) -> None:
    assert resolve_results_dir(_spec("results").results_dir, cwd=tmp_path) == (tmp_path / "results").resolve()
    assert resolve_results_dir(_spec("results").results_dir, "/abs/out", cwd=tmp_path) == Path("/abs/out")
    assert resolve_results_dir(_spec("/data/r").results_dir, cwd=tmp_path) == Path("/data/r")


def test_results_dir_never_inside_rays_temporary_copy(tmp_path: Path, monkeypatch) -> None:
    job_copy = tmp_path / "ray" / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    job_copy.mkdir(parents=True)
    monkeypatch.setenv("SPECTUNE_RESULTS_ROOT", str(tmp_path / "kept"))
    assert resolve_results_dir(_spec("results").results_dir, cwd=job_copy) == (tmp_path / "kept" / "results").resolve()


def test_dry_run_of_a_two_node_spec_shows_every_node_ranks_command() -> None:
    result = CliRunner().invoke(app, ["sweep", "--dry-run", "--first", "1",
                                      str(REPO / "experiments" / "kimi-k2.5-eagle3-2x8-h100.yaml")], terminal_width=400)
    assert result.exit_code == 0, result.output
    trial_1 = result.output.split("trial 1 ", 1)[1].split("trial 2 ", 1)[0]
    ranks = [line for line in trial_1.splitlines() if "sglang.launch_server" in line]
    assert len(ranks) == 2 and "--node-rank 0" in ranks[0] and "--node-rank 1" in ranks[1], trial_1
    assert "node rank 1:" in trial_1
