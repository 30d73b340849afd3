"""What spectune knows about NCCL's environment variables.

One table (``NCCL_VARIABLES``) of the variables a user may set or search over, the values NCCL
documents for each, and the values known to be dangerous, read by the spec validator, the command
builder and the env audit alike. Dangerous values are only searched when the spec allows them by
name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from serving.engine.nccl_network import parse_interface_list

__all__ = [
    "conflicts",
    "NcclVariable",
    "NCCL_VARIABLES",
    "ENGINE_MANAGED_VARIABLES",
    "NODE_CHECKED_VARIABLES",
    "DEFAULT_VALUE_WORDS",
    "SOCKETS_LIMIT",
    "check_value",
    "danger_of",
    "normalise_value",
    "not_searchable",
    "searched_value",
    "validated_env",
]

ValueKind = Literal["tokens", "choice", "int", "string", "interfaces"]
Scope = Literal["node", "network"]


@dataclass(frozen=True)
class NcclVariable:
    """One NCCL environment variable and the values NCCL accepts for it.

    Attributes:
        name: The variable's name, e.g. ``NCCL_ALGO``.
        kind: ``tokens`` (comma-separated known tokens, ``^`` first to exclude), ``choice`` (one of
            ``allowed``), ``int`` (in ``[minimum, maximum]``), ``interfaces`` (NCCL's interface list,
            ``serving.engine.nccl_network``) or ``string`` (free-form).
        allowed: Known tokens or choices (matched case-insensitively, as NCCL does).
        minimum: Smallest allowed integer for ``int`` variables.
        maximum: Largest allowed integer for ``int`` variables.
        default: NCCL's own default, as a string, when it has a fixed one.
        dangerous: Token or value (``*``: any non-default) -> why it is dangerous.
        doc: One line for ``--help`` style listings.
        scope: ``node`` (acts inside a node too) or ``network`` (only between nodes).
        fabric: Why the value is a property of the cluster's fabric and may not be searched; empty if
            it may be.
        node_checked: The value names something on the node; the preflight checks it on every node.
    """

    name: str
    kind: ValueKind
    allowed: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    default: str | None = None
    dangerous: dict[str, str] = field(default_factory=dict)
    doc: str = ""
    scope: Scope = "node"
    fabric: str = ""
    node_checked: bool = False


_NVLS_DANGER = "enables NVLink multicast (NVLS); never do this on shared GPU machines"
_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_BOOL = ("0", "1")
_GDR_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
"""The names NCCL's ``ncclGetLevel`` (graph/paths.cc) compares NCCL_NET_GDR_LEVEL with, exactly."""

