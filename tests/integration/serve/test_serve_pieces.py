"""The Serve pieces without Ray: reading best.yaml (+ serve block), the deployment options, the
emitted Serve config, and the ingress ASGI app in front of a small fake engine (aiohttp), so its
refusals, its 503 for a dead engine and its chunk-by-chunk pass-through are checked in seconds.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from typer.testing import CliRunner

from orchestrator.cli import app as cli_app
from serving.ports import free_port
from serving.serve.app import REPLICA_SERVE_ENV, deployment_options, serve_config
from serving.serve.ingress import EngineEndpoint, OpenAIIngress, key_digest
from serving.serve.openai_errors import from_engine_body
from serving.serve.options import ServeConfigError, ServeOptions, parse_serve_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BEST_YAML = """\
# spectune sweep ci: the best configuration
# output_tok_per_s 412.0 at concurrency 8
kind: reference
model_path: ref-tiny
tp_size: 2
speculative_algorithm: EAGLE3
speculative_draft_model_path: ref-tiny-draft
speculative_num_steps: 2
speculative_eagle_topk: 1
speculative_num_draft_tokens: 3
disable_custom_all_reduce: false
extra_args: {enable_metrics: true, context_length: 2048}
env: {NCCL_ALGO: Ring}
"""


def test_best_yaml_is_accepted_unchanged() -> None:
    config, options = parse_serve_file(BEST_YAML)
    assert config.tp_size == 2 and config.env == {"NCCL_ALGO": "Ring"}
    assert options == ServeOptions()
    assert options.host == "127.0.0.1"  # not exposed unless asked


def test_serve_block_and_overrides() -> None:
    text = BEST_YAML + "serve: {num_replicas: 2, port: 9000}\n"
    config, options = parse_serve_file(text, overrides={"port": 9100})
    assert options.num_replicas == 2 and options.port == 9100
    assert "serve" not in config.model_dump()


def test_invalid_file_lists_every_problem_with_its_field() -> None:
    text = BEST_YAML.replace("tp_size: 2", "tp_size: 0") + "serve: {num_replica: 2, autoscaling_config: {}, num_replicas: 1}\n"
    with pytest.raises(ServeConfigError) as caught:
        parse_serve_file(text, source="best.yaml")
    problems = caught.value.problems
    assert any(p.startswith("tp_size:") for p in problems), problems
    assert any(p.startswith("serve.num_replica:") for p in problems), problems
    assert "best.yaml" in str(caught.value)


def test_autoscaling_excludes_num_replicas() -> None:
    with pytest.raises(ServeConfigError, match="num_replicas or autoscaling_config"):
        parse_serve_file(BEST_YAML, overrides={"num_replicas": 2, "autoscaling_config": {"max_replicas": 4}})


def test_deployment_owns_the_engines_gpus_and_carries_its_env() -> None:
    config, _ = parse_serve_file(BEST_YAML)
    sglang = config.model_copy(update={"kind": "sglang"})
    options = deployment_options(sglang, ServeOptions(num_replicas=3))
    assert options["num_replicas"] == 3
    assert options["placement_group_bundles"] == [{"CPU": 1.0, "GPU": 2}]
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["ray_actor_options"]["num_gpus"] == 2
    assert options["ray_actor_options"]["runtime_env"]["env_vars"] == {**REPLICA_SERVE_ENV, "NCCL_ALGO": "Ring"}
    scaled = deployment_options(config, ServeOptions(autoscaling_config={"min_replicas": 1, "max_replicas": 4}))
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4} and "num_replicas" not in scaled
    assert scaled["placement_group_bundles"] == [{"CPU": 1.0}]  # the CPU reference engine: no GPU


def test_emitted_serve_config_holds_the_key_digest_only(tmp_path: Path) -> None:
    best = tmp_path / "best.yaml"
    best.write_text(BEST_YAML)
    out = tmp_path / "serve.yaml"
    result = CliRunner().invoke(cli_app, ["serve", str(best), "--emit-serve-config", str(out), "--num-replicas", "2",
                                          "--api-key", "sk-secret-1"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "sk-secret-1" not in text and key_digest("sk-secret-1") in text
    document = yaml.safe_load(text)
    application = document["applications"][0]
    assert application["import_path"] == "serving.serve.app:app_builder"
    assert application["args"]["serve"] == {"num_replicas": 2}
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8000}
    config, _ = parse_serve_file(BEST_YAML)
    assert serve_config(config, ServeOptions(num_replicas=2), api_key_sha256=key_digest("sk-secret-1")) == document


def test_cli_refuses_an_invalid_config_with_exit_2(tmp_path: Path) -> None:
    best = tmp_path / "best.yaml"
    best.write_text(BEST_YAML + "serve: {port: 0}\n")
    result = CliRunner().invoke(cli_app, ["serve", str(best)])
    assert result.exit_code == 2 and "serve.port" in result.output


def test_engine_errors_are_rewritten_in_openai_shape() -> None:
    sglang = json.dumps({"object": "error", "message": "bad max_tokens", "type": "BadRequestError", "param": None,
                         "code": 400}).encode()
    assert json.loads(from_engine_body(400, sglang)) == {
        "error": {"message": "bad max_tokens", "type": "invalid_request_error", "param": None, "code": 400}}
    assert json.loads(from_engine_body(502, b"<html>bad gateway</html>"))["error"]["message"] == "<html>bad gateway</html>"


# --- the ingress in front of a fake engine ------------------------------------------------------

MODELS = {"object": "list", "data": [{"id": "m1", "object": "model"}]}


async def _fake_engine(release: asyncio.Event) -> tuple[web.AppRunner, str]:
    """Streams two events, then waits for ``release`` before the last: so a test can see the first
    chunks reach the client while the engine is still generating."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("max_tokens") == -1:
            return web.json_response({"object": "error", "message": "max_tokens must be positive", "type": "BadRequest",
                                      "param": None, "code": 400}, status=400)
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "whole"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        await resp.write(b'data: {"choices": [{"text": "b"}]}\n\n')
        await release.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


