"""NCCL's own word on what it read: the "NCCL_X set by environment to V" lines, per process.

With ``NCCL_DEBUG=INFO`` every process that initialises a communicator logs one line per set NCCL
variable it reads, prefixed by host, pid, thread and CUDA device::

    vm:642:642 [1] NCCL INFO NCCL_CUMEM_ENABLE set by environment to 0.

``check_nccl_log`` compares those lines with what the trial set. A process is keyed by node rank
(from the ``===== node rank R`` headers of ``serving.engine.group``) and pid. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = [
    "NOT_ECHOED",
    "READ_AT_INIT",
    "NcclLogCheck",
    "check_nccl_log",
    "nccl_debug_enabled",
    "parse_nccl_env_lines",
]

_NCCL_LINE = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?:INFO|WARN) (?P<rest>.*)$")
"""Any line NCCL logs: the process logging it has initialised NCCL."""
_SET_BY_ENV = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?\s*$")
_USING_NETWORK = re.compile(r"^Using network (?P<network>\S+)")
"""NCCL's init line naming the network plugin a communicator uses (``Using network IB`` / ``Socket``)."""
_NODE_HEADER = re.compile(r"^===== node rank (?P<node>\d+)\b")
"""The line ``serving.engine.group.EngineGroup.log_text`` puts before each node's log."""

ProcessKey = tuple[Any, int]
"""``(node rank, pid)``; the node rank is None in one node's log (no headers)."""