NCCL_VARIABLES: dict[str, NcclVariable] = {
    v.name: v
    for v in (
        NcclVariable(
            "NCCL_ALGO",
            "tokens",
            ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"),
            dangerous={"NVLS": _NVLS_DANGER, "NVLSTREE": _NVLS_DANGER},
            doc="collective algorithms NCCL may use; an unknown token fails communicator init",
        ),
        NcclVariable(
            "NCCL_PROTO",
            "tokens",
            ("LL", "LL128", "Simple"),
            dangerous={"LL128": "forcing LL128 can corrupt data on some platforms"},
            doc="protocols NCCL may use",
        ),
        NcclVariable(
            "NCCL_BUFFSIZE",
            "int",
            minimum=65536,
            maximum=1 << 30,
            default="4194304",
            dangerous={"*": "a non-default NCCL_BUFFSIZE has caused hangs"},
            doc="bytes of buffer per channel between pairs of ranks (default 4194304)",
        ),
        NcclVariable("NCCL_NTHREADS", "choice", ("64", "128", "256", "512"), doc="threads per CUDA block"),
        NcclVariable("NCCL_MIN_NCHANNELS", "int", minimum=1, maximum=64, doc="minimum channels"),
        NcclVariable("NCCL_MAX_NCHANNELS", "int", minimum=1, maximum=64, doc="maximum channels"),
        NcclVariable("NCCL_MIN_CTAS", "int", minimum=1, maximum=64, doc="minimum CTAs per collective"),
        NcclVariable("NCCL_MAX_CTAS", "int", minimum=1, maximum=64, doc="maximum CTAs per collective"),
        NcclVariable("NCCL_P2P_DISABLE", "choice", _BOOL, default="0", doc="1 disables peer-to-peer transport"),
        NcclVariable("NCCL_P2P_LEVEL", "choice", _LEVELS, doc="topology distance up to which P2P is used"),
        NcclVariable("NCCL_SHM_DISABLE", "choice", _BOOL, default="0", doc="1 disables shared-memory transport"),
        # --- the network between nodes (NCCL 2.30's env.rst and sources: net_ib/, net_socket.cc, paths.cc) ---
        NcclVariable("NCCL_IB_DISABLE", "choice", _BOOL, default="0", scope="network",
                     fabric="1 sends every inter-node collective over TCP sockets: a diagnosis, not a setting to tune",
                     doc="1 disables InfiniBand/RoCE (NCCL falls back to sockets)"),
        NcclVariable("NCCL_NET", "choice", ("IB", "Socket"), scope="network",
                     fabric="it names the network plugin the cluster has; a forced one that fails to initialise "
                     "fails the communicator",
                     doc="network plugin to use (exact name, case-insensitive)"),
        NcclVariable("NCCL_SOCKET_IFNAME", "interfaces", scope="network", node_checked=True,
                     doc="interfaces for bootstrap and sockets: prefixes (eth matches eth0), ^ excludes, = exact"),
        NcclVariable("NCCL_IB_HCA", "interfaces", scope="network", node_checked=True,
                     doc="InfiniBand/RoCE HCAs to use: prefixes with optional :port, ^ excludes, = exact "
                     "(none matching: NCCL falls back to TCP sockets silently)"),
        NcclVariable("NCCL_IB_GID_INDEX", "int", minimum=-1, maximum=255, default="-1", scope="network",
                     node_checked=True,
                     fabric="the RoCE GID the fabric routes (a wrong index fails or hangs the connection)",
                     doc="RoCE GID index (-1: NCCL picks one; ignored on InfiniBand ports)"),
        NcclVariable("NCCL_IB_TC", "int", minimum=0, maximum=255, scope="network",
                     fabric="the traffic class the fabric's switches are configured for (QoS, PFC)",
                     doc="InfiniBand/RoCE traffic class"),
        NcclVariable("NCCL_IB_SL", "int", minimum=0, maximum=15, scope="network",
                     fabric="the service level the fabric is configured for (adaptive routing, QoS)",
                     doc="InfiniBand service level"),
        NcclVariable("NCCL_IB_TIMEOUT", "int", minimum=1, maximum=31, default="20", scope="network",
                     fabric="a transport timeout; too short fails with IB error 12, 0 or >= 32 waits forever",
                     doc="InfiniBand Verbs timeout, 4.096 us x 2^value (default 20)"),
        NcclVariable("NCCL_IB_RETRY_CNT", "int", minimum=0, maximum=7, default="7", scope="network",
                     fabric="a transport retry count, not a performance knob", doc="InfiniBand retry count"),
        NcclVariable("NCCL_IB_ADAPTIVE_ROUTING", "choice", _BOOL, scope="network",
                     fabric="adaptive routing needs a service level the fabric enables for it (NCCL_IB_SL)",
                     doc="adaptive routing (default: on for InfiniBand, off for RoCE)"),
        NcclVariable("NCCL_IB_QPS_PER_CONNECTION", "int", minimum=1, maximum=128, default="1", scope="network",
                     doc="queue pairs per connection between two ranks (1-128, default 1)"),
        NcclVariable("NCCL_IB_SPLIT_DATA_ON_QPS", "choice", _BOOL, default="0", scope="network",
                     doc="1 splits each message over all queue pairs, 0 uses them in turn (default since 2.20)"),
        NcclVariable("NCCL_IB_PCI_RELAXED_ORDERING", "choice", ("0", "1", "2"), default="2", scope="network",
                     doc="PCI relaxed ordering for IB Verbs (2: where available)"),
        NcclVariable("NCCL_NET_GDR_LEVEL", "choice", _GDR_LEVELS, scope="network",
                     doc="topology distance up to which GPUDirect RDMA is used (NCCL compares it case-sensitively)"),
        NcclVariable("NCCL_NET_GDR_READ", "choice", _BOOL, scope="network",
                     doc="GPUDirect RDMA for sends too (default: on from compute capability 8.0)"),
        NcclVariable("NCCL_SOCKET_NTHREADS", "int", minimum=1, maximum=16, scope="network",
                     doc="helper threads per socket connection (1-16; threads x NCCL_NSOCKS_PERTHREAD <= 64)"),
        NcclVariable("NCCL_NSOCKS_PERTHREAD", "int", minimum=1, maximum=64, scope="network",
                     doc="sockets per helper thread (threads x sockets <= 64)"),
        NcclVariable("NCCL_CROSS_NIC", "choice", ("0", "1", "2"), default="2", scope="network",
                     doc="whether rings/trees may cross NICs (2: where it is faster)"),
        NcclVariable("NCCL_DEBUG", "choice", ("VERSION", "WARN", "INFO", "TRACE"), doc="NCCL log level"),
        NcclVariable(
            "NCCL_DEBUG_SUBSYS",
            "tokens",
            ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
             "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL"),
            doc="subsystems NCCL_DEBUG=INFO logs",
        ),
        NcclVariable("NCCL_DEBUG_FILE", "string", doc="file NCCL logs to (%h host, %p pid)"),
        NcclVariable("NCCL_TOPO_FILE", "string", doc="XML topology file"),
    )
}

