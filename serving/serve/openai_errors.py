"""The OpenAI error body, the one shape every refusal of the Serve ingress takes.

OpenAI answers ``{"error": {"message", "type", "param", "code"}}`` (what the ``openai`` client
reads); SGLang and the reference engine answer ``{"object": "error", "message", ...}``, which
``from_engine_body`` rewrites.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["error_body", "from_engine_body", "type_for_status"]

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def type_for_status(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "service_unavailable" if status == 503 else "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, *, code: str | int | None = None, param: str | None = None) -> bytes:
    """The JSON bytes of an OpenAI error response."""
    error = {"message": message, "type": type_for_status(status), "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def from_engine_body(status: int, body: bytes) -> bytes:
    """An engine's error response rewritten in OpenAI's shape (unchanged if it already is one).

    Anything that is not a JSON object with a message (an HTML error page, plain text) becomes
    the message itself, cut to 2,000 characters.
    """
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return body
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        code = data.get("code")
        return error_body(status, data["message"], code=code if isinstance(code, (str, int)) else None,
                          param=data.get("param") if isinstance(data.get("param"), str) else None)
    text = body.decode(errors="replace").strip()[:2000] or f"the engine answered HTTP {status}"
    return error_body(status, text)
