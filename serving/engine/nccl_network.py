"""NCCL's network variables against one node: does the value name something that exists there?

``parse_interface_list`` reads ``NCCL_SOCKET_IFNAME`` / ``NCCL_IB_HCA`` as NCCL's ``matchIfList``
(``misc/utils.cc``) does. ``node_problems`` runs on a node and names each value that matches no
interface with an address, no ACTIVE HCA port, or (``NCCL_IB_GID_INDEX``) no GID there. It reads
``/sys/class/net``, the addresses ``psutil`` reports and ``/sys/class/infiniband`` (under ``root``).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional

__all__ = [
    "INHERITED_FIELD",
    "InterfaceList",
    "NodeNetwork",
    "PortInfo",
    "describe_node_network",
    "node_problems",
    "parse_interface_list",
    "read_node_network",
]

MAX_ENTRIES = {"NCCL_SOCKET_IFNAME": 16, "NCCL_IB_HCA": 32}
"""NCCL's own limits on the number of entries (``MAX_IFS``, ``MAX_IB_DEVS``)."""

_ENTRY = re.compile(r"^[A-Za-z0-9_.@-]+$")


@dataclass(frozen=True)
class InterfaceList:
    """One parsed ``NCCL_SOCKET_IFNAME`` / ``NCCL_IB_HCA`` value.

    Attributes:
        exclude: ``^``: the entries say what NOT to use.
        exact: ``=``: entries are whole names, not prefixes.
        entries: ``(name, port)`` pairs; port None matches every port.
    """

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, Optional[int]], ...]

    def matches(self, name: str, port: Optional[int] = None) -> bool:
        """Whether NCCL would use ``name`` (``port``) under this value."""
        hit = any((name == entry if self.exact else name.startswith(entry))
                  and (want is None or port is None or want == port) for entry, want in self.entries)
        return hit != self.exclude


def parse_interface_list(name: str, value: str) -> InterfaceList:
    """Parse ``value`` as NCCL does, refusing what NCCL would ignore or misread.

    Raises:
        ValueError: what is wrong and the form NCCL takes.
    """
    text = value.strip()
    form = ("a comma-separated list of name prefixes, '=' first for exact names, '^' first to exclude"
            + (", each optionally ':port'" if name == "NCCL_IB_HCA" else ""))
    if len(text) <= 1:
        raise ValueError(f"{name}={value!r}: NCCL ignores a value of one character or none and picks by itself; "
                         f"give {form} (e.g. {'=mlx5_0:1,mlx5_1:1' if name == 'NCCL_IB_HCA' else 'eth0 or ^docker,lo'})")
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries: list[tuple[str, Optional[int]]] = []
    for item in text.split(","):
        entry, _, rest = item.strip().partition(":")
        port: Optional[int] = None
        if rest:
            if name != "NCCL_IB_HCA":
                raise ValueError(f"{name}={value!r}: {item.strip()!r}: a port only means something for NCCL_IB_HCA; "
                                 f"give {form}")
            port_text = rest.split(":")[0]  # <hca>:<port>[:<rail>[:<plane>]]: NCCL 2.30 matches the port
            if not port_text.isdigit():
                raise ValueError(f"{name}={value!r}: {item.strip()!r}: the port must be a number; give {form}")
            port = int(port_text)
        if not _ENTRY.match(entry):
            raise ValueError(f"{name}={value!r}: {item.strip()!r} is not an interface name ('^' and '=' only "
                             f"lead the whole list, '^=' in that order); give {form}")
        entries.append((entry, port))
    limit = MAX_ENTRIES.get(name)
    if limit is not None and len(entries) > limit:
        raise ValueError(f"{name}={value!r}: {len(entries)} entries; NCCL reads at most {limit}")
    return InterfaceList(exclude, exact, tuple(entries))


@dataclass(frozen=True)
class PortInfo:
    """One HCA port as NCCL sees it: ``state`` ACTIVE to be used, ``link_layer`` InfiniBand or
    Ethernet (RoCE), and the GID indices that hold a GID (not all zeros)."""

    active: bool
    link_layer: str
    gids: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeNetwork:
    """What one node offers NCCL: interfaces with an address, and HCAs with their ports."""

    hostname: str
    interfaces: tuple[str, ...]
    hcas: Mapping[str, Mapping[int, PortInfo]] = field(default_factory=dict)

    def active_ports(self) -> list[tuple[str, int, PortInfo]]:
        return [(hca, port, info) for hca, ports in sorted(self.hcas.items())
                for port, info in sorted(ports.items()) if info.active]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _interfaces_with_address(root: Path) -> tuple[str, ...]:
    """Interfaces with an IPv4/IPv6 address (what NCCL's ``findInterfaces`` considers)."""
    if root == Path("/"):
        import psutil

        return tuple(sorted(name for name, addresses in psutil.net_if_addrs().items()
                            if any(a.family in (socket.AF_INET, socket.AF_INET6) for a in addresses)))
    listed = root / "sys/class/net"  # a test's tree: an interface is there with an address
    return tuple(sorted(p.name for p in listed.iterdir())) if listed.is_dir() else ()


