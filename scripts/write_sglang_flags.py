#!/usr/bin/env python3
"""Write SGLang's server flag list (serving/data/sglang_server_flags.json) from SGLang's own parser.

    python scripts/write_sglang_flags.py --version 0.5.23

spectune checks every engine flag it renders, accepts (``extra_args``) or prints (advice, help,
docs) against this list, and the reference engine registers no flag SGLang lacks; the list is
data so that neither check imports sglang. It is read from SGLang's parser itself, never typed in:
``argparse.ArgumentParser()`` + ``sglang.srt.server_args.ServerArgs.add_cli_args(parser)``, then
every action in ``parser._actions``: every option string (aliases included), its dest, whether it
takes a value (argparse ``nargs``), whether SGLang marks it deprecated (a ``Deprecated*Action`` of
``sglang/srt/arg_groups/argparse_actions.py``, or a help text that starts with "Deprecated"), and
the first line of its help.

Steps (all under ``--work-dir``, a temporary folder unless given; nothing is installed into any
environment):
  1. ``pip download sglang==VERSION --no-deps`` (the official wheel) and unzip it to WORK/src.
  2. ``pip install --target WORK/deps`` the few packages ``sglang.srt.server_args`` imports that
     the interpreter lacks (orjson pybase64 triton msgspec pyzmq ipython).
  3. Run ``--python`` (an interpreter with torch; default: this one) with
     ``sys.path = [WORK/deps, WORK/src, ...]``: it builds the parser and prints the actions as JSON.
  4. Write the JSON file (``--output``): ``{"sglang_version", "generated_by", "generated_at",
     "flags": {"--tp-size": {...}, ...}}``.

``--src`` and ``--deps`` reuse an unpacked wheel and a deps folder from an earlier run (steps 1
and 2 are skipped). To refresh for a new SGLang version: run it with that ``--version``, then
run ``pytest tests/unit/test_sglang_flags.py`` and fix what it finds (renamed or removed flags in
the specs, advice, docs and the reference engine).

Exit status: 0 when the file was written (its path and the number of flags are printed); 1 when
a step failed (the step and its output on stderr).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "serving" / "data" / "sglang_server_flags.json"
DEFAULT_VERSION = "0.5.23"
IMPORT_DEPS = ("orjson", "pybase64", "triton", "msgspec", "pyzmq", "ipython")
"""What ``sglang.srt.server_args`` imports beyond torch (found by importing it until it worked)."""


def _dump(src: str, deps: str) -> None:
    """Runs in the child interpreter: SGLang's parser -> JSON on stdout."""
    sys.path[:0] = [deps, src]
    import logging

    logging.disable(logging.CRITICAL)  # SGLang's import-time warnings are not the output
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags: dict[str, dict] = {}
    for action in parser._actions:  # noqa: SLF001 - the only complete list argparse keeps
        kind = type(action).__name__
        help_text = action.help if isinstance(action.help, str) and action.help != argparse.SUPPRESS else ""
        first_line = help_text.strip().splitlines()[0] if help_text.strip() else ""
        deprecated = kind.startswith("Deprecated") or first_line.lstrip("(").lower().startswith("deprecated")
        nargs = action.nargs
        entry = {
            "dest": action.dest,
            "option_strings": list(action.option_strings),
            "action": kind,
            "takes_value": nargs != 0,
            "nargs": nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs),
            "deprecated": deprecated,
            "help": first_line,
        }
        new_flag = getattr(action, "new_flag", None)
        if new_flag:
            entry["use_instead"] = new_flag
        for option in action.option_strings:
            if option in flags:
                raise SystemExit(f"{option} is registered twice")
            flags[option] = entry
    json.dump(flags, sys.stdout, sort_keys=True)


def _run(step: str, argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(f"sglang_flags: {step} failed (exit {result.returncode}): {shlex.join(argv)}\n"
                         f"{result.stdout[-4000:]}{result.stderr[-4000:]}\n")
        raise SystemExit(1)
    return result.stdout


def _unpack(version: str, work: Path) -> Path:
    wheels = work / "wheel"
    _run("pip download", [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps",
                          "--only-binary", ":all:", "--dest", str(wheels), "--quiet"])
    (wheel,) = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    src = work / "src"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(src)
    return src


def _install_deps(work: Path) -> Path:
    deps = work / "deps"
    _run("pip install --target", [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(deps),
                                  *IMPORT_DEPS])
    return deps


def _render(data: dict) -> str:
    """JSON with one flag per line, so a refresh's diff reads flag by flag."""
    head = {key: value for key, value in data.items() if key != "flags"}
    lines = [json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "flags": {']
    items = sorted(data["flags"].items())
    lines += [f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{',' if i < len(items) - 1 else ''}"
              for i, (name, entry) in enumerate(items)]
    return "\n".join(lines) + "\n }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"SGLang version (default {DEFAULT_VERSION}).")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="The JSON file to write.")
    parser.add_argument("--python", default=sys.executable, help="Interpreter with torch that imports SGLang.")
    parser.add_argument("--work-dir", type=Path, default=None, help="Where the wheel and deps go (default: a temp dir).")
    parser.add_argument("--src", type=Path, default=None, help="An unpacked sglang wheel to reuse (skips step 1).")
    parser.add_argument("--deps", type=Path, default=None, help="A --target deps folder to reuse (skips step 2).")
    parser.add_argument("--dump", nargs=2, metavar=("SRC", "DEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        _dump(*args.dump)
        return 0

    with tempfile.TemporaryDirectory(prefix="sglang-flags-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        src = args.src or _unpack(args.version, work)
        deps = args.deps or _install_deps(work)
        infos = sorted(src.glob("sglang-*.dist-info"))
        found = infos[0].name.removeprefix("sglang-").removesuffix(".dist-info") if infos else "no dist-info"
        if found != args.version:
            sys.stderr.write(f"sglang_flags: {src} holds sglang {found}, not {args.version}\n")
            return 1
        out = _run("reading SGLang's parser", [args.python, str(Path(__file__).resolve()), "--dump", str(src), str(deps)])
    flags = json.loads(out)
    data = {
        "sglang_version": args.version,
        "generated_by": f"python scripts/write_sglang_flags.py --version {args.version}",
        "generated_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": "argparse.ArgumentParser() + sglang.srt.server_args.ServerArgs.add_cli_args(parser), "
                  "every action of parser._actions",
        "flags": flags,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(_render(data), encoding="utf-8")
    print(f"{args.output}: {len(flags)} option strings of sglang {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