ENGINE_MANAGED_VARIABLES: dict[str, str] = {
    "NCCL_CUMEM_ENABLE": "SGLang sets it itself from --enable-symm-mem; use the engine flag enable_symm_mem",
    "NCCL_NVLS_ENABLE": "SGLang sets it itself from --enable-nccl-nvls / --enable-symm-mem (both turn on NVLink "
    "multicast, which spectune only allows when named in search.allow_dangerous)",
    "CUDA_DEVICE_MAX_CONNECTIONS": "SGLang overwrites it in its workers; setting it has no effect",
    "CUDA_VISIBLE_DEVICES": "Ray assigns the engine's GPUs from its num_gpus and sets it; use resources.gpus_per_trial",
}
"""Variables the engine (or Ray) sets itself: setting them in the environment is overridden or fights it."""

NODE_CHECKED_VARIABLES: tuple[str, ...] = tuple(n for n, v in NCCL_VARIABLES.items() if v.node_checked)
"""Variables whose value names something on the node (an interface, an HCA, a GID): the preflight
checks them on every node that may run an engine rank (``serving.engine.nccl_network``)."""


def not_searchable(name: str) -> str | None:
    """Why ``name`` is not for the search (a property of the cluster's fabric), or None."""
    var = NCCL_VARIABLES.get(name)
    if var is None or not var.fabric:
        return None
    return (f"{name} is a property of the cluster's fabric, not a performance knob: {var.fabric}; set it once in "
            "engine.env (the preflight checks it on every node)" if var.node_checked else
            f"{name} is a property of the cluster's fabric, not a performance knob: {var.fabric}; set it once in "
            "engine.env if the cluster needs it")


def normalise_value(name: str, value: str) -> str:
    """Return ``value`` in canonical spelling (``ring,tree`` -> ``Ring,Tree``); unknown variables and
    tokens are returned unchanged."""
    var = NCCL_VARIABLES.get(name)
    if var is None or var.kind not in ("tokens", "choice"):
        return value.strip()
    canon = {a.upper(): a for a in var.allowed}
    if var.kind == "choice":
        return canon.get(value.strip().upper(), value.strip())
    text = value.strip()
    prefix = "^" if text.startswith("^") else ""
    tokens = [t.strip() for t in text.lstrip("^").split(",")]
    return prefix + ",".join(canon.get(t.upper(), t) for t in tokens)


DEFAULT_VALUE_WORDS = ("default", "unset")
"""Spellings (besides YAML null) of "leave this variable unset: NCCL's own choice"."""

SOCKETS_LIMIT = 64
"""NCCL's cap on NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (it lowers the sockets per thread above it)."""


def searched_value(name: str, choice: str | int | None) -> str | None:
    """One value a search may give ``name``, checked against NCCL's set and normalised; ``None``
    for unset (null, ``default`` or ``unset``: NCCL's own choice).

    Raises:
        ValueError: ``name`` is no NCCL variable, or NCCL does not document ``name=choice`` (the
            message says what is allowed).
    """
    if name not in NCCL_VARIABLES and not name.startswith("NCCL_"):
        raise ValueError(f"{name!r} is not an NCCL variable; the search varies NCCL's own (fixed variables of any "
                         "name go in engine.env)")
    if choice is None or str(choice).strip().lower() in DEFAULT_VALUE_WORDS:
        return None
    problem = check_value(name, str(choice))
    if problem:
        raise ValueError(f"{name}: {problem}")
    return normalise_value(name, str(choice))


