"""How a configuration is served: ``ServeOptions``, and reading a best-config file.

The file is an ``EngineConfig`` YAML (a sweep's ``best.yaml``), optionally with a ``serve:`` block
of ``ServeOptions`` and a ``provenance:`` block; both are taken off before the engine part is
validated. Options given on the command line win over the block. The API key is never read from
the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.engine.config import EngineConfig
from serving.engine.placement import EnginePlacement, engine_placement
from serving.environ import ENV
from serving.errors import SpectuneError
from serving.serve.provenance import Provenance

__all__ = [
    "API_KEY_ENV",
    "Explain",
    "IngressPath",
    "ServeConfigError",
    "ServeOptions",
    "ServeStartError",
    "ServedConfig",
    "load_serve_file",
    "parse_serve_file",
    "parse_served",
    "read_served",
]

IngressPath = Literal["haproxy", "proxy"]
"""``haproxy``: Ray Serve's HAProxy ingress with direct ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``);
``proxy``: Serve's plain Python proxy actor."""

API_KEY_ENV = ENV.SPECTUNE_API_KEY
"""The registry's ``SPECTUNE_API_KEY`` (``serving.environ``), named here for the CLI."""


class ServeConfigError(SpectuneError, ValueError):
    """A serve configuration (file or options) is invalid; ``problems`` lists each as "field: what"."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        super().__init__(message + "".join(f"\n  - {p}" for p in self.problems))


class ServeStartError(SpectuneError):
    """The application did not come up (a replica failed to start, e.g. its env audit failed)."""


class ServeOptions(BaseModel):
    """Everything about serving that is not the engine: replicas, resources, network, health."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app_name: str = Field(default="spectune", min_length=1, description="Name of the Serve application.")
    route_prefix: str = Field(default="/", description="Path the application is mounted at ('/': the root).")
    host: str = Field(
        default="127.0.0.1", min_length=1,
        description="Address Serve's HTTP ingress binds; 127.0.0.1 keeps it on this machine, 0.0.0.0 exposes it.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port of Serve's HTTP ingress.")
    ingress: IngressPath = Field(
        default="haproxy",
        description="Ingress path when spectune starts Ray itself: 'haproxy' (HAProxy + direct ingress, the "
                    "measured faster one) or 'proxy' (Serve's Python proxy). A joined cluster keeps its own.",
    )
    num_replicas: int | None = Field(
        default=None, ge=1, le=1024,
        description="Replicas, each with its own engine and GPUs (default 1; not with autoscaling_config).",
    )
    autoscaling_config: dict[str, Any] | None = Field(
        default=None,
        description="Ray Serve autoscaling_config, passed through (min_replicas, max_replicas, "
                    "target_ongoing_requests, ...).",
    )
    gpus_per_replica: int | None = Field(
        default=None, ge=0, le=64,
        description="GPUs each replica (its engine) reserves: default tp_size for SGLang, 0 for the reference engine.",
    )
    cpus_per_replica: float = Field(default=1.0, ge=0, le=1024, description="CPUs each replica reserves.")
    max_ongoing_requests: int = Field(
        default=1024, ge=1,
        description="Requests Serve lets into one replica at once; the engine queues and batches them "
                    "(Serve's default of 5 would cap the engine's batch).",
    )
    max_queued_requests: int | None = Field(
        default=None, ge=-1,
        description="Serve's max_queued_requests, passed through (default: Serve's, no limit). Not a way to make "
                    "an outage fail faster: Serve counts a request as queued for a moment on its way in, so a small "
                    "limit refuses simultaneous arrivals on a healthy replica.",
    )
    health_check_period_s: float = Field(
        default=5.0, gt=0, le=600,
        description="Serve checks each replica this often (engine process alive and healthy: /health_generate); "
                    "three failures in a row replace the replica.",
    )
    health_check_timeout_s: float = Field(default=30.0, gt=0, le=600, description="A health check slower than this fails.")
    engine_start_timeout_s: float = Field(
        default=1800.0, gt=0, description="How long an engine may take to become healthy (a large SGLang model loads for minutes)."
    )
    log_dir: str | None = Field(
        default=None, description="Directory for engine logs on each node (default: <temp dir>/spectune-serve)."
    )

    @field_validator("route_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or (len(value) > 1 and value.endswith("/")):
            raise ValueError(f"route_prefix must start with '/' and not end with one (e.g. /llm), got {value!r}")
        return value

    @field_validator("max_queued_requests")
    @classmethod
    def _queue(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("max_queued_requests must be -1 (no limit) or at least 1 (Serve's rule)")
        return value

    @model_validator(mode="after")
    def _replicas(self) -> "ServeOptions":
        if self.autoscaling_config is not None and self.num_replicas is not None:
            raise ValueError(
                "set num_replicas or autoscaling_config, not both (autoscaling decides the number of replicas)"
            )
        return self

    def replicas_text(self) -> str:
        """How many replicas, in words (for the readiness line)."""
        if self.autoscaling_config is not None:
            low = self.autoscaling_config.get("min_replicas", 1)
            high = self.autoscaling_config.get("max_replicas", "?")
            return f"{low}-{high} replicas (autoscaling)"
        count = self.num_replicas or 1
        return f"{count} replica{'s' if count != 1 else ''}"

    def replicas_info(self) -> dict[str, Any]:
        """How many replicas, as ``GET /spectune/info`` says it: ``{"num_replicas": n}`` or
        ``{"autoscaling": {"min_replicas", "max_replicas"}}``."""
        if self.autoscaling_config is not None:
            return {"autoscaling": {"min_replicas": self.autoscaling_config.get("min_replicas", 1),
                                    "max_replicas": self.autoscaling_config.get("max_replicas")}}
        return {"num_replicas": self.num_replicas or 1}

    def gpus_for(self, config: EngineConfig) -> int:
        """GPUs one replica reserves for ``config``'s engine."""
        if self.gpus_per_replica is not None:
            return self.gpus_per_replica
        return config.tp_size if config.kind == "sglang" else 0

    def replica_bundle(self, config: EngineConfig) -> dict[str, float]:
        """The one placement-group bundle of a replica: its CPUs and its engine's GPUs, which
        must therefore be on one node (``STRICT_PACK``)."""
        bundle: dict[str, float] = {"CPU": self.cpus_per_replica}
        gpus = self.gpus_for(config)
        if gpus:
            bundle["GPU"] = float(gpus)
        return bundle

    def replica_placement(self, config: EngineConfig) -> EnginePlacement:
        """The placement group of a replica: a bundle per node, spread, for ``config.nnodes`` > 1
        (``serving.engine.placement``); one node: :meth:`replica_bundle`, packed."""
        return engine_placement(gpus=self.gpus_for(config), cpus=self.cpus_per_replica, nnodes=config.nnodes)

    def replicas_at_start(self) -> int:
        """How many replicas Serve starts with: ``num_replicas`` (default 1), or the autoscaling
        config's ``initial_replicas`` / ``min_replicas`` (at least one: the endpoint must answer)."""
        if self.autoscaling_config is None:
            return self.num_replicas or 1
        start = self.autoscaling_config.get("initial_replicas")
        if start is None:
            start = self.autoscaling_config.get("min_replicas", 1)
        return max(1, int(start))


Explain = Callable[[ValidationError, type[BaseModel]], list[tuple[str, str]]]
"""Turns what a model's validation raised into (dotted field, message) pairs. ``spectune serve``
passes the spec checker's (``orchestrator.validation.validation_problems``: the value, what is
allowed, "did you mean" for a mistyped key); without one, pydantic's own messages are listed."""


def _problems(error: ValidationError, *, model: type[BaseModel], prefix: str = "",
              explain: Explain | None = None) -> list[str]:
    pairs = explain(error, model) if explain is not None else [
        (".".join(str(part) for part in item["loc"]), item["msg"].removeprefix("Value error, "))
        for item in error.errors()]
    return [f"{prefix}{where}: {message}" if where else f"{prefix.rstrip('.')}: {message}".removeprefix(": ")
            for where, message in pairs]


class ServedConfig(NamedTuple):
    """A best-config file, read: the engine part, the serve options and the provenance (if any)."""

    engine: EngineConfig
    options: ServeOptions
    provenance: Provenance | None


def parse_served(text: str, *, source: str = "<config>", overrides: dict[str, Any] | None = None,
                 explain: Explain | None = None) -> ServedConfig:
    """An engine configuration, its serve options and its provenance from YAML text.

    Args:
        text: An ``EngineConfig`` YAML (a sweep's ``best.yaml``), optionally with a ``serve:`` block
            and a ``provenance:`` block.
        source: Names the text in errors (the file path).
        overrides: Serve options that win over the block (what the command line set).
        explain: How a field's problem reads (see ``Explain``); pydantic's messages without one.

    Raises:
        ServeConfigError: the YAML, the engine part, the serve options or the provenance block are
            invalid; every problem is listed with its field.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ServeConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ServeConfigError(f"{source}: expected an engine configuration (a mapping with kind, model_path, ...), "
                               f"got {type(data).__name__}")
    block = data.pop("serve", None) or {}
    if not isinstance(block, dict):
        raise ServeConfigError(f"{source}: 'serve' must be a mapping of serve options, got {type(block).__name__}")
    origin = data.pop("provenance", None)
    problems: list[str] = []
    config = options = provenance = None
    try:
        config = EngineConfig.model_validate(data)
    except ValidationError as exc:
        problems += _problems(exc, model=EngineConfig, explain=explain)
    try:
        options = ServeOptions.model_validate({**block, **(overrides or {})})
    except ValidationError as exc:
        problems += _problems(exc, model=ServeOptions, prefix="serve.", explain=explain)
    if origin is not None:
        try:
            provenance = Provenance.model_validate(origin)
        except ValidationError as exc:
            problems += _problems(exc, model=Provenance, prefix="provenance.", explain=explain)
    if problems or config is None or options is None:
        raise ServeConfigError(f"{source}: invalid serve configuration", problems)
    if config.kind == "sglang" and options.gpus_for(config) < config.tp_size:
        raise ServeConfigError(
            f"{source}: invalid serve configuration",
            [f"serve.gpus_per_replica: {options.gpus_per_replica} is below tp_size={config.tp_size}; "
             f"an SGLang engine needs one GPU per TP rank"],
        )
    return ServedConfig(config, options, provenance)


def parse_serve_file(text: str, *, source: str = "<config>", overrides: dict[str, Any] | None = None) -> tuple[EngineConfig, ServeOptions]:
    """The engine configuration and serve options of ``parse_served`` (the provenance left out)."""
    config, options, _ = parse_served(text, source=source, overrides=overrides)
    return config, options


def read_served(path: str | Path, *, overrides: dict[str, Any] | None = None,
                explain: Explain | None = None) -> ServedConfig:
    """``parse_served`` of a file (see there).

    Raises:
        ServeConfigError: the file cannot be read, or its content is invalid.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ServeConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_served(text, source=str(path), overrides=overrides, explain=explain)


def load_serve_file(path: str | Path, *, overrides: dict[str, Any] | None = None) -> tuple[EngineConfig, ServeOptions]:
    """``read_served`` without the provenance (see there).

    Raises:
        ServeConfigError: the file cannot be read, or its content is invalid.
    """
    config, options, _ = read_served(path, overrides=overrides)
    return config, options
