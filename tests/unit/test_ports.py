"""serving.ports.free_port: a port handed out is reserved on this machine, so two engines started at
once (two trials on one node, two nodes of a test cluster on one host) never get the same one."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from serving.ports import RESERVE_S, _reserve, free_port


def test_a_reservation_is_held_until_it_is_stale(tmp_path: Path) -> None:
    path = tmp_path / "40123"
    assert _reserve(path) and not _reserve(path), "a held reservation is refused"
    old = time.time() - RESERVE_S - 1
    os.utime(path, (old, old))
    assert _reserve(path), "a stale one is taken over"
    assert not _reserve(path)


def test_callers_at_once_never_share_a_port_and_each_port_binds(tmp_path: Path) -> None:
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        ports = [free_port(reserve_dir=tmp_path) for _ in range(25)]
        with lock:
            got.extend(ports)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == 200 and len(set(got)) == 200, "no port handed out twice while reserved"
    assert {int(p.name) for p in tmp_path.iterdir()} == set(got)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", got[-1]))  # what it hands out was free


def test_a_port_reserved_elsewhere_is_skipped(tmp_path: Path, monkeypatch) -> None:
    """The bind says free, but another process holds the reservation: the next free port is given."""
    import serving.ports as ports

    offered = iter([41001, 41002])
    monkeypatch.setattr(ports, "_bound_port", lambda host: next(offered))
    (tmp_path / "41001").touch()
    assert free_port(reserve_dir=tmp_path) == 41002
