"""HTTP to spectune's own servers (engines, replicas, a tracking server), never through a proxy
named by ``HTTP_PROXY`` (standard library only)."""

from __future__ import annotations

import urllib.request
from typing import Any

__all__ = ["open_direct"]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_direct(request: str | urllib.request.Request, *, timeout_s: float) -> Any:
    """``urllib.request.urlopen(request, timeout=timeout_s)`` without any proxy; raises as it does."""
    return _OPENER.open(request, timeout=timeout_s)