READ_AT_INIT = frozenset({"NCCL_ALGO", "NCCL_PROTO", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"})
"""Variables every rank's NCCL reads (and, when set, logs) at communicator start: a rank that does
not report one of them did not have it."""

NOT_ECHOED = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
"""NCCL's own logging settings: read before logging starts, never logged as "set by environment"."""


def nccl_debug_enabled(env: Mapping[str, str | None]) -> bool:
    """Whether ``env`` makes NCCL log its INFO lines (INFO or TRACE; NCCL reads it case-insensitively)."""
    return (env.get("NCCL_DEBUG") or "").strip().upper() in ("INFO", "TRACE")


def parse_nccl_env_lines(log_text: str) -> dict[ProcessKey, dict[str, Any]]:
    """``(node rank, pid)`` -> ``{"device", "values": {variable: value}, "network"}`` for every process
    that logged NCCL lines (``network``: the plugin its "Using network" line names, or None).

    A variable logged twice by one process (one line per communicator) keeps the last value."""
    out: dict[ProcessKey, dict[str, Any]] = {}
    node = None
    for line in log_text.splitlines():
        header = _NODE_HEADER.match(line)
        if header is not None:
            node = int(header["node"])
            continue
        match = _NCCL_LINE.match(line.strip())
        if match is None:
            continue
        entry = out.setdefault((node, int(match["pid"])), {"device": int(match["dev"]), "values": {}, "network": None})
        setting = _SET_BY_ENV.match(match["rest"])
        if setting is not None:
            entry["values"][setting["name"]] = setting["value"]
        network = _USING_NETWORK.match(match["rest"])
        if network is not None:
            entry["network"] = network["network"]
    return out


def _wants_ib(expected: Mapping[str, str]) -> str | None:
    """The setting that asks for InfiniBand/RoCE (``NCCL_IB_HCA``, or ``NCCL_NET=IB``), if any."""
    if expected.get("NCCL_IB_HCA"):
        return f"NCCL_IB_HCA={expected['NCCL_IB_HCA']!r}"
    if (expected.get("NCCL_NET") or "").upper() == "IB":
        return "NCCL_NET=IB"
    return None


@dataclass(frozen=True)
class NcclLogCheck:
    """The verdict of NCCL's own lines against what the trial set.

    Attributes:
        status: ``ok``, ``failed`` or ``not_applicable`` (NCCL_DEBUG is not INFO, or no process
            logged NCCL lines: a CPU engine on gloo, or one rank).
        expected: The NCCL variables checked, with the trial's values.
        ranks: Per NCCL process: pid (and node rank across nodes), CUDA device, role/name from the
            env audit where known, the network plugin its "Using network" line names (None: no
            such line), and what NCCL reported for each expected variable (None: nothing).
        problems: One line per disagreement, naming pid, variable, what NCCL said and what was set.
        unconfirmed: Expected variables no process reported (read on a code path not taken).
        reason: Why the check does not apply (``not_applicable`` only).
    """

    status: str
    expected: dict[str, str]
    ranks: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def ok(self) -> bool:
        """False only for a failed check: not applicable is not a failure."""
        return self.status != "failed"

    def summary(self) -> str:
        """One line for the log, then one per problem."""
        if self.status == "not_applicable":
            return f"NCCL log check not applicable: {self.reason}"
        names = ", ".join(f"{k}={v}" for k, v in sorted(self.expected.items())) or "no NCCL variables"
        head = f"NCCL log check {'passed' if self.status == 'ok' else 'FAILED'}: {len(self.ranks)} NCCL processes, {names}"
        networks = sorted({r["network"] for r in self.ranks if r.get("network")})
        if networks:
            head += "; network " + ", ".join(
                f"{n} on {sum(r.get('network') == n for r in self.ranks)}" for n in networks)
        if self.unconfirmed:
            head += f" (not reported by NCCL, so unconfirmed: {', '.join(self.unconfirmed)})"
        return "\n".join([head, *(f"  {p}" for p in self.problems)])

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "ok": self.ok, "summary": self.summary(), "expected": dict(self.expected),
                "ranks": list(self.ranks), "problems": list(self.problems), "unconfirmed": list(self.unconfirmed),
                "reason": self.reason}


def check_nccl_log(
    log_text: str,
    expected_env: Mapping[str, str | None],
    *,
    tp_size: int,
    processes: Iterable[Mapping[str, Any]] = (),
) -> NcclLogCheck:
    """Compare NCCL's "set by environment" lines of every NCCL process with ``expected_env``.

    Args:
        log_text: The engine log (every process's stderr goes there).
        expected_env: What the trial set (the engine config's env plus the searched NCCL
            variables); None values (unset) are not checked.
        tp_size: Ranks that must have logged NCCL lines.
        processes: The env audit's process records (``pid``, ``role``, ``name``), to name ranks.
    """
    expected = {k: v for k, v in expected_env.items() if k.startswith("NCCL_") and v is not None and k not in NOT_ECHOED}
    if not nccl_debug_enabled(expected_env):
        return NcclLogCheck("not_applicable", expected, reason="NCCL_DEBUG is not INFO, so NCCL logs nothing to check")
    if tp_size < 2:
        return NcclLogCheck("not_applicable", expected, reason="one rank: no communicator, NCCL reads nothing")
    reported = parse_nccl_env_lines(log_text)
    keys = sorted(reported, key=lambda k: (-1 if k[0] is None else k[0], k[1]))
    if not keys:
        return NcclLogCheck("not_applicable", expected,
                            reason="no NCCL lines in the engine log (a CPU engine all-reduces over gloo)")
    known = {(p.get("node_rank"), int(p["pid"])): p for p in processes if "pid" in p}

    def where(key: ProcessKey) -> str:
        return ("" if key[0] is None else f"node rank {key[0]} ") + f"pid {key[1]}"

    ranks, problems = [], []
    for key in keys:
        values = reported[key]["values"]
        who = known.get(key, {})
        label = where(key) + (f" ({who.get('role')}, {who.get('name')})" if who else "")
        network = reported[key]["network"]
        ranks.append({"pid": key[1], **({} if key[0] is None else {"node_rank": key[0]}),
                      "device": reported[key]["device"], "role": who.get("role"), "name": who.get("name"),
                      "network": network, "reported": {k: values.get(k) for k in sorted(expected)}})
        for name, want in sorted(expected.items()):
            got = values.get(name)
            if got is not None and got.lower() != want.lower():
                problems.append(f"{label}: NCCL read {name}={got}, the trial set {want}")
        ib = _wants_ib(expected)
        if ib and network is not None and network.upper() != "IB":
            problems.append(f"{label}: {ib} is set, but NCCL uses network {network}: no active HCA port matched "
                            "there (its 'NET/IB : No device found.' line), so every inter-node all-reduce went over "
                            "TCP sockets")
    seen = {name for key in keys for name in reported[key]["values"]}
    for name in sorted(expected):
        missing = [key for key in keys if name not in reported[key]["values"]]
        if not missing:
            continue
        if name in READ_AT_INIT or name in seen:
            why = "NCCL reads it at every communicator's start" if name in READ_AT_INIT else "other ranks report it"
            problems += [f"{where(key)}: NCCL reported nothing for {name} ({why}): the variable did not reach it"
                         for key in missing]
    if len(keys) < tp_size:
        problems.append(f"NCCL lines from {len(keys)} of {tp_size} ranks: the others did not initialise NCCL or log")
    unconfirmed = sorted(name for name in expected if name not in seen and name not in READ_AT_INIT)
    return NcclLogCheck("failed" if problems else "ok", expected, ranks, problems, unconfirmed)
