"""NCCL's own "set by environment" lines as the second per-rank proof (serving.engine.nccl_log).

The log is the real one: the reference engine at TP 2 on 2x H200 with NCCL 2.28
(``docs/measurements/nccl-env-propagation-h200x2.log-excerpt.txt``), launched once correctly
(pids 641/642) and once with the ``late_env`` fault, where the TP workers were spawned before
NCCL_ALGO/NCCL_PROTO were in the environment (pids 784/785)."""

from __future__ import annotations

from pathlib import Path

from serving.engine.nccl_log import check_nccl_log, nccl_debug_enabled, parse_nccl_env_lines

EXCERPT = (Path(__file__).resolve().parents[2] / "docs" / "measurements"
           / "nccl-env-propagation-h200x2.log-excerpt.txt").read_text().splitlines()
GOOD_RUN = "\n".join(EXCERPT[:10])
LATE_ENV_RUN = "\n".join(EXCERPT[10:])
TRIAL_ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV",
             "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
AUDIT = [{"pid": 641, "role": "tp_worker", "name": "ref::tp0"}, {"pid": 642, "role": "tp_worker", "name": "ref::tp1"}]


def test_lines_parse_per_process_with_both_value_spellings() -> None:
    parsed = parse_nccl_env_lines(GOOD_RUN)
    assert set(parsed) == {(None, 641), (None, 642)}
    assert parsed[(None, 642)]["device"] == 1
    # integer parameters end with a period ("to 0."), string ones do not ("to Ring")
    assert parsed[(None, 641)]["values"] == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0",
                                     "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}


def test_every_rank_reporting_the_trials_values_passes_and_names_the_ranks() -> None:
    check = check_nccl_log(GOOD_RUN, TRIAL_ENV, tp_size=2, processes=AUDIT)
    assert check.status == "ok", check.summary()
    assert [(r["pid"], r["name"], r["reported"]["NCCL_ALGO"]) for r in check.ranks] == [
        (641, "ref::tp0", "Ring"), (642, "ref::tp1", "Ring")]
    assert "NCCL_DEBUG" not in check.expected  # NCCL does not echo its own logging settings


def test_workers_spawned_before_the_variables_were_set_fail_per_rank() -> None:
    """The seed's bug as NCCL tells it: the workers' NCCL never read NCCL_ALGO / NCCL_PROTO."""
    check = check_nccl_log(LATE_ENV_RUN, TRIAL_ENV, tp_size=2)
    assert check.status == "failed" and not check.ok
    assert len(check.problems) == 4
    assert any(p.startswith("pid 784: NCCL reported nothing for NCCL_ALGO") for p in check.problems)
    assert any(p.startswith("pid 785: NCCL reported nothing for NCCL_PROTO") for p in check.problems)


def test_a_rank_that_read_another_value_fails_naming_both() -> None:
    log = GOOD_RUN.replace("vm:642:642 [1] NCCL INFO NCCL_ALGO set by environment to Ring",
                           "vm:642:642 [1] NCCL INFO NCCL_ALGO set by environment to Tree")
    check = check_nccl_log(log, TRIAL_ENV, tp_size=2, processes=AUDIT)
    assert check.problems == ["pid 642 (tp_worker, ref::tp1): NCCL read NCCL_ALGO=Tree, the trial set Ring"]


def test_a_missing_rank_fails() -> None:
    one_rank = "\n".join(line for line in GOOD_RUN.splitlines() if not line.startswith("vm:642:"))
    check = check_nccl_log(one_rank, TRIAL_ENV, tp_size=2)
    assert check.status == "failed" and "NCCL lines from 1 of 2 ranks" in check.problems[-1]


