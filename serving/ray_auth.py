"""Ray's token authentication for a local cluster that spectune starts itself.

Ray >= 2.59 turns token authentication on for a cluster that ``ray.init()`` starts while
``RAY_AUTH_MODE`` is unset, and warns that it did, on every start ("Token authentication is enabled
for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."). Disabling it is not the right
answer for a laptop: the embedded cluster listens on every interface of the machine (its GCS and
raylets bind ``::``: measured with Ray 2.60), so the token is what keeps anyone on the same network
from running code in it. spectune therefore keeps Ray's default and chooses it explicitly
(``RAY_AUTH_MODE=token``, as Ray's default sets it): the same token in ``~/.ray/auth_token`` (made
on the first start), and no warning, because Ray only warns about a mode it picked itself.

Only a cluster this process is about to start is concerned. A ``RAY_AUTH_MODE`` the user set is
never changed, whatever its value; a cluster spectune joins (``--address``, ``ray job submit``, a
running ``ray start``) keeps the mode its operator gave it, so nothing is set for one.
"""

from __future__ import annotations

import logging
import os

__all__ = ["AUTH_MODE_VARIABLE", "choose_local_auth_mode"]

logger = logging.getLogger(__name__)

AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"


def choose_local_auth_mode() -> str | None:
    """Before ``ray.init`` starts a local cluster: token authentication, unless ``RAY_AUTH_MODE`` is set.

    Ray reads the mode once, when it is imported, so setting the variable is not enough: Ray's own
    ``_enable_token_auth`` sets it and refreshes Ray's cached config (without both, the cluster's
    processes want a token that ``ray.init`` never made, and its GCS does not start). It is private
    to Ray (pinned to 2.60 in pyproject.toml); where it is missing, nothing is set and Ray's default,
    with its warning, applies. The variable stays set in this process, as Ray's default leaves it.

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