class _Client:
    """Calls an ASGI app in-process and records what it sends."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                   on_body: Any = None) -> tuple[int, dict[str, str], bytes]:
        raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": raw}
        sent: list[dict] = []
        incoming = [{"type": "http.request", "body": body, "more_body": False}]
        disconnected = asyncio.Event()

        async def receive() -> dict:
            if incoming:
                return incoming.pop()
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if on_body is not None and message["type"] == "http.response.body":
                await on_body(message)

        await self.app(scope, receive, send)
        start = sent[0]
        headers_out = {k.decode(): v.decode() for k, v in start["headers"]}
        return start["status"], headers_out, b"".join(m.get("body", b"") for m in sent[1:])


def _ingress(url: str, *, key: str | None = "k1") -> OpenAIIngress:
    async def audit() -> dict:
        return {"ok": True}

    return OpenAIIngress(engine=EngineEndpoint(url=url, models_body=json.dumps(MODELS).encode()), replica_id="r1",
                         api_key_sha256=key_digest(key) if key else None, audit=audit, connect_timeout_s=2)


def test_ingress_passes_chunks_through_as_they_arrive() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        runner, url = await _fake_engine(release)
        ingress = _ingress(url)
        chunks: list[bytes] = []

        async def on_body(message: dict) -> None:
            chunks.append(message["body"])
            if b'"b"' in b"".join(chunks):
                release.set()  # the engine finishes only once the first chunks reached the client

        try:
            status, headers, body = await _Client(ingress).call(
                "POST", "/v1/completions", json.dumps({"model": "m1", "prompt": "x", "stream": True}).encode(),
                {"Authorization": "Bearer k1"}, on_body=on_body)
            assert status == 200 and headers["x-spectune-replica"] == "r1"
            assert headers["content-type"].startswith("text/event-stream")
            assert body.endswith(b"data: [DONE]\n\n") and b'"a"' in body
        finally:
            await ingress.aclose()
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_ingress_refusals_and_a_dead_engine() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        runner, url = await _fake_engine(release)
        ingress = _ingress(url)
        client = _Client(ingress)
        auth = {"Authorization": "Bearer k1"}
        try:
            status, _, body = await client.call("GET", "/v1/models")
            assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
            status, _, body = await client.call("GET", "/v1/models/m1", headers=auth)
            assert status == 200 and json.loads(body)["id"] == "m1"
            status, _, body = await client.call("GET", "/v1/models/m2", headers=auth)
            assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
            status, _, body = await client.call("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": -1}', auth)
            assert status == 400 and json.loads(body)["error"]["message"] == "max_tokens must be positive"
            status, _, body = await client.call("POST", "/v1/completions", b'{"prompt": "x"}', auth)
            assert status == 200 and json.loads(body) == {"choices": [{"text": "whole"}]}
            status, _, _ = await client.call("GET", "/health")
            assert status == 200
        finally:
            await runner.cleanup()
        # The engine is gone: a fast 503, never a hang.
        status, _, body = await client.call("POST", "/v1/completions", b'{"prompt": "x"}', auth)
        assert status == 503 and json.loads(body)["error"]["code"] == "engine_unavailable"
        status, _, _ = await client.call("GET", "/health")
        assert status == 503
        await ingress.aclose()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
