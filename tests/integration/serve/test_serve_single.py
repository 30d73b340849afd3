"""``spectune serve`` on a tp-2 reference-engine config, as a user runs it (its own local Ray,
HAProxy ingress, an API key): the official ``openai`` client, the audit route, the info route of a
best.yaml with provenance (a real MLflow SQLite store), refusals, and the engine killed under it.

One served application is shared by every test of the module (Ray + Serve + an engine cost tens
of seconds on two cores). The kill test leaves it serving from a new, audited replica, so the
tests pass in any order; it is last only so that a replacement that never comes fails it alone.
The fixture's teardown is itself the SIGTERM test (what a service manager or ``ray job stop``
sends; Ctrl-C, the same handler, stops the other serve tests): exit 0, and no process of this
serve left, engine, TP workers, HAProxy and its own Ray included; the key in no log.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Iterator

import openai
import psutil
import pytest

from datetime import datetime

from mlflow.tracking import MlflowClient

from serving.ports import free_port

from helpers.engine import alive, processes_with_marker, read_environ, wait_until
from helpers.serve import ServeProcess, http, new_marker, record_trial_run, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = "sk-test-7f3a9c1e5b"
NCCL = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
RECOVERY_TIMEOUT_S = 120.0
"""The stated bound: a SIGKILLed engine is replaced and serving again within this (health checks
every 1 s here, three failures, then a new replica: engine start + audit)."""
REQUEST_TIMEOUT_S = 60.0
"""A request that takes longer than this during the outage counts as hung."""

ENGINE = {
    "kind": "reference",
    "model_path": "ref-tiny",
    "tp_size": 2,
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "ref-tiny-draft",
    "speculative_num_steps": 2,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
    "disable_custom_all_reduce": False,
    "extra_args": {"enable_metrics": True, "context_length": 2048},
}


def _described(pids: list[int]) -> dict[int, str]:
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found[pid] = f"{proc.name()}: {' '.join(proc.cmdline())[:160]}"
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("serve-single")
    marker = new_marker()
    engine = {**ENGINE, "env": {**NCCL, "SPECTUNE_TEST_MARKER": marker}}
    run = record_trial_run(work, engine=engine)  # the trial's MLflow run, as a sweep leaves it
    config = write_config(
        work / "best.yaml", engine=engine, provenance=run["provenance"],
        serve={"health_check_period_s": 1, "health_check_timeout_s": 20, "log_dir": str(work / "engines")},
    )
    # The key through the environment variable (the other way is --api-key): never on a command line.
    # The marker in serve's own environment too: its Ray and HAProxy carry it, so "nothing left" covers them.
    server = ServeProcess.start(config, port=free_port(), env={"SPECTUNE_API_KEY": KEY, "SPECTUNE_TEST_MARKER": marker},
                                log_dir=work)
    stopped = False
    try:
        yield {"server": server, "marker": marker, "url": server.url, "work": work, "run": run}
        before = _described(processes_with_marker(marker))
        kinds = {"haproxy": [d for d in before.values() if d.startswith("haproxy")],
                 "engine": [d for d in before.values() if "serving.reference" in d and "ref::tp" not in d],
                 "tp worker": [d for d in before.values() if d.startswith("ref::tp")]}
        # What must go is there to begin with, and carries the marker (else the check below proves nothing).
        assert len(kinds["haproxy"]) >= 1 and len(kinds["engine"]) == 1 and len(kinds["tp worker"]) == 2, before
        code = server.stop(signal.SIGTERM)
        stopped = True
        assert code == 0, server.log_tail()
        assert "stopped in" in server.log_tail(), server.log_tail()
        # Nothing left: no replica, engine, TP worker, HAProxy or Ray process of this serve (Ray reaps
        # the replica's process a moment after `spectune serve` has exited: wait, bounded).
        wait_until(lambda: not processes_with_marker(marker), timeout_s=120, poll_s=0.5,
                   what="no process of this serve (engine, TP workers, HAProxy, Ray) left after SIGTERM",
                   detail=lambda: f"left: {_described(processes_with_marker(marker))}\n{server.log_tail()}")
        assert server.logs_contain(KEY) == [], "the API key was written to a log"
        assert not any(p.is_file() and KEY.encode() in p.read_bytes() for p in (work / "engines").rglob("*"))
    finally:
        if not stopped:
            server.kill()
        shutil.rmtree(server.ray_tmp, ignore_errors=True)


@pytest.mark.timeout(120)
def test_readiness_line_names_url_model_and_audit(served: dict) -> None:
    line = served["server"].ready_line
    assert f"{served['url']}/v1" in line and "ref-tiny" in line and "env audit passed" in line, line
    assert "NCCL_ALGO" in line and "API key required" in line and "haproxy ingress" in line, line


@pytest.mark.timeout(120)
def test_info_route_names_the_trial_and_run_it_came_from_and_the_run_is_tagged_served(served: dict) -> None:
    run = served["run"]
    reply = http(served["url"] + "/spectune/info", key=KEY)
    assert reply.status == 200, reply.body
    info = reply.json()
    assert (info["sweep"], info["trial"], info["mlflow_run_id"]) == ("serve-test", 1, run["run_id"]), info
    assert info["objective"] == {"metric": "output_tok_per_s", "concurrency": 8, "median": 123.4, "ci95_low": 119.0,
                                 "ci95_high": 126.0, "repetitions": 3}, info
    assert info["replicas"] == {"num_replicas": 1} and info["replica"] == reply.headers["x-spectune-replica"]
    assert datetime.fromisoformat(info["served_since"]).utcoffset().total_seconds() == 0, info
    assert info["provenance"]["parent_run_id"] == run["parent_run_id"]
    assert http(served["url"] + "/spectune/info").status == 401, "the info route takes the audit route's key"
    line = served["server"].ready_line
    assert f"; from sweep serve-test trial 1 (MLflow run {run['run_id']})" in line, line
    # Once ready, the trial's run says it is being served, and where.
    client = MlflowClient(tracking_uri=run["tracking_uri"])
    wait_until(lambda: "spectune.served_by" in client.get_run(run["run_id"]).data.tags, timeout_s=60,
               what="the trial's MLflow run to be tagged spectune.served_by", detail=served["server"].log_tail)
    tags = client.get_run(run["run_id"]).data.tags
    assert tags["spectune.served_by"].endswith(f":{served['server'].port}") and tags["spectune.served_at"], tags


@pytest.mark.timeout(120)
def test_openai_client_completion_and_streamed_chat(served: dict) -> None:
    client = openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=60)
    models = client.models.list()
    assert [m.id for m in models.data] == ["ref-tiny"]
    assert client.models.retrieve("ref-tiny").id == "ref-tiny"

    completion = client.completions.create(
        model="ref-tiny", prompt="The capital of France is", max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert completion.choices[0].text and completion.usage.completion_tokens == 12

    stream = client.chat.completions.create(
        model="ref-tiny", messages=[{"role": "user", "content": "Say something."}], max_tokens=16, temperature=0,
        stream=True, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Streamed as the engine produced it: many chunks, not one buffered answer.
    assert len(chunks) >= 4 and text, chunks
    assert chunks[-1].choices[0].finish_reason == "length"
    # The same request answered whole has the same greedy text: nothing lost in the pass-through.
    whole = client.chat.completions.create(
        model="ref-tiny", messages=[{"role": "user", "content": "Say something."}], max_tokens=16, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.content == text


@pytest.mark.timeout(120)
def test_audit_route_shows_every_engine_process_carrying_the_nccl_variables(served: dict) -> None:
    reply = http(served["url"] + "/spectune/audit", key=KEY)
    assert reply.status == 200, reply.body
    audit = reply.json()
    assert audit["ok"] and audit["startup"]["ok"] and audit["now"]["ok"], audit
    assert audit["replica"] == reply.headers["x-spectune-replica"]
    processes = audit["now"]["processes"]
    roles = sorted(p["role"] for p in processes)
    assert roles.count("server") == 1 and roles.count("tp_worker") == 2, roles
    assert audit["startup"]["expected"] == {**NCCL, "SPECTUNE_TEST_MARKER": served["marker"]}
    # The truth behind the report: each process's own start-up environment.
    for process in processes:
        env = read_environ(process["pid"])
        assert {k: env.get(k) for k in NCCL} == NCCL, (process, {k: env.get(k) for k in NCCL})


@pytest.mark.timeout(120)
def test_requests_without_the_key_get_401_in_openai_shape(served: dict) -> None:
    for key in (None, "sk-wrong"):
        reply = http(served["url"] + "/v1/completions", body={"model": "ref-tiny", "prompt": "hi"}, key=key)
        assert reply.status == 401, reply.body
        error = reply.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error" and error["message"]
    assert http(served["url"] + "/spectune/audit").status == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served["url"] + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    # /health is for load balancers: no key.
    assert http(served["url"] + "/health").status == 200


MALFORMED = [
    ("/v1/completions", b'{"prompt": ', "not valid JSON"),
    ("/v1/completions", b"[1, 2, 3]", "JSON object"),
    ("/v1/completions", b"\xff\xfe garbage", "not valid JSON"),
    ("/v1/completions", {"model": "ref-tiny"}, "'prompt' is required"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "'stream'"),
    ("/v1/chat/completions", {"messages": "hello"}, "'messages' is required"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, "'messages[0]'"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, "max_tokens"),  # judged by the engine
]


@pytest.mark.timeout(120)
def test_malformed_requests_get_400_in_openai_shape_and_the_server_keeps_serving(served: dict) -> None:
    url = served["url"]
    for route, body, words in MALFORMED:
        reply = http(url + route, body=body, key=KEY)
        assert reply.status == 400, (route, body, reply.status, reply.body)
        error = reply.json()["error"]
        assert words in error["message"] and error["type"] == "invalid_request_error", (body, error)
    unknown = http(url + "/v1/completions", body={"model": "gpt-4", "prompt": "hi"}, key=KEY)
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert http(url + "/v1/nothing", key=KEY).status == 404
    assert http(url + "/v1/completions", key=KEY, method="GET").status == 405
    good = http(url + "/v1/completions", body={"model": "ref-tiny", "prompt": "still there?", "max_tokens": 4}, key=KEY)
    assert good.status == 200 and good.json()["choices"][0]["text"] is not None


@pytest.mark.timeout(RECOVERY_TIMEOUT_S + 120)
def test_sigkilled_engine_is_replaced_and_requests_meanwhile_get_errors_not_hangs(served: dict) -> None:
    """Ends once a new replica serves, the old engine is gone and the new one passed its audit:
    what the other tests need, whether they run before or after it."""
    url = served["url"]
    before = http(url + "/spectune/audit", key=KEY).json()
    old_replica, old_pids = before["replica"], [p["pid"] for p in before["now"]["processes"]]
    request = {"model": "ref-tiny", "prompt": "are you there?", "max_tokens": 4}
    outcomes: list[tuple[int, str | None, float]] = []
    os.kill(before["engine"]["pid"], signal.SIGKILL)

    def served_again() -> bool:
        began = time.monotonic()
        try:
            reply = http(url + "/v1/completions", body=request, key=KEY, timeout_s=REQUEST_TIMEOUT_S)
        except OSError as exc:  # a timeout here is a hang: recorded, and fails below
            outcomes.append((-1, type(exc).__name__, time.monotonic() - began))
            return False
        outcomes.append((reply.status, reply.headers.get("x-spectune-replica"), time.monotonic() - began))
        return reply.status == 200 and reply.headers.get("x-spectune-replica") != old_replica

    wait_until(served_again, timeout_s=RECOVERY_TIMEOUT_S, poll_s=0.2,
               what="a new replica to answer after the engine was SIGKILLed",
               detail=lambda: f"outcomes {outcomes[-5:]}\n{served['server'].log_tail()}")
    during = outcomes[:-1]
    assert during, "the replacement was instant: nothing was sent during the outage"
    assert all(status != -1 for status, _, _ in during), f"requests hung during the outage: {during}"
    # The dead engine's replica refuses at once with 503 (OpenAI shape), until Serve replaces it.
    assert any(status == 503 for status, _, _ in during), during
    assert all(status in (200, 503) for status, _, _ in during), during
    # No orphan: every process of the old engine is gone, the new one passed its audit.
    wait_until(lambda: not any(alive(pid) for pid in old_pids), timeout_s=30,
               what="the killed engine's processes to be gone")
    after = http(url + "/spectune/audit", key=KEY).json()
    assert after["ok"] and after["engine"]["pid"] not in old_pids and after["replica"] != old_replica

