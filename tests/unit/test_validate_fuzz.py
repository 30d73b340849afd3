"""``spectune validate`` on mutated shipped specs: exit 0 or 2, never a traceback.

Mutations of ``experiments/*.yaml``: keys deleted, values replaced by random JSON-ish values (huge
integers, NaN, infinities, booleans, strings, nested lists and mappings), keys added, lines
repeated in the text (duplicate keys), random bytes spliced in, the text cut short. In-process
through typer's runner (fast); a few file-level cases through the installed console script.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.spec_file import MAX_SPEC_BYTES

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {p.name: yaml.safe_load(p.read_text()) for p in sorted((REPO / "experiments").glob("*.yaml"))}
runner = CliRunner()

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**30, -(10**30), 2**63, 2**31, 0, -1, 1, 64, 65, 1024, 1025]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["default", "Ring", "LL128", "NVLS", "1e3", "true", "", "sglang", "[/bold]", "NCCL_ALGO"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``node`` (mapping keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _parent(data: Any, path: tuple) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


@st.composite
def mutated_spec(draw: st.DrawFn) -> bytes:
    import copy

    data = copy.deepcopy(SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))])
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, leaf = _parent(data, path), path[-1]
        action = draw(st.sampled_from(["delete", "replace", "replace", "add"]))
        if action == "delete":
            del parent[leaf]
        elif action == "replace":
            parent[leaf] = draw(_VALUES)
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(_VALUES)
    text = yaml.safe_dump(data, allow_unicode=draw(st.booleans()), sort_keys=False).encode("utf-8")
    edit = draw(st.sampled_from(["none", "none", "repeat_line", "bytes", "cut"]))
    if edit == "repeat_line":  # a key given twice (when the line is a key)
        lines = text.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        text = b"".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    elif edit == "bytes":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(min_size=1, max_size=16)) + text[at:]
    elif edit == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    return text


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated_spec(), as_json=st.booleans())
def test_validate_never_crashes_on_mutated_specs(text: bytes, as_json: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutated.yaml"
        path.write_bytes(text)
        result = runner.invoke(app, ["validate", *(["--json"] if as_json else []), str(path)], terminal_width=200)
    assert result.exit_code in (0, 2), f"exit {result.exit_code}:\n{result.output}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def _console_script() -> Path:
    exe = Path(sys.executable).with_name("spectune")
    assert exe.exists(), "spectune is not installed in this environment (pip install -e .)"
    return exe


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("binary", bytes(range(256)) * 4, "is not UTF-8 text"),
        ("elf-like", b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64, "not valid YAML"),  # NULs are ASCII, not YAML
        ("too-large", b"# " + b"x" * MAX_SPEC_BYTES, "larger than"),
        ("duplicate-key", (REPO / "experiments" / "reference-cpu.yaml").read_bytes() + b"name: again\n",
         "duplicate key 'name'"),
        ("directory", None, "cannot read"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "",
)
def test_file_level_cases_exit_2_through_the_console_script(tmp_path: Path, name: str, content, words: str) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    run = subprocess.run([str(_console_script()), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and words in run.stderr
    assert name in run.stderr.replace("\n", ""), run.stderr  # rich wraps a long path
