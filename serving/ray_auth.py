"""Ray's token authentication for a local cluster that spectune starts itself.

A cluster this process starts gets ``RAY_AUTH_MODE=token`` (Ray's own default) chosen explicitly,
so Ray does not warn. A ``RAY_AUTH_MODE`` the user set is never changed; a joined cluster keeps its
operator's mode.
"""

from __future__ import annotations

import logging
import os

__all__ = ["AUTH_MODE_VARIABLE", "choose_local_auth_mode"]

logger = logging.getLogger(__name__)

AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"


def choose_local_auth_mode() -> str | None:
    """Before ``ray.init`` starts a local cluster: token authentication, unless ``RAY_AUTH_MODE`` is set.

    Uses Ray's private ``_enable_token_auth`` (Ray pinned to 2.60), which sets the variable and
    refreshes Ray's cached config; where it is missing, nothing is set.

    Returns:
        ``"token"`` when set here; None where the user's setting (any value, even empty) was kept or
        this Ray has no such function.
    """
    if AUTH_MODE_VARIABLE in os.environ:
        return None
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
    except ImportError:
        return None
    _enable_token_auth()
    logger.debug("local Ray: %s=token (Ray's default for a cluster it starts, chosen explicitly)", AUTH_MODE_VARIABLE)
    return "token"
