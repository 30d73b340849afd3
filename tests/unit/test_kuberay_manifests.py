"""docs/kuberay/'s RayJob and RayService are resources KubeRay v1.7.0 accepts, and carry what spectune needs.

The schema is the v1 ``openAPIV3Schema`` of KubeRay's CRDs (tests/data/kuberay/v1.7.0/, with its
source in the README there). OpenAPI v3 is not quite JSON Schema, so ``json_schema`` converts it
the way the API server reads it:
- ``x-kubernetes-int-or-string: true`` accepts an integer or a string (``nvidia.com/gpu: 8`` or "8");
- ``nullable: true`` also accepts null;
- an object with ``properties`` accepts no other key (``additionalProperties: false``) unless it
  has ``x-kubernetes-preserve-unknown-fields`` or its own ``additionalProperties``: CRD schemas
  leave unknown keys to the server, which prunes them (or, under ``kubectl apply``'s strict field
  validation, refuses them), so without this a misspelled ``rayStartParam`` would pass here and be
  silently dropped there.
CEL rules (``x-kubernetes-validations``) are not evaluated. No cluster is needed.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY_VERSION = "v1.7.0"
SCHEMAS = REPO / "tests" / "data" / "kuberay" / KUBERAY_VERSION
RAYJOB = REPO / "docs" / "kuberay" / "rayjob-sweep.yaml"
RAYSERVICE = REPO / "docs" / "kuberay" / "rayservice-serve.yaml"
SCHEMA_OF = {"RayJob": "ray.io_rayjobs.v1.schema.json", "RayService": "ray.io_rayservices.v1.schema.json"}
NETWORK_NCCL = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")
"""What every GPU pod carries: the cluster's network, the same for every trial and every replica."""

_SCHEMA_KEYS = ("items", "not")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf")


def json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 (structural CRD) schema as a JSON Schema checked like the API server (see above)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = json_schema(value)
        elif key in _SCHEMA_KEYS:
            out[key] = json_schema(value)
        elif key in _SCHEMA_LISTS:
            out[key] = [json_schema(sub) for sub in value]
        elif not key.startswith("x-kubernetes-") and key not in ("nullable", "description"):
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@cache
def validator(kind: str) -> jsonschema.Draft4Validator:
    """OpenAPI 3.0's schema objects are JSON Schema draft 4's (boolean exclusiveMinimum and all)."""
    schema = json_schema(json.loads((SCHEMAS / SCHEMA_OF[kind]).read_text()))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=_FORMATS)


