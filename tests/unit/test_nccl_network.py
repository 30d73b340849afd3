"""NCCL's network variables: parsed as NCCL parses them, judged against a node's interfaces, HCA
ports and GIDs (a laid-out /sys tree stands for the node), and guarded in the spec (fabric
settings not searched, network settings not searched on one node, NCCL's socket limit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.spec import SweepSpec
from serving.engine import nccl
from serving.engine.nccl_network import node_problems, parse_interface_list, read_node_network

REPO = Path(__file__).resolve().parents[2]


def _node(root: Path, *, interfaces: tuple[str, ...] = ("eth0", "lo"),
          ports: dict[str, dict[int, dict[str, Any]]] | None = None) -> Path:
    """A node's /sys: ``interfaces`` (each with an address), and HCA ports with their state,
    link layer and GID table (``{index: gid}``)."""
    for name in interfaces:
        (root / "sys/class/net" / name).mkdir(parents=True)
    for hca, port_map in (ports or {}).items():
        for port, info in port_map.items():
            where = root / "sys/class/infiniband" / hca / "ports" / str(port)
            (where / "gids").mkdir(parents=True)
            (where / "state").write_text("4: ACTIVE\n" if info.get("active", True) else "1: DOWN\n")
            (where / "link_layer").write_text(info.get("link_layer", "InfiniBand") + "\n")
            for index, gid in info.get("gids", {0: "fe80:0000:0000:0000:0000:0000:0000:0001"}).items():
                (where / "gids" / str(index)).write_text(gid + "\n")
    return root


@pytest.mark.parametrize(
    ("value", "name", "port", "used"),
    [
        ("eth", "eth0", None, True),  # a prefix
        ("eth", "eth10", None, True),
        ("=eth0", "eth0", None, True),  # exact
        ("=eth0", "eth01", None, False),
        ("^docker,lo", "docker0", None, False),  # excluded by prefix
        ("^docker,lo", "eth0", None, True),
        ("^=lo", "lo0", None, True),  # excluded only exactly
        ("mlx5_1", "mlx5_10", 1, True),  # NCCL's documented surprise
        ("=mlx5_0:1", "mlx5_0", 1, True),
        ("=mlx5_0:1", "mlx5_0", 2, False),
    ],
)
def test_lists_match_as_nccl_does(value: str, name: str, port: int | None, used: bool) -> None:
    variable = "NCCL_IB_HCA" if "mlx" in value else "NCCL_SOCKET_IFNAME"
    assert parse_interface_list(variable, value).matches(name, port) is used


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("NCCL_SOCKET_IFNAME", "e", "one character"),
        ("NCCL_SOCKET_IFNAME", "eth0:1", "a port only means something for NCCL_IB_HCA"),
        ("NCCL_SOCKET_IFNAME", "=^eth0", "'^' and '=' only lead the whole list"),
        ("NCCL_IB_HCA", "mlx5_0:x", "the port must be a number"),
        ("NCCL_SOCKET_IFNAME", ",".join(f"eth{i}" for i in range(17)), "at most 16"),
        ("NCCL_IB_GID_INDEX", "-2", "outside"),
        ("NCCL_IB_QPS_PER_CONNECTION", "129", "outside"),
        ("NCCL_NET", "RDMA", "not one of IB, Socket"),
        ("NCCL_NET_GDR_LEVEL", "FAR", "not one of"),
    ],
)
def test_malformed_network_values_are_refused_with_the_form(name: str, value: str, words: str) -> None:
    problem = nccl.check_value(name, value)
    assert problem is not None and words in problem, problem


def test_gdr_level_is_spelled_as_nccl_compares_it() -> None:
    assert nccl.normalise_value("NCCL_NET_GDR_LEVEL", "pxb") == "PXB"  # NCCL compares it case-sensitively


def test_fabric_settings_are_not_for_the_search_and_say_where_they_go() -> None:
    assert nccl.not_searchable("NCCL_IB_QPS_PER_CONNECTION") is None
    for name in ("NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_IB_TIMEOUT", "NCCL_NET", "NCCL_IB_DISABLE"):
        assert "engine.env" in (nccl.not_searchable(name) or ""), name
    assert set(nccl.NODE_CHECKED_VARIABLES) == {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"}


def test_a_node_is_read_from_its_sys_tree(tmp_path: Path) -> None:
    root = _node(tmp_path, ports={"mlx5_0": {1: {}}, "mlx5_1": {1: {"active": False, "link_layer": "Ethernet"}}})
    network = read_node_network(root)
    assert network.interfaces == ("eth0", "lo")
    assert [(hca, port) for hca, port, _ in network.active_ports()] == [("mlx5_0", 1)]


def test_values_that_name_nothing_on_the_node_are_found_with_why(tmp_path: Path) -> None:
    root = _node(tmp_path, ports={
        "mlx5_0": {1: {"link_layer": "Ethernet", "gids": {0: "fe80::1", 3: "0000:0000:0000:0000:0000:ffff:0a00:0001",
                                                           4: "0000:0000:0000:0000:0000:0000:0000:0000"}}},
        "mlx5_1": {1: {"active": False}}})
    settings = [
        ("search.nccl_env.NCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "eth"),
        ("search.nccl_env.NCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "ib0"),
        ("engine.env.NCCL_IB_HCA", "NCCL_IB_HCA", "=mlx5_1"),  # there, but its port is down
        ("search.nccl_env.NCCL_IB_HCA", "NCCL_IB_HCA", "mlx5"),
        ("engine.env.NCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX", "4"),  # an all-zero GID: no GID
        ("engine.env.NCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX", "3"),
    ]
    found = node_problems(settings, root=root)
    assert [(field, value) for field, _, value, _ in found["problems"]] == [
        ("search.nccl_env.NCCL_SOCKET_IFNAME", "ib0"), ("engine.env.NCCL_IB_HCA", "=mlx5_1"),
        ("engine.env.NCCL_IB_GID_INDEX", "4")]
    why = {value: text for _, _, value, text in found["problems"]}
    assert "bootstrap" in why["ib0"] and "TCP sockets" in why["=mlx5_1"] and "mlx5_0:1" in why["4"]
    assert "interfaces eth0, lo" in found["network"] and "mlx5_1:1 (IB, not active)" in found["network"]


def test_a_node_without_infiniband_takes_no_hca(tmp_path: Path) -> None:
    found = node_problems([("engine.env.NCCL_IB_HCA", "NCCL_IB_HCA", "^mlx5_1")], root=_node(tmp_path))
    assert len(found["problems"]) == 1 and "HCA ports (none" in found["network"]


def test_the_gid_is_judged_on_the_ports_the_fixed_hca_selects(tmp_path: Path) -> None:
    roce = {"link_layer": "Ethernet", "gids": {3: "0000:0000:0000:0000:0000:ffff:0a00:0001"}}
    root = _node(tmp_path, ports={"mlx5_0": {1: roce}, "mlx5_1": {1: {"link_layer": "Ethernet"}}})
    setting = [("engine.env.NCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX", "3")]
    assert node_problems(setting, root=root)["problems"], "mlx5_1 has no GID 3"
    assert not node_problems(setting, env={"NCCL_IB_HCA": "=mlx5_0"}, root=root)["problems"]
    assert not node_problems([("engine.env.NCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX", "-1")], root=root)["problems"]


# --- the spec's guards ------------------------------------------------------------------------------


def _spec(engine: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load((REPO / "experiments" / "reference-cpu.yaml").read_text())
    data["engine"].update(engine)
    data["search"].pop("nccl_env", None)
    data["search"].update(search)
    return data


def _problem(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        SweepSpec.model_validate(data)
    return str(caught.value)


def test_network_variables_are_searched_on_an_engine_across_nodes() -> None:
    spec = SweepSpec.model_validate(_spec({"tp_size": 2, "nnodes": 2}, {"nccl_env": {
        "NCCL_SOCKET_IFNAME": [None, "lo"], "NCCL_IB_QPS_PER_CONNECTION": [None, 4],
        "NCCL_NET_GDR_LEVEL": ["default", "pxb"]}}))
    assert spec.search.nccl_env["NCCL_NET_GDR_LEVEL"] == [None, "PXB"]


def test_network_variables_are_not_searched_on_one_node() -> None:
    problem = _problem(_spec({"tp_size": 2}, {"nccl_env": {"NCCL_IB_QPS_PER_CONNECTION": [None, 4]}}))
    assert "search.nccl_env.NCCL_IB_QPS_PER_CONNECTION" in problem and "engine.nnodes > 1" in problem


def test_fabric_settings_are_refused_in_the_search_and_taken_in_engine_env() -> None:
    problem = _problem(_spec({"tp_size": 2, "nnodes": 2}, {"nccl_env": {"NCCL_IB_GID_INDEX": [None, 3]}}))
    assert "search.nccl_env.NCCL_IB_GID_INDEX" in problem and "set it once in engine.env" in problem
    SweepSpec.model_validate(_spec({"tp_size": 2, "nnodes": 2, "env": {"NCCL_IB_GID_INDEX": 3, "NCCL_IB_TC": 106}}, {}))


@pytest.mark.parametrize(
    ("env", "search", "field"),
    [
        ({}, {"nccl_env": {"NCCL_SOCKET_NTHREADS": [None, 8], "NCCL_NSOCKS_PERTHREAD": [None, 16]}},
         "search.nccl_env.NCCL_NSOCKS_PERTHREAD"),
        ({"NCCL_SOCKET_NTHREADS": 16}, {"nccl_env": {"NCCL_NSOCKS_PERTHREAD": [None, 8]}},
         "search.nccl_env.NCCL_NSOCKS_PERTHREAD"),
        ({}, {"nccl_presets": [{}, {"NCCL_SOCKET_NTHREADS": 4, "NCCL_NSOCKS_PERTHREAD": 32}]},
         "search.nccl_presets.1.NCCL_NSOCKS_PERTHREAD"),
    ],
)
def test_more_sockets_than_nccl_opens_are_refused(env: dict, search: dict, field: str) -> None:
    problem = _problem(_spec({"tp_size": 2, "nnodes": 2, "env": env}, search))
    assert f"{field}: NCCL_SOCKET_NTHREADS=" in problem and "limit of 64" in problem, problem


def test_sockets_within_nccl_limit_pass() -> None:
    SweepSpec.model_validate(_spec({"tp_size": 2, "nnodes": 2}, {"nccl_env": {
        "NCCL_SOCKET_NTHREADS": [None, 4], "NCCL_NSOCKS_PERTHREAD": [None, 16]}}))


def test_what_the_node_itself_sets_is_judged_unless_the_engine_sets_it(tmp_path: Path) -> None:
    root = _node(tmp_path)
    pod = {"NCCL_SOCKET_IFNAME": "=net1"}  # a pod's env (ray start inherited it)
    found = node_problems([], inherited=["NCCL_SOCKET_IFNAME"], root=root, environ=pod)
    assert [(field.startswith("the node's own environment"), value) for field, _, value, _ in found["problems"]] == [
        (True, "=net1")]
    assert not node_problems([], env={"NCCL_SOCKET_IFNAME": "eth0"}, inherited=["NCCL_SOCKET_IFNAME"], root=root,
                             environ=pod)["problems"], "the engine's own value replaces the node's"
