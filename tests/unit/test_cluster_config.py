"""cluster.yaml is a config Ray's own launcher accepts (schema + its defaults), for 8 GPUs."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _validate(config: dict) -> dict:
    # What `ray up` does: fill in the provider's defaults, then validate against ray-schema.json.
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_is_valid_for_ray() -> None:
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert any("--num-gpus=8" in cmd for cmd in prepared["head_start_ray_commands"])
    assert any("--num-gpus=8" in cmd for cmd in prepared["worker_start_ray_commands"])


def test_schema_check_is_real() -> None:
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    config["max_workrs"] = 1
    with pytest.raises(jsonschema.ValidationError, match="max_workrs"):
        _validate(config)