def read_node_network(root: str | Path = "/") -> NodeNetwork:
    """The interfaces and HCA ports of the node this runs on (``root``: a test's stand-in tree)."""
    root = Path(root)
    hcas: dict[str, dict[int, PortInfo]] = {}
    ib = root / "sys/class/infiniband"
    for hca in sorted(ib.iterdir()) if ib.is_dir() else ():
        ports: dict[int, PortInfo] = {}
        for port_dir in sorted((hca / "ports").iterdir()) if (hca / "ports").is_dir() else ():
            if not port_dir.name.isdigit():
                continue
            gid_dir = port_dir / "gids"
            gids = tuple(sorted(int(g.name) for g in gid_dir.iterdir() if g.name.isdigit()
                                and _read(g).replace(":", "").strip("0"))) if gid_dir.is_dir() else ()
            ports[int(port_dir.name)] = PortInfo(active="ACTIVE" in _read(port_dir / "state").upper(),
                                                 link_layer=_read(port_dir / "link_layer") or "InfiniBand", gids=gids)
        hcas[hca.name] = ports
    return NodeNetwork(socket.gethostname(), _interfaces_with_address(root), hcas)


def describe_node_network(network: NodeNetwork) -> str:
    """``interfaces eth0, lo; HCA ports mlx5_0:1 (IB), mlx5_1:1 (RoCE, down)`` (for messages)."""
    ports = [f"{hca}:{port} ({'RoCE' if info.link_layer.lower() == 'ethernet' else 'IB'}"
             f"{'' if info.active else ', not active'})"
             for hca, port_map in sorted(network.hcas.items()) for port, info in sorted(port_map.items())]
    return (f"interfaces {', '.join(network.interfaces) or '(none with an address)'}; "
            f"HCA ports {', '.join(ports) or '(none: no /sys/class/infiniband)'}")


def _value_problem(name: str, value: str, network: NodeNetwork,
                   env: Mapping[str, str]) -> Optional[str]:
    if name == "NCCL_SOCKET_IFNAME":
        chosen = parse_interface_list(name, value)
        if not any(chosen.matches(iface) for iface in network.interfaces):
            return ("matches no interface with an address there; NCCL's bootstrap would fail once the engine's "
                    "ranks start (\"Bootstrap : no socket interface found\")")
        return None
    if name == "NCCL_IB_HCA":
        chosen = parse_interface_list(name, value)
        if not any(chosen.matches(hca, port) for hca, port, _ in network.active_ports()):
            return ("matches no active InfiniBand/RoCE port there; NCCL would log \"NET/IB : No device found.\" "
                    "and carry every inter-node all-reduce over TCP sockets without an error")
        return None
    if name == "NCCL_IB_GID_INDEX":
        index = int(value)
        if index < 0:
            return None
        hca_value = env.get("NCCL_IB_HCA")
        chosen = parse_interface_list("NCCL_IB_HCA", hca_value) if hca_value else None
        roce = [(hca, port, info) for hca, port, info in network.active_ports()
                if info.link_layer.lower() == "ethernet" and (chosen is None or chosen.matches(hca, port))]
        missing = [f"{hca}:{port}" for hca, port, info in roce if index not in info.gids]
        if missing:
            return (f"names no GID on the RoCE port(s) {', '.join(missing)} there; their connections would fail "
                    "or hang (set it to an index listed under /sys/class/infiniband/<hca>/ports/<port>/gids, or -1)")
        return None
    return None


INHERITED_FIELD = "the node's own environment (set before `ray start`, inherited by every engine there)"
"""The field a problem names when the value came from the node's environment, not the spec."""


def node_problems(settings: Iterable[tuple[str, str, str]], *, env: Mapping[str, str] | None = None,
                  inherited: Iterable[str] = (), root: str | Path = "/",
                  environ: Mapping[str, str] | None = None) -> dict:
    """Run on a node: every ``(field, variable, value)`` that cannot work there.

    Args:
        settings: The node-checked values a trial may set (fixed and searched), each with the spec
            field that holds it.
        env: The engine's fixed environment (its ``NCCL_IB_HCA`` selects the ports a searched
            ``NCCL_IB_GID_INDEX`` is judged on).
        inherited: Variables to judge in this process's own environment too, where ``env`` does
            not set them (a value given to ``ray start`` reaches every engine on the node).
        root: The filesystem root to read (a test's tree).
        environ: This process's environment (default ``os.environ``).

    Returns:
        ``{"hostname", "network": describe_node_network(...), "problems": [(field, variable, value, why)]}``.
    """
    import os

    network = read_node_network(root)
    environ = os.environ if environ is None else environ
    fixed = env or {}
    settings = [*settings, *((INHERITED_FIELD, name, environ[name]) for name in inherited
                             if environ.get(name) and name not in fixed)]
    problems = []
    for where, name, value in settings:
        why = _value_problem(name, value, network, {**{n: environ[n] for n in inherited if n in environ}, **fixed})
        if why:
            problems.append((where, name, value, why))
    return {"hostname": network.hostname, "network": describe_node_network(network), "problems": problems}
