"""``--flag`` tokens in text, and what is wrong with them (tests/unit/test_sglang_flags.py's rule).

A token is ``--`` followed by a lowercase letter or digit and then letters, digits and dashes; a
brace group (``--cuda-graph-backend-{decode,prefill}``) is expanded. Every token must be one of:
an SGLang 0.5.23 server flag (``serving/data/sglang_server_flags.json``, exactly: no
abbreviation), a reference-engine-own flag (``REFERENCE_ONLY_FLAGS``), an option of spectune's
own CLI or of a script in the repository (both collected from their code), or an option of
another tool in ``OTHER_TOOLS``. A deprecated SGLang flag may appear only on a line that says
"deprecated"; a name in ``NOT_FLAGS`` (names spectune once used, that SGLang lacks) only on a line
that says it is refused or gone.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from pathlib import Path

import click
import typer

from serving.reference.server_args import REFERENCE_ONLY_FLAGS
from serving.sglang_flags import sglang_flags

__all__ = ["NOT_FLAGS", "OTHER_TOOLS", "ROOT", "flag_tokens", "line_problems", "script_options", "spectune_options",
           "unwrap"]

ROOT = Path(__file__).resolve().parents[2]

TOKEN = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?:\{[a-z0-9,-]+\}[a-z0-9-]*)?")

OTHER_TOOLS: dict[str, frozenset[str]] = {
    "ray start / ray job submit": frozenset({"--head", "--address", "--num-gpus", "--include-dashboard",
                                             "--working-dir", "--submission-id", "--no-wait"}),
    "mlflow server / mlflow ui": frozenset({"--backend-store-uri"}),
    "pip install / pip download": frozenset({"--find-links", "--no-index", "--no-deps", "--target"}),
    "nvidia-smi": frozenset({"--query-gpu", "--format"}),
    "hf download (huggingface_hub's CLI)": frozenset({"--local-dir"}),
    "placeholder in serving/engine/command.py's render_flags docstring (``--name value``)": frozenset({"--name"}),
}
"""Options of other programs that docs and messages quote, by program."""

NOT_FLAGS: dict[str, str] = {
    "--tp": "an alias the reference engine used to take; SGLang registers --tp-size",
    "--speculative-algo": "an alias the reference engine used to take; SGLang registers --speculative-algorithm",
    "--cuda-graph-max-bs": "gone from SGLang 0.5.23 (--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)",
    "--cuda-graph-bs": "an ambiguous prefix of --cuda-graph-bs-decode and --cuda-graph-bs-prefill",
}
"""Names that are no flag of SGLang, mentioned only to say so."""

REFUSAL_WORDS = ("reject", "refuse", "not ", "no longer", "gone", "lacks", "neither", "instead of", "ambiguous",
                 "used to")


def _tokens(text: str) -> list[tuple[int, str]]:
    """(position, token) of every ``--flag`` token, brace groups expanded."""
    out: list[tuple[int, str]] = []
    for found in TOKEN.finditer(text):
        token = found[0]
        match = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", token)
        if match:
            out += [(found.start(), match[1] + part + match[3]) for part in match[2].split(",")]
        else:
            out.append((found.start(), token.rstrip("-")))
    return out


def unwrap(text: str) -> str:
    """``text`` with flags that a line break splits after a dash (``--enforce-disable-`` / ``flashinfer-...``)
    joined again, so each is judged whole."""
    return re.sub(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*-)(`*)[ \t]*\n[ \t]*(`*)(?=[a-z0-9])", r"\1", text)


def flag_tokens(text: str) -> list[str]:
    """The ``--flag`` tokens of ``text``, brace groups expanded."""
    return [token for _, token in _tokens(text)]


@functools.cache
def spectune_options() -> frozenset[str]:
    """Every long option of the ``spectune`` CLI (the typer app), its commands' and ``--help``."""
    from orchestrator.cli import app

    root = typer.main.get_command(app)
    options: set[str] = set()
    commands = [root, *getattr(root, "commands", {}).values()]
    for command in commands:
        ctx = click.Context(command)
        for param in command.get_params(ctx):
            options.update(opt for opt in [*param.opts, *getattr(param, "secondary_opts", [])] if opt.startswith("--"))
    return frozenset(options)


@functools.cache
def script_options() -> frozenset[str]:
    """Every ``add_argument("--...")`` option of benchmarks/*.py and scripts/*.py (read from their code)."""
    options: set[str] = set()
    for path in itertools.chain((ROOT / "benchmarks").glob("*.py"), (ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                options.update(a.value for a in node.args
                               if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"))
    return frozenset(options)


def _known() -> frozenset[str]:
    others = frozenset().union(*OTHER_TOOLS.values())
    return sglang_flags().names | frozenset(REFERENCE_ONLY_FLAGS) | spectune_options() | script_options() | others


ENGINE_COMMAND = re.compile(r"(?:-m sglang\.launch_server|-m serving\.reference)(?P<args>[^|;&)]*)")
"""An engine command in a line; its flags run to the end of the command (a pipe, ``;``, ``&&``, ``)``)."""


def line_problems(line: str) -> list[str]:
    """What is wrong with the ``--flag`` tokens of one line (empty: nothing).

    On an engine command (``python -m sglang.launch_server ...``, ``python -m serving.reference
    ...``) only SGLang's names and the reference engine's own may appear.
    """
    table = sglang_flags()
    lowered = line.lower()
    problems = []
    engine_spans = [match.span("args") for match in ENGINE_COMMAND.finditer(line)]
    for position, token in _tokens(line):
        engine_only = any(start <= position < end for start, end in engine_spans)
        if token in table.deprecated:
            if "deprecat" not in lowered:
                problems.append(f"{token} is deprecated in SGLang {table.version}; say so on its line, or use "
                                f"{table.flags[token].use_instead or 'its replacement'}")
        elif token in NOT_FLAGS:
            if not any(word in lowered for word in REFUSAL_WORDS):
                problems.append(f"{token} is no SGLang flag ({NOT_FLAGS[token]})")
        elif engine_only and token not in table.names and token not in REFERENCE_ONLY_FLAGS:
            problems.append(f"{token} is on an engine command line but is no flag of SGLang {table.version}")
        elif token not in _known():
            prefixes = sorted(name for name in table.names if name.startswith(token))
            why = (f"an abbreviation of SGLang's {', '.join(prefixes[:3])}" if prefixes
                   else "no flag of SGLang, the reference engine, spectune, a repo script or OTHER_TOOLS")
            problems.append(f"{token} is {why}")
    return problems
