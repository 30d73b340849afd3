"""The NCCL variable table: documented values pass, others are named, dangerous ones flagged."""

from __future__ import annotations

import pytest

from serving.engine.nccl import check_value, danger_of, normalise_value


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_ALGO", "Ring"),
        ("NCCL_ALGO", "ring,tree"),
        ("NCCL_ALGO", "^NVLS"),
        ("NCCL_PROTO", "Simple"),
        ("NCCL_BUFFSIZE", "4194304"),
        ("NCCL_P2P_LEVEL", "nvl"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("MY_OWN_VARIABLE", "anything"),  # not NCCL's: not ours to judge
    ],
)
def test_documented_values_pass(name: str, value: str) -> None:
    assert check_value(name, value) is None


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("NCCL_ALGO", "Rnig", "unknown token"),
        ("NCCL_ALGO", "", "unknown token"),
        ("NCCL_ALGO", "allreduce:ring", "per-collective"),
        ("NCCL_PROTO", "LL256", "unknown token"),
        ("NCCL_BUFFSIZE", "4MB", "not an integer"),
        ("NCCL_BUFFSIZE", "1024", "outside"),
        ("NCCL_NTHREADS", "100", "not one of 64, 128, 256, 512"),
        ("NCCL_DEBUG", "LOUD", "VERSION, WARN, INFO, TRACE"),
        ("NCCL_ALOG", "Ring", "unknown NCCL variable"),
        ("NCCL_CUMEM_ENABLE", "0", "--enable-symm-mem"),
        ("NCCL_NVLS_ENABLE", "0", "--enable-nccl-nvls"),
        ("CUDA_VISIBLE_DEVICES", "0", "Ray assigns"),
    ],
)
def test_undocumented_values_are_named(name: str, value: str, words: str) -> None:
    problem = check_value(name, value)
    assert problem is not None and words in problem


@pytest.mark.parametrize(
    ("name", "value", "dangerous"),
    [
        ("NCCL_PROTO", "LL128", True),
        ("NCCL_PROTO", "LL,LL128", True),
        ("NCCL_PROTO", "^LL128", False),  # excluding it is the safe direction
        ("NCCL_PROTO", "^LL,Simple", True),  # ...but excluding the others forces it
        ("NCCL_ALGO", "^Ring,Tree,CollnetDirect,CollnetChain,PAT,NVLSTree", True),
        ("NCCL_ALGO", "^NVLS,NVLSTree", False),
        ("NCCL_PROTO", "Simple", False),
        ("NCCL_ALGO", "NVLSTree", True),
        ("NCCL_ALGO", "Ring", False),
        ("NCCL_BUFFSIZE", "4194304", False),  # NCCL's default
        ("NCCL_BUFFSIZE", "8388608", True),
        ("NCCL_DEBUG", "INFO", False),
    ],
)
def test_danger(name: str, value: str, dangerous: bool) -> None:
    assert bool(danger_of(name, normalise_value(name, value))) is dangerous


def test_normalise_value() -> None:
    assert normalise_value("NCCL_ALGO", " ring, TREE ") == "Ring,Tree"
    assert normalise_value("NCCL_PROTO", "^ll128") == "^LL128"
    assert normalise_value("NCCL_DEBUG", "info") == "INFO"
    assert normalise_value("NCCL_BUFFSIZE", " 4194304 ") == "4194304"
