"""Does an MLflow tracking server answer? One probe of ``<uri>/health``, without importing mlflow
(seconds to import), so the sweep's preflight and ``spectune serve --mlflow-run`` can refuse a
server that is not there before MLflow would retry it for minutes."""

from __future__ import annotations

import urllib.error

from serving.local_http import open_direct

__all__ = ["health_status"]


def health_status(uri: str, *, timeout_s: float) -> int:
    """The HTTP status ``<uri>/health`` answers with (an error status too: the server answered).

    Raises:
        OSError: nothing answered within ``timeout_s`` (``urllib.error.URLError`` carries the reason).
        ValueError: ``uri`` is not a URL urllib can open.
    """
    try:
        with open_direct(uri.rstrip("/") + "/health", timeout_s=timeout_s) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
