"""Is a hub model whole in the node's Hugging Face cache? Built here as huggingface_hub lays it out:
refs/main -> snapshots/<commit>/<file> -> blobs/<sha>, an unfinished download without its link."""

from __future__ import annotations

import json
from pathlib import Path

from serving.engine.hub_cache import download_command, hub_cache_dir, hub_cache_problem
from serving.engine.node_checks import engine_problems

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached(cache: Path, repo: str, *, shards: int = 3, have: int | None = None, index: bool = True) -> Path:
    """``repo`` in ``cache`` with ``have`` of its ``shards`` weight files linked (all by default)."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / COMMIT
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    files = {"config.json": "{}"}
    if index:
        files["model.safetensors.index.json"] = json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}})
    files.update({n: "weights" for n in names[: shards if have is None else have]})
    for number, (name, text) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"sha{number}"
        blob.write_text(text)
        (snapshot / name).symlink_to(blob)
    if have is not None and have < shards:
        (repo_dir / "blobs" / "shaX.incomplete").write_text("half")  # what a download in progress leaves
    return snapshot


def test_where_the_cache_is() -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache_dir({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}) == Path("/b/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert hub_cache_dir({}) == Path("~/.cache/huggingface/hub").expanduser()
    assert download_command("org/m", {"HF_HOME": "/models"}) == "HF_HOME=/models hf download org/m"


def test_a_whole_model_passes_a_partial_or_absent_one_is_named(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path)}
    assert hub_cache_problem("org/whole", env=env) == f"is not in the Hugging Face cache at {tmp_path}"
    cached(tmp_path, "org/whole")
    assert hub_cache_problem("org/whole", env=env) is None
    snapshot = cached(tmp_path, "org/half", shards=4, have=1)
    problem = hub_cache_problem("org/half", env=env)
    assert problem == (f"is cached only in part: 3 of 4 weight files are missing from {snapshot} (first: "
                       "model-00002-of-00004.safetensors; the download did not finish)")
    cached(tmp_path, "org/single", shards=1, index=False)  # one weights file, no index
    assert hub_cache_problem("org/single", env=env) is None
    bare = cached(tmp_path, "org/bare", shards=1, have=0, index=False)
    assert hub_cache_problem("org/bare", env=env) == f"has no weight files in its cached snapshot {bare}"


def test_the_preflight_takes_a_cached_hub_id_with_a_note(tmp_path: Path) -> None:
    cached(tmp_path / "home" / "hub", "org/model")
    found = engine_problems(kind="sglang", model_path="org/model", draft_path=None,
                            env={"HF_HOME": str(tmp_path / "home"), "NCCL_ALGO": "Ring"})
    assert not [p for p in found["problems"] if "org/model" in p], found
    assert any(n.startswith("engine.model_path: 'org/model' is a Hugging Face hub id, cached whole on node")
               for n in found["notes"]), found


def test_validate_checks_model_paths_on_this_machine(tmp_path: Path) -> None:
    """A local path that does not exist, and a hub id not cached whole, are named by validate (as
    warnings: the engines may run on another node, where the sweep's preflight refuses them)."""
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app

    from helpers.spec_cases import BASE

    cached(tmp_path / "hf", "org/draft")
    spec = {**BASE, "engine": {**BASE["engine"], "model_path": str(tmp_path / "no-such-model"),
                               "speculative_algorithm": "EAGLE3",
                               "env": {"HF_HUB_CACHE": str(tmp_path / "hf"), "NCCL_DEBUG": "INFO"}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["validate", str(path)])
    out = " ".join(result.output.split())
    assert result.exit_code == 0, out
    assert f"warning engine.model_path: {tmp_path / 'no-such-model'} does not exist on this machine" in out
    assert "the sweep's preflight checks it on their node" in out
    assert "'org/draft' is a Hugging Face hub id" not in out  # cached whole in the engine's HF_HUB_CACHE
    cached_not = path.read_text().replace(str(tmp_path / "hf"), str(tmp_path / "elsewhere"))
    path.write_text(cached_not)
    out = " ".join(CliRunner().invoke(app, ["validate", str(path)]).output.split())
    assert "engine.draft_model_path: 'org/draft' is a Hugging Face hub id and is not in the Hugging Face cache" in out