def check_value(name: str, value: str) -> str | None:
    """Say what is wrong with ``name=value``, or return ``None`` if NCCL documents it.

    Returns:
        A message naming what is allowed, or ``None``.
    """
    if name in ENGINE_MANAGED_VARIABLES:
        return f"{name} must not be set through the environment: {ENGINE_MANAGED_VARIABLES[name]}"
    var = NCCL_VARIABLES.get(name)
    if var is None:
        if name.startswith("NCCL_"):
            return f"unknown NCCL variable {name!r}; known: {', '.join(sorted(NCCL_VARIABLES))}"
        return None
    text = str(value).strip()
    if var.kind == "string":
        return None if text else f"{name} must not be empty"
    if var.kind == "interfaces":
        try:
            parse_interface_list(name, text)
        except ValueError as exc:
            return str(exc)
        return None
    if var.kind == "int":
        try:
            number = int(text)
        except ValueError:
            return f"{name}={text!r} is not an integer"
        if (var.minimum is not None and number < var.minimum) or (
            var.maximum is not None and number > var.maximum
        ):
            return f"{name}={number} is outside [{var.minimum}, {var.maximum}]"
        return None
    known = {a.upper() for a in var.allowed}
    if var.kind == "choice":
        if text.upper() not in known:
            return f"{name}={text!r} is not one of {', '.join(var.allowed)}"
        return None
    if ";" in text or ":" in text:
        return f"{name}={text!r}: per-collective syntax is not supported; use a comma-separated list"
    tokens = [t.strip() for t in text.lstrip("^").split(",")]
    bad = [t for t in tokens if t.upper() not in known]
    if bad or not text.lstrip("^"):
        return (
            f"{name}={text!r} has unknown token(s) {bad}; allowed: comma-separated "
            f"{', '.join(var.allowed)}, optionally prefixed with ^ to exclude"
        )
    return None


def danger_of(name: str, value: str) -> str | None:
    """Say why ``name=value`` is dangerous, or ``None``. Assumes ``check_value`` passed.

    Token lists are judged by the set they leave enabled: ``NCCL_PROTO=^LL,Simple`` forces LL128.
    """
    var = NCCL_VARIABLES.get(name)
    if var is None or not var.dangerous:
        return None
    text = str(value).strip()
    if "*" in var.dangerous:
        return None if text == var.default else var.dangerous["*"]
    if var.kind == "tokens":
        tokens = {t.strip().upper() for t in text.lstrip("^").split(",")}
        enabled = {a.upper() for a in var.allowed} - tokens if text.startswith("^") else tokens
        for token in sorted(enabled):
            reason = var.dangerous.get(token)
            if reason:
                return reason
        return None
    return var.dangerous.get(text.upper())


def conflicts(env: dict[str, str]) -> list[str]:
    """What one set of NCCL variables contradicts itself in (one line each; empty when consistent):
    ``NCCL_MIN_NCHANNELS`` above ``NCCL_MAX_NCHANNELS``, or ``NCCL_MIN_CTAS`` above ``NCCL_MAX_CTAS``
    (NCCL's docs: the minimum and maximum number of channels / CTAs NCCL may use; NCCL keeps the
    maximum, so the forced minimum silently does not hold)."""
    out = []
    for kind in ("NCHANNELS", "CTAS"):
        low_name, high_name = f"NCCL_MIN_{kind}", f"NCCL_MAX_{kind}"
        low, high = env.get(low_name), env.get(high_name)
        if low is not None and high is not None and str(low).isdigit() and str(high).isdigit() and int(low) > int(high):
            out.append(f"{low_name}={low} is above {high_name}={high}: NCCL keeps the maximum, so the minimum would "
                       f"not hold; lower {low_name} or raise {high_name}")
    return out


def validated_env(env: object) -> object:
    """Check and normalise an ``{NAME: value}`` environment mapping (a pydantic "before" hook).

    Values must be strings or numbers; each is checked with ``check_value`` and spelled
    canonically. Non-mappings are returned unchanged for pydantic to reject with its own message.

    Raises:
        ValueError: ``"NAME: what is wrong"`` for the first bad entry.
    """
    if not isinstance(env, dict):
        return env
    out: dict[str, str] = {}
    for name, item in env.items():
        if isinstance(item, (bool, list, dict)) or item is None:
            raise ValueError(f"{name}: must be a string or number, got {item!r}")
        problem = check_value(str(name), str(item))
        if problem:
            raise ValueError(f"{name}: {problem}")
        out[str(name)] = normalise_value(str(name), str(item))
    return out
