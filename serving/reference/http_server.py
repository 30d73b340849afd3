"""The HTTP API (aiohttp): the app factory, above the two route families.

``native_api`` registers SGLang's native endpoints (``/generate``, ``/health_generate``,
``/server_info``, ...), ``openai_api`` the OpenAI-compatible ones (``/v1/...``); both build on
``http_common`` (state, body reading, errors, streams) and neither imports the other. Each family
answers refusals in its own error shape: ``{"error": {"message": ...}}`` for the native routes,
SGLang's OpenAI error object for ``/v1``. See docs/reference-engine.md for every endpoint.
"""

from __future__ import annotations

from aiohttp import web

from serving.reference import native_api, openai_api
from serving.reference.http_common import MAX_BODY_BYTES, STATE_KEY, AppState

__all__ = ["build_app"]


def build_app(state: AppState) -> web.Application:
    """The aiohttp application with every route registered."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    native_api.register(app, enable_metrics=state.args.enable_metrics)
    openai_api.register(app)
    return app