def test_a_variable_read_only_on_some_path_is_unconfirmed_not_failed() -> None:
    check = check_nccl_log(GOOD_RUN, {**TRIAL_ENV, "NCCL_IB_HCA": "mlx5_0"}, tp_size=2)
    assert check.status == "ok" and check.unconfirmed == ["NCCL_IB_HCA"]
    # ... unless another rank reported it: then ranks disagree
    log = GOOD_RUN + "\nvm:641:641 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0"
    check = check_nccl_log(log, {**TRIAL_ENV, "NCCL_IB_HCA": "mlx5_0"}, tp_size=2)
    assert check.problems == ["pid 642: NCCL reported nothing for NCCL_IB_HCA (other ranks report it): "
                              "the variable did not reach it"]


def test_not_applicable_without_info_logging_one_rank_or_nccl() -> None:
    assert not nccl_debug_enabled({"NCCL_DEBUG": "WARN"}) and nccl_debug_enabled({"NCCL_DEBUG": "info"})
    assert check_nccl_log(GOOD_RUN, {**TRIAL_ENV, "NCCL_DEBUG": "WARN"}, tp_size=2).status == "not_applicable"
    assert check_nccl_log(GOOD_RUN, TRIAL_ENV, tp_size=1).status == "not_applicable"
    gloo = "\n".join(EXCERPT[:2])  # worker start-up lines only: a CPU engine all-reduces over gloo
    check = check_nccl_log(gloo, TRIAL_ENV, tp_size=2)
    assert check.status == "not_applicable" and check.ok and "gloo" in check.reason


def test_across_nodes_a_process_is_its_node_and_pid_even_where_two_nodes_share_a_pid() -> None:
    # two pods each give their ranks pids 641/642: the node headers of the group's log tell them apart
    node1 = GOOD_RUN.replace("NCCL_ALGO set by environment to Ring", "NCCL_ALGO set by environment to Tree")
    log = f"===== node rank 0 (10.0.0.1, node aa) =====\n{GOOD_RUN}\n===== node rank 1 (10.0.0.2, node bb) =====\n{node1}"
    audit = [{**p, "node_rank": r} for r in (0, 1) for p in AUDIT]
    check = check_nccl_log(log, TRIAL_ENV, tp_size=4, processes=audit)
    assert [(r["node_rank"], r["pid"], r["name"]) for r in check.ranks] == [
        (0, 641, "ref::tp0"), (0, 642, "ref::tp1"), (1, 641, "ref::tp0"), (1, 642, "ref::tp1")]
    assert check.status == "failed" and check.problems == [
        "node rank 1 pid 641 (tp_worker, ref::tp0): NCCL read NCCL_ALGO=Tree, the trial set Ring",
        "node rank 1 pid 642 (tp_worker, ref::tp1): NCCL read NCCL_ALGO=Tree, the trial set Ring"]
    assert check_nccl_log(f"===== node rank 0 (a) =====\n{GOOD_RUN}\n===== node rank 1 (b) =====\n{GOOD_RUN}",
                          TRIAL_ENV, tp_size=4, processes=audit).status == "ok"


def test_a_rank_that_fell_back_to_sockets_with_an_hca_set_fails_naming_it() -> None:
    # NCCL 2.30's init line (init.cc: INFO(NCCL_INIT, "Using network %s")): IB on one rank, Socket on the other
    env = {**TRIAL_ENV, "NCCL_IB_HCA": "=mlx5_0"}
    lines = GOOD_RUN.splitlines()
    log = "\n".join([*lines, "vm:641:641 [0] NCCL INFO Using network IB", "vm:642:642 [1] NCCL INFO Using network Socket"])
    check = check_nccl_log(log, env, tp_size=2, processes=AUDIT)
    assert [r["network"] for r in check.ranks] == ["IB", "Socket"]
    assert check.status == "failed" and check.problems == [
        "pid 642 (tp_worker, ref::tp1): NCCL_IB_HCA='=mlx5_0' is set, but NCCL uses network Socket: no active HCA port "
        "matched there (its 'NET/IB : No device found.' line), so every inter-node all-reduce went over TCP sockets"]
    assert "network IB on 1, Socket on 1" in check.summary()
    assert check_nccl_log(log, TRIAL_ENV, tp_size=2, processes=AUDIT).status == "ok", "sockets are fine unless IB was asked"