def problems(doc: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(doc["kind"]).iter_errors(doc)]


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def gpu_groups(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    groups = cluster["workerGroupSpecs"]
    assert groups, "no worker group"
    return groups


def container(group: dict[str, Any]) -> dict[str, Any]:
    (first, *_) = group["template"]["spec"]["containers"]
    return first


def env_of(group: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(group).get("env", [])}


def gpus_of(group: dict[str, Any]) -> int:
    """The group's GPUs per pod, where Kubernetes and Ray agree on them."""
    limits = container(group)["resources"]["limits"]
    announced = group["rayStartParams"].get("num-gpus")
    assert str(limits.get("nvidia.com/gpu")) == announced, "nvidia.com/gpu limit != rayStartParams num-gpus"
    return int(announced)


# --- the schema, and that its check is real -------------------------------------------------------


@pytest.mark.parametrize("path", [RAYJOB, RAYSERVICE], ids=lambda p: p.name)
def test_manifest_is_valid_for_kuberay(path: Path) -> None:
    doc = load(path)
    assert doc["apiVersion"] == "ray.io/v1"
    assert problems(doc) == []


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    return job["rayClusterSpec"]["workerGroupSpecs"][0]


MISTAKES = {
    "misspelled-field": (lambda job: _worker(job).update(rayStartParam={}), "'rayStartParam' was unexpected"),
    "misspelled-top-field": (lambda job: job.update(shutdownAfterJobFinish=True), "'shutdownAfterJobFinish' was"),
    "misspelled-pod-field": (lambda job: container(_worker(job)).update(volumeMount=[]), "'volumeMount' was"),
    "wrong-type": (lambda job: _worker(job).update(replicas="one"), "'one' is not of type 'integer'"),
    "int32-range": (lambda job: job.update(ttlSecondsAfterFinished=2**31), "is not a 'int32'"),
    "bad-quantity": (lambda job: container(_worker(job))["resources"]["limits"].update({"nvidia.com/gpu": "eight"}),
                     "'eight' does not match"),
    "bad-enum": (lambda job: job["rayClusterSpec"]["authOptions"].update(mode="tokens"), "'tokens' is not one of"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_schema_check_rejects_mistakes(mistake: str) -> None:
    change, expected = MISTAKES[mistake]
    doc = copy.deepcopy(load(RAYJOB))
    change(doc["spec"])
    assert any(expected in p for p in problems(doc)), problems(doc)


def test_the_crd_schema_alone_would_miss_a_misspelled_field() -> None:
    """Why ``json_schema`` closes objects: KubeRay's schema as published lets the typo through."""
    doc = copy.deepcopy(load(RAYJOB))
    doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParam"] = {}
    raw = json.loads((SCHEMAS / SCHEMA_OF["RayJob"]).read_text())
    assert list(jsonschema.Draft4Validator(raw).iter_errors(doc)) == []
    assert problems(doc) != []


def test_int_or_string_accepts_both() -> None:
    doc = copy.deepcopy(load(RAYJOB))
    container(doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0])["resources"]["limits"]["nvidia.com/gpu"] = 8
    assert problems(doc) == []


# --- what spectune needs in them ------------------------------------------------------------------


def sweep_of(job: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The RayJob's entrypoint, parsed by `spectune sweep`'s own options (``python -m
    orchestrator.sweep`` is exactly that command), and the spec it names, loaded from experiments/."""
    import typer.main

    from orchestrator.cli import app
    from orchestrator.spec import SweepSpec

    python, dash_m, module, *args = shlex.split(job["entrypoint"])
    assert (python, dash_m, module) == ("python", "-m", "orchestrator.sweep")
    assert importlib.util.find_spec("orchestrator.sweep.__main__") is not None
    params = typer.main.get_command(app).commands["sweep"].make_context("sweep", args).params
    path = str(params["spec"])
    assert "experiments/" in path, f"{path}: not a spec of this repository's experiments/"
    return params, SweepSpec.from_yaml(REPO / "experiments" / path.rsplit("experiments/", 1)[1])


def test_rayjob_runs_the_real_sweep_on_a_spec_of_this_repo() -> None:
    job = load(RAYJOB)["spec"]
    params, sweep = sweep_of(job)
    assert job["submissionMode"] == "K8sJobMode"
    assert job["shutdownAfterJobFinishes"] is True and job["ttlSecondsAfterFinished"] > 0
    assert job["activeDeadlineSeconds"] > sweep.budget.time_limit_s
    # the results outlive the cluster: on a volume of the head, where the driver writes them
    head = job["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert any(params["results_dir"].startswith(m["mountPath"] + "/") for m in head["volumeMounts"])
    # a node holds one trial, and Ray announces the GPUs Kubernetes gave the pod; none on the head
    assert max(gpus_of(g) for g in gpu_groups(job["rayClusterSpec"])) >= sweep.resources.gpus_per_trial
    assert job["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"


def test_rayjob_env_reaches_the_job_and_leaves_the_searched_nccl_variables_to_the_trials() -> None:
    job = load(RAYJOB)["spec"]
    _, sweep = sweep_of(job)
    env_vars = yaml.safe_load(job["runtimeEnvYAML"])["env_vars"]
    assert env_vars["MLFLOW_TRACKING_URI"].startswith("http://")
    assert not [name for name in env_vars if name.startswith("NCCL_")]
    for group in gpu_groups(job["rayClusterSpec"]):
        pod_env = env_of(group)
        assert set(NETWORK_NCCL) <= set(pod_env), group["groupName"]
        # a pod value of a variable the spec sets or searches would reach the baselines too
        assert not set(pod_env) & {*sweep.search.nccl_variables(), *sweep.engine.env}


def test_rayservice_serves_what_spectune_serve_emits() -> None:
    from ray.serve.schema import ServeDeploySchema

    from serving.engine.config import EngineConfig
    from serving.serve.app import deployment_options, serve_config
    from serving.serve.options import ServeOptions
    from serving.serve.provenance import Provenance

    spec = load(RAYSERVICE)["spec"]
    config = yaml.safe_load(spec["serveConfigV2"])
    ServeDeploySchema.model_validate(config)  # what Serve (through KubeRay) deploys
    (application,) = config["applications"]
    module, _, attribute = application["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attribute)
    args = application["args"]
    assert builder(args) is not None  # builds the application (binds; nothing starts)
    engine, options = EngineConfig.model_validate(args["engine"]), ServeOptions.model_validate(args["serve"])
    origin = Provenance.model_validate(args["provenance"]) if args.get("provenance") else None
    assert config == serve_config(engine, options, api_key_sha256=args.get("api_key_sha256"), provenance=origin)
    # the winner's NCCL variables reach each replica through its runtime_env env_vars
    nccl = {k: v for k, v in engine.env.items() if k.startswith("NCCL_") and k != "NCCL_DEBUG"}
    assert nccl, "the served configuration carries no searched NCCL variable"
    replica_env = deployment_options(engine, options)["ray_actor_options"]["runtime_env"]["env_vars"]
    assert nccl.items() <= replica_env.items()
    assert "env_vars" not in application.get("runtime_env", {}), "NCCL variables belong in args.engine.env only"
    # the Service reaches the replicas: Serve binds every interface on the port the pods expose
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000} and options.host == "0.0.0.0"
    cluster = spec["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in head["ports"]}["serve"] == 8000
    # a worker holds one replica's GPUs; its pod env carries the network, not the served variables
    for group in gpu_groups(cluster):
        assert gpus_of(group) >= options.gpus_for(engine) and engine.nnodes == 1
        assert set(NETWORK_NCCL) <= set(env_of(group)) and not set(env_of(group)) & set(engine.env)
    assert {e["name"]: e["value"] for e in head["env"]}["MLFLOW_TRACKING_URI"].startswith("http://")


def test_sweep_and_service_share_the_network_settings_and_mlflow() -> None:
    """The winner is served on the network it was measured on, and both point at one MLflow."""
    job, service = load(RAYJOB)["spec"], load(RAYSERVICE)["spec"]
    for name in NETWORK_NCCL:
        assert {env_of(g)[name] for g in gpu_groups(job["rayClusterSpec"])} == {
            env_of(g)[name] for g in gpu_groups(service["rayClusterConfig"])}
    head = service["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    served_uri = {e["name"]: e["value"] for e in head["env"]}["MLFLOW_TRACKING_URI"]
    assert yaml.safe_load(job["runtimeEnvYAML"])["env_vars"]["MLFLOW_TRACKING_URI"] == served_uri
