"""The OpenAI-compatible ingress of one replica: a plain ASGI app in front of its engine.

It checks the API key, refuses malformed requests in OpenAI's error shape, names the replica that
answered (``x-spectune-replica``) and passes the engine's response through byte for byte over one
pooled ``aiohttp`` session. Routes: ``GET /health`` (no key), ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /spectune/audit``, ``GET /spectune/info``. An unreachable engine is a fast 503, never a hang.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import aiohttp

from serving.serve.openai_errors import error_body, from_engine_body

__all__ = ["MAX_BODY_BYTES", "REPLICA_HEADER", "IngressRefusal", "OpenAIIngress", "check_request", "key_digest"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body accepted (413 beyond): far above any prompt, far below a memory problem."""
REPLICA_HEADER = "x-spectune-replica"
"""Response header naming the replica (Serve's replica id) that answered."""

_JSON = b"application/json"
_GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
_GET_ROUTES = ("/v1/models", "/spectune/audit", "/spectune/info")
_KNOWN = ("GET /health, GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions, "
          "GET /spectune/audit, GET /spectune/info")


def key_digest(key: str) -> str:
    """SHA-256 of an API key, hex: what replicas are given instead of the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()


class IngressRefusal(Exception):
    """A request the ingress refuses; rendered as an OpenAI error response."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str) or _is_token_list(prompt):
        return
    if isinstance(prompt, list) and prompt and (
        all(isinstance(p, str) for p in prompt) or all(_is_token_list(p) for p in prompt)
    ):
        return
    raise IngressRefusal(
        400, "'prompt' is required: a string, a list of strings, a list of token ids or a list of those",
        param="prompt",
    )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise IngressRefusal(400, "'messages' is required: a non-empty list of {role, content} objects", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise IngressRefusal(400, f"'messages[{index}]' must be an object with a string 'role'", param="messages")


def check_request(route: str, body: bytes, *, model_ids: frozenset[str]) -> bool:
    """Refuse what the engine should never see; return whether the client asked for a stream.

    Only the shape OpenAI requires is checked (a JSON object, ``prompt`` / ``messages``, a known
    ``model``, a boolean ``stream``); sampling parameters are the engine's to judge.

    Raises:
        IngressRefusal: 400 (malformed), 404 (``model`` is not the one served).
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise IngressRefusal(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise IngressRefusal(400, f"the request body must be a JSON object, not {type(data).__name__}")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise IngressRefusal(400, "'model' must be a string", param="model")
    if model is not None and model_ids and model not in model_ids:
        served = ", ".join(sorted(model_ids))
        raise IngressRefusal(404, f"the model {model!r} does not exist here; this endpoint serves {served}",
                             code="model_not_found", param="model")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise IngressRefusal(400, "'stream' must be true or false", param="stream")
    if route == "/v1/completions":
        _check_prompt(data.get("prompt"))
    else:
        _check_messages(data.get("messages"))
    return bool(stream)


def _route(scope: Mapping[str, Any]) -> str:
    """The path below the app's root (Serve mounts an app with a route prefix at ``root_path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path.rstrip("/") or "/"


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def _read_body(receive: Callable[[], Awaitable[dict]]) -> bytes | None:
    """The request body, or None if the client went away first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise IngressRefusal(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _until_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass(frozen=True)
class EngineEndpoint:
    """What the ingress knows about its engine.

    Attributes:
        url: Base URL of the engine's HTTP API (on the replica's own node).
        models_body: The engine's ``/v1/models`` answer, read once at start-up.
    """

    url: str
    models_body: bytes

    @property
    def models(self) -> list[dict[str, Any]]:
        """The model cards of ``/v1/models``."""
        data = json.loads(self.models_body).get("data") or []
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


class OpenAIIngress:
    """The ASGI app of one replica (routes: see the module docstring)."""

    def __init__(
        self,
        *,
        engine: EngineEndpoint,
        replica_id: str,
        api_key_sha256: str | None,
        audit: Callable[[], Awaitable[dict[str, Any]]],
        info: Callable[[], dict[str, Any]] | None = None,
        connect_timeout_s: float = 5.0,
        health_timeout_s: float = 10.0,
    ) -> None:
        """Args:
            engine: The engine behind this replica.
            replica_id: Serve's id of this replica (sent in ``x-spectune-replica``).
            api_key_sha256: ``key_digest`` of the API key; None serves without a key.
            audit: Returns this replica's audit report (``GET /spectune/audit``).
            info: Returns what ``GET /spectune/info`` answers (``serving.serve.provenance.info_body``);
                None answers with null provenance.
            connect_timeout_s: A connection to the engine not made by then is a 503.
            health_timeout_s: ``GET /health`` waits this long for the engine's ``/health``.
        """
        self.engine = engine
        self.replica_id = replica_id
        self._key = api_key_sha256
        self._audit = audit
        self._info = info
        self._connect_timeout_s = connect_timeout_s
        self._health_timeout_s = health_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._replica_header = (REPLICA_HEADER.encode(), replica_id.encode())
        cards = engine.models
        self._models = {card["id"]: json.dumps(card).encode() for card in cards}
        self._model_ids = frozenset(self._models)

    def _client(self) -> aiohttp.ClientSession:
        """The replica's one session to its engine, made in the loop that serves requests."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75, enable_cleanup_closed=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
                auto_decompress=False,
                trust_env=False,  # straight to the engine on this node, whatever *_proxy says
            )
        return self._session

    async def aclose(self) -> None:
        """Close the pooled session (replica shutdown)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route, method = _route(scope), scope.get("method", "GET")
        try:
            if route == "/health":
                await self._health(send)
                return
            self._authorise(scope)
            if route in _GENERATION_ROUTES:
                if method != "POST":
                    raise IngressRefusal(405, f"{route} takes POST, not {method}")
                await self._generate(route, receive, send)
                return
            if route not in _GET_ROUTES and not route.startswith("/v1/models/"):
                raise IngressRefusal(404, f"no route {route}; this endpoint serves {_KNOWN}")
            if method != "GET":
                raise IngressRefusal(405, f"{route} takes GET, not {method}")
            if route == "/v1/models":
                await self._respond(send, 200, self.engine.models_body)
            elif route == "/spectune/audit":
                await self._respond(send, 200, json.dumps(await self._audit()).encode())
            elif route == "/spectune/info":
                info = self._info() if self._info is not None else {
                    "sweep": None, "trial": None, "mlflow_run_id": None, "objective": None, "served_since": None,
                    "replicas": None, "replica": self.replica_id, "provenance": None}
                await self._respond(send, 200, json.dumps(info).encode())
            else:
                await self._model(route[len("/v1/models/"):], send)
        except IngressRefusal as refusal:
            await self._refuse(send, refusal)

    async def _lifespan(self, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _respond(self, send: Callable[[dict], Awaitable[None]], status: int, body: bytes,
                       content_type: bytes = _JSON) -> None:
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), self._replica_header]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _refuse(self, send: Callable[[dict], Awaitable[None]], refusal: IngressRefusal) -> None:
        body = error_body(refusal.status, refusal.message, code=refusal.code, param=refusal.param)
        await self._respond(send, refusal.status, body)

    def _authorise(self, scope: Mapping[str, Any]) -> None:
        if self._key is None:
            return
        header = _header(scope, b"authorization") or b""
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key_digest(token.strip()), self._key):
            raise IngressRefusal(
                401, "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'.", code="invalid_api_key"
            )

    async def _model(self, model_id: str, send: Callable[[dict], Awaitable[None]]) -> None:
        card = self._models.get(model_id)
        if card is None:
            raise IngressRefusal(404, f"the model {model_id!r} does not exist here; this endpoint serves "
                                      f"{', '.join(sorted(self._models))}", code="model_not_found", param="model")
        await self._respond(send, 200, card)

    async def _health(self, send: Callable[[dict], Awaitable[None]]) -> None:
        try:
            async with self._client().get(
                self.engine.url + "/health", timeout=aiohttp.ClientTimeout(total=self._health_timeout_s)
            ) as resp:
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise IngressRefusal(503, f"the engine does not answer /health: {type(exc).__name__}",
                                 code="engine_unavailable") from None
        if status != 200:
            raise IngressRefusal(503, f"the engine's /health answered HTTP {status}", code="engine_unavailable")
        await self._respond(send, 200, b'{"status":"ok"}')

    async def _generate(self, route: str, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before it finished sending
        check_request(route, body, model_ids=self._model_ids)
        try:
            resp = await self._client().post(self.engine.url + route, data=body, headers={"Content-Type": "application/json"})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise IngressRefusal(
                503, f"the engine cannot be reached ({type(exc).__name__}); this replica is being replaced, retry shortly",
                code="engine_unavailable",
            ) from None
        complete = False
        try:
            complete = await self._pass_through(resp, receive, send)
        finally:
            # closing (not releasing) an unfinished response tells the engine the client left
            if complete:
                resp.release()
            else:
                resp.close()

    async def _pass_through(
        self, resp: aiohttp.ClientResponse, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]
    ) -> bool:
        """Send the engine's response on; True if it was read to its end."""
        content_type = (resp.headers.get("Content-Type") or "application/json").encode("latin-1")
        if resp.status >= 400:
            await self._respond(send, resp.status, from_engine_body(resp.status, await self._read_all(resp)))
            return True
        if not content_type.startswith(b"text/event-stream"):
            await self._respond(send, resp.status, await self._read_all(resp), content_type)
            return True
        headers = [(b"content-type", content_type), (b"cache-control", b"no-cache"), self._replica_header]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        gone = asyncio.ensure_future(_until_disconnect(receive))
        complete = False
        try:
            async for data in resp.content.iter_any():
                if gone.done():
                    return False  # the client left
                await send({"type": "http.response.body", "body": data, "more_body": True})
            complete = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            event = {"error": {"message": f"the engine stream broke ({type(exc).__name__}); the engine may have died",
                               "type": "service_unavailable", "param": None, "code": "engine_unavailable"}}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": True})
        except OSError:  # uvicorn's ClientDisconnected: the client left (after aiohttp's, some of which are OSErrors)
            return False
        finally:
            gone.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return complete

    async def _read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        try:
            return await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise IngressRefusal(503, f"the engine's answer broke off ({type(exc).__name__})",
                                 code="engine_unavailable") from None
