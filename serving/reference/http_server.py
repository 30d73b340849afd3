"""The HTTP API (aiohttp): the app factory, with SGLang's native routes (``native_api``) and the
OpenAI-compatible ones (``openai_api``). See docs/reference-engine.md ("HTTP API").
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
