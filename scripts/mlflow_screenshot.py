#!/usr/bin/env python3
"""Take a PNG screenshot of an experiment's runs table in the MLflow UI, parent run expanded.

    python scripts/mlflow_screenshot.py --backend-store-uri sqlite:///RESULTS/mlflow.db \\
        --experiment NAME --output runs.png

Steps:
  1. Start ``mlflow server --backend-store-uri URI --host 127.0.0.1 --port <free> --workers 1``
     (the mlflow of this Python's environment, log in a temporary file) and poll ``GET /health``
     until it answers (``--server-timeout``).
  2. Through the server's REST API: look the experiment up, and set its tag
     ``mlflow.experimentKind=custom_model_development`` if it is not set to that (MLflow 3 shows an
     experiment without it in its GenAI layout). This is the one change the script makes to the
     store; it goes through the server (the store's only writer meanwhile) rather than
     ``MlflowClient``, so this script does not import mlflow. Find the parent runs (those that
     other runs name in ``mlflow.parentRunId``) and pick the columns to show: ``--column``
     options, or by default ``metrics.objective.median``, ``tags.spectune.status`` and up to six
     params that differ between the nested runs (not ``trial_kind``: the run names say it).
  3. Start headless Chromium (``/usr/bin/chromium``, fresh temporary profile, DevTools on a free
     port) and drive it through the DevTools protocol (``websockets``): before the page loads,
     seed the UI's localStorage (model-training mode, assistant panel closed, selected columns
     and widths); open ``#/experiments/<id>/runs``; wait for the parent's row; click "Model
     training" if the UI is not in that mode; click the parent row's "+" expander unless its
     nested runs are already listed; close the "MLflow Assistant" panel if it is open; collapse
     the left sidebar (room for columns); wait until the table stops changing; capture the
     viewport (``--size``, 1600x1000 by default).
  4. Stop Chromium and the server (their whole process groups) whatever happened.

Exit status: 0 when the PNG was written (its path is printed on stdout); 1 when a step failed
(a message on stderr naming the step, with the tail of the log of the process concerned; when the
browser was up, the UI at that moment goes to ``<output stem>.failed.png``; the logs are kept in
a ``/tmp/mlflow-screenshot-*`` directory); 2 for bad arguments; 143 when terminated (SIGTERM).
Nothing else is printed unless ``--verbose`` (steps on stderr). Needs /usr/bin/chromium and the
``websockets`` package (already in the venv).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from websockets.sync.client import connect as ws_connect

KIND_TAG = "mlflow.experimentKind"
KIND_VALUE = "custom_model_development"
PARENT_TAG = "mlflow.parentRunId"
CHROMIUM = "/usr/bin/chromium"
MAX_AUTO_PARAMS = 6
AUTO_SKIP_PARAMS = {"trial_kind"}  # the trial's run name says it already

# urllib without proxies: everything here is on 127.0.0.1.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_VERBOSE = False


class StepFailed(Exception):
    """A step did not work; the message names it."""


def note(msg: str) -> None:
    if _VERBOSE:
        print(f"[mlflow_screenshot {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    if not text:
        return f"{path} (empty)"
    return f"{path} (last {len(text)} lines):\n" + "\n".join(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: Any = None, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with _HTTP.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


# --- processes --------------------------------------------------------------------------------


def start_group(cmd: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in a new session (its own process group), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=cwd, env=env, start_new_session=True)


def stop_group(proc: subprocess.Popen | None, grace: float = 10) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace`` seconds."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children in its group may still be going down.
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise StepFailed(what)
        time.sleep(interval)


def start_server(uri: str, work: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = work / "mlflow-server.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    note(f"starting {' '.join(cmd)} (log {log})")
    # No job runner (half a dozen huey processes the UI does not need here), no telemetry.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = start_group(cmd, log, cwd=work, env=env)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise StepFailed(f"mlflow server exited with status {proc.returncode} before answering "
                             f"/health; its log: {log_tail(log)}")
        try:
            with _HTTP.open(base + "/health", timeout=3) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    try:
        wait_until(healthy, timeout, f"mlflow server did not answer /health within {timeout:.0f} s; "
                                     f"its log: {log_tail(log)}", interval=1)
    except BaseException:
        stop_group(proc)
        raise
    note(f"server up at {base}")
    return proc, base


# --- what to show -----------------------------------------------------------------------------


def search_runs(base: str, experiment_id: str) -> list[dict]:
    runs: list[dict] = []
    token = None
    while True:
        body: dict[str, Any] = {"experiment_ids": [experiment_id], "max_results": 1000,
                                "run_view_type": "ACTIVE_ONLY"}
        if token:
            body["page_token"] = token
        page = http_json(base + "/api/2.0/mlflow/runs/search", body)
        runs += page.get("runs", [])
        token = page.get("next_page_token")
        if not token:
            return runs


def _kv(run: dict, part: str) -> dict[str, str]:
    return {d["key"]: str(d.get("value", "")) for d in run.get("data", {}).get(part, [])}


def plan(base: str, experiment: str, columns: list[str] | None) -> dict:
    """Experiment id, parents with their children (newest first), columns and widths."""
    try:
        exp = http_json(base + "/api/2.0/mlflow/experiments/get-by-name?"
                        + urllib.parse.urlencode({"experiment_name": experiment}))["experiment"]
    except urllib.error.HTTPError as exc:
        raise StepFailed(f"experiment {experiment!r} not found in the store "
                         f"(HTTP {exc.code}: {exc.read()[:300]!r})") from None
    exp_id = exp["experiment_id"]
    tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
    if tags.get(KIND_TAG) != KIND_VALUE:
        note(f"setting {KIND_TAG}={KIND_VALUE} on experiment {exp_id} (was {tags.get(KIND_TAG)!r})")
        http_json(base + "/api/2.0/mlflow/experiments/set-experiment-tag",
                  {"experiment_id": exp_id, "key": KIND_TAG, "value": KIND_VALUE})

    runs = search_runs(base, exp_id)
    by_id = {r["info"]["run_id"]: r for r in runs}
    children: dict[str, list[dict]] = {}
    for r in runs:
        parent = _kv(r, "tags").get(PARENT_TAG)
        if parent in by_id:
            children.setdefault(parent, []).append(r)
    if not children:
        raise StepFailed(f"experiment {experiment!r} ({len(runs)} active runs) has no parent run "
                         f"with nested runs (tag {PARENT_TAG}) to expand")
    start = lambda r: int(r["info"].get("start_time") or 0)  # noqa: E731
    parents = sorted(children, key=lambda p: start(by_id[p]), reverse=True)
    nested = [c for p in parents for c in children[p]]

    if columns is None:
        columns = []
        if any("objective.median" in _kv(c, "metrics") for c in nested):
            columns.append("metrics.objective.median")
        if any("spectune.status" in _kv(c, "tags") for c in nested):
            columns.append("tags.spectune.status")
        params = [_kv(c, "params") for c in nested]
        varying = [k for k in dict.fromkeys(k for ps in params for k in ps)
                   if k not in AUTO_SKIP_PARAMS and len({ps.get(k) for ps in params}) > 1]
        columns += [f"params.{k}" for k in varying][:MAX_AUTO_PARAMS]

    shown = [by_id[p] for p in parents] + nested
    widths = {}
    for col in columns:
        part, _, key = col.partition(".")
        vals = [_kv(r, part).get(key, "") for r in shown] if part in ("metrics", "params", "tags") else []
        n = max([len(key)] + [len(v) for v in vals])
        widths[col] = int(min(300, max(90, 7 * n + 26)))
    name_len = max(len(r["info"].get("run_name") or "") for r in shown)
    note(f"experiment {exp_id}: {len(runs)} runs, parents with nested runs: "
         + ", ".join(f"{p} ({len(children[p])})" for p in parents) + f"; columns {columns}")
    return {"experiment_id": exp_id, "parents": [{"id": p, "children": [c["info"]["run_id"] for c in
            children[p]]} for p in parents], "columns": columns, "widths": widths,
            "name_width": int(min(480, max(190, 90 + 6.2 * name_len)))}


def ui_column_id(col: str) -> str:
    """``metrics.objective.median`` -> the UI's column key ``metrics.`objective.median```."""
    part, _, key = col.partition(".")
    return f"{part}.`{key}`"


def seed_storage(p: dict) -> dict[str, str]:
    """localStorage entries (MLflow 3.x UI) that preselect what the screenshot should show."""
    cols = [ui_column_id(c) for c in p["columns"]]
    name_col = "attributes.`Run Name`"
    page_state = {
        "selectedColumns": cols,
        "columnOrder": [name_col, "runDateAndNestInfo", "duration", *cols],
        "columnWidths": {name_col: p["name_width"], **{ui_column_id(c): w for c, w in p["widths"].items()}},
    }
    key = "MLflowLocalStorage-1.1-ExperimentPage-" + json.dumps([p["experiment_id"]]) + "-ReactComponentState"
    return {
        key: json.dumps(page_state),
        "mlflow.workflowType_v1": json.dumps("machine_learning"),
        "mlflow.assistant.panelOpen_v1": "false",
        "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
    }


# --- browser ----------------------------------------------------------------------------------


class DevTools:
    """Minimal DevTools-protocol client over one page's websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == msg_id:  # events (no id) are ignored
                if "error" in msg:
                    raise StepFailed(f"DevTools {method} failed: {msg['error']}")
                return msg["result"]

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise StepFailed(f"page script failed: {res['exceptionDetails'].get('exception', res['exceptionDetails'])}")
        return res["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png", timeout=120)["data"])
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def start_chromium(work: Path, width: int, height: int, timeout: float = 60) -> tuple[subprocess.Popen, str]:
    profile = work / "chromium-profile"
    profile.mkdir()
    log = work / "chromium.log"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-proxy-server", "--hide-scrollbars", "--mute-audio", f"--user-data-dir={profile}",
           f"--window-size={width},{height}", "--remote-debugging-address=127.0.0.1",
           "--remote-debugging-port=0", "about:blank"]
    note(f"starting chromium (log {log})")
    proc = start_group(cmd, log, cwd=work)
    port_file = profile / "DevToolsActivePort"  # Chromium writes the port it got from the OS here

    def page_ws() -> str | None:
        if proc.poll() is not None:
            raise StepFailed(f"chromium exited with status {proc.returncode}; its log: {log_tail(log)}")
        try:
            port = int(port_file.read_text().split()[0])
            targets = json.loads(_HTTP.open(f"http://127.0.0.1:{port}/json/list", timeout=3).read())
        except (OSError, ValueError, IndexError):
            return None
        return next((t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"), None)

    try:
        ws_url = wait_until(page_ws, timeout, f"chromium's DevTools did not come up within {timeout:.0f} s; "
                                              f"its log: {log_tail(log)}")
    except BaseException:
        stop_group(proc)
        raise
    return proc, ws_url


JS_ROWS = "[...new Set([...document.querySelectorAll('[role=row][row-id]')].map(r => r.getAttribute('row-id')))]"

JS_EXPAND = """(() => {
  for (const row of document.querySelectorAll(%s)) {
    const b = row.querySelector('[data-component-id*="runnamecellrenderer"]')
           || row.querySelector('[col-id*="Run Name"] button');
    if (b) { b.click(); return true; }
  }
  return false;
})()"""

JS_MODEL_TRAINING = """(() => {
  if (localStorage.getItem('mlflow.workflowType_v1') === '"machine_learning"') return 'already';
  const b = [...document.querySelectorAll('[role=button],button')].find(e => e.innerText.trim() === 'Model training');
  if (!b) return 'absent';
  b.click();
  return 'clicked';
})()"""

JS_CLOSE_ASSISTANT = """(() => {
  let b = document.querySelector('[data-component-id="mlflow.assistant.chat_panel.close"]');
  if (!b) b = [...document.querySelectorAll('button[aria-label="Close"]')].find(e => {
    for (let a = e.parentElement, i = 0; a && i < 6; a = a.parentElement, i++)
      if ((a.innerText || '').startsWith('MLflow Assistant')) return true;
    return false;
  });
  if (!b) return false;
  b.click();
  return true;
})()"""

# Optional (room for columns; the breadcrumb still names the experiment).
JS_COLLAPSE_SIDEBAR = """(() => {
  const b = document.querySelector('[data-component-id="mlflow_header.toggle_sidebar_button"]');
  if (!b) return false;
  b.click();
  return true;
})()"""

JS_SNAPSHOT = """JSON.stringify([document.fonts.status,
  [...document.querySelectorAll('[class*="skeleton" i], .ag-overlay-loading-wrapper, [aria-busy="true"]')]
    .filter(e => e.offsetWidth > 0 && e.offsetHeight > 0 && (e.childElementCount > 0 || !e.matches('.ag-overlay-wrapper'))).length,
  [...document.querySelectorAll('.ag-center-cols-container [role=row]')].map(r => r.getAttribute('row-id') + ':' + r.innerText).join('|')])"""


def capture(ws_url: str, base: str, p: dict, out: Path, width: int, height: int, timeout: float) -> None:
    with ws_connect(ws_url, proxy=None, max_size=None, open_timeout=20, ping_interval=None) as ws:
        dt = DevTools(ws)
        try:
            _drive(dt, base, p, out, width, height, timeout)
        except StepFailed as exc:
            failed = out.with_name(out.stem + ".failed.png")
            try:
                dt.screenshot(failed)
            except Exception:  # noqa: BLE001 - keep the original failure
                raise exc from None
            raise StepFailed(f"{exc} (the UI at that moment: {failed})") from None


def _drive(dt: DevTools, base: str, p: dict, out: Path, width: int, height: int, timeout: float) -> None:
    dt.call("Page.enable")  # Page.addScriptToEvaluateOnNewDocument does nothing without it
    dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    seed = json.dumps(seed_storage(p))
    dt.call("Page.addScriptToEvaluateOnNewDocument", source=(
        "try { for (const [k, v] of Object.entries(%s)) if (location.origin === %s && "
        "localStorage.getItem(k) === null) localStorage.setItem(k, v); } catch (e) {}"
        % (seed, json.dumps(base))))
    url = f"{base}/#/experiments/{p['experiment_id']}/runs"
    note(f"opening {url}")
    dt.call("Page.navigate", url=url)

    first = p["parents"][0]
    rows = lambda: set(dt.js(JS_ROWS) or [])  # noqa: E731
    wait_until(lambda: first["id"] in rows(), timeout,
               f"the runs table did not show parent run {first['id']} within {timeout:.0f} s")
    note("runs table rendered")
    if dt.js(JS_MODEL_TRAINING) == "clicked":
        note("clicked 'Model training'")
        wait_until(lambda: first["id"] in rows(), timeout,
                   f"the runs table did not come back after switching to 'Model training' within {timeout:.0f} s")

    for parent in p["parents"]:
        present = rows()
        if parent["id"] not in present:
            if parent is first:
                raise StepFailed(f"parent run {parent['id']} disappeared from the runs table")
            continue  # not rendered (below the fold): nothing to show there anyway
        if present & set(parent["children"]):
            continue  # already expanded
        if not dt.js(JS_EXPAND % json.dumps(f'[role=row][row-id="{parent["id"]}"]')):
            raise StepFailed(f"no '+' expander found in the row of parent run {parent['id']}")
        wait_until(lambda: rows() & set(parent["children"]), 30,
                   f"the nested runs of parent run {parent['id']} were not listed within 30 s of clicking its '+'")
        note(f"expanded {parent['id']}")

    if dt.js(JS_CLOSE_ASSISTANT):
        note("closed the MLflow Assistant panel")
    if dt.js(JS_COLLAPSE_SIDEBAR):
        note("collapsed the sidebar")
    # Settled: fonts loaded, no loading placeholders, and the table's text the same twice in a row.
    last: list[str] = []

    def settled() -> bool:
        snap = dt.js(JS_SNAPSHOT)
        state = json.loads(snap)
        ok = state[0] == "loaded" and state[1] == 0 and last[-1:] == [snap]
        last.append(snap)
        return ok

    wait_until(settled, 30, "the page did not settle (still loading or changing) within 30 s", interval=1)
    if dt.js(JS_CLOSE_ASSISTANT):  # it may open by itself after a while
        note("closed the MLflow Assistant panel")
        time.sleep(0.5)  # let the close animation end
    wanted = {ui_column_id(c) for c in p["columns"]}
    shown = set(dt.js("[...document.querySelectorAll('.ag-header-cell[col-id]')].map(c => c.getAttribute('col-id'))") or [])
    if wanted and not wanted & shown:  # not an error: the picture just has the UI's default columns
        print("mlflow_screenshot: warning: the UI ignored the seeded column choice (has the format of its "
              "localStorage state changed?); the picture shows its default columns", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    dt.screenshot(out)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python scripts/mlflow_screenshot.py --backend-store-uri "
               "sqlite:////tmp/sw/results/mlflow.db --experiment dev-sweep --output /tmp/mlflow-ui.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend-store-uri", required=True, help="tracking store, e.g. sqlite:////abs/path/mlflow.db")
    ap.add_argument("--experiment", required=True, help="experiment name")
    ap.add_argument("--output", required=True, type=Path, help="PNG file to write")
    ap.add_argument("--column", action="append", metavar="KIND.KEY",
                    help="column to show (repeatable), e.g. metrics.objective.median, params.num_steps, "
                         "tags.spectune.status; default: metrics.objective.median, tags.spectune.status and "
                         f"up to {MAX_AUTO_PARAMS} params that differ between the nested runs")
    ap.add_argument("--size", default="1600x1000", help="viewport WIDTHxHEIGHT (default %(default)s)")
    ap.add_argument("--server-timeout", type=float, default=120,
                    help="seconds to wait for the server's /health (default %(default)s)")
    ap.add_argument("--ui-timeout", type=float, default=180,
                    help="seconds to wait for the runs table to render (default %(default)s)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the steps on stderr")
    args = ap.parse_args(argv)
    try:
        args.width, args.height = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size must be WIDTHxHEIGHT, not {args.size!r}")
    for col in args.column or []:
        if col.partition(".")[0] not in ("metrics", "params", "tags") or "." not in col:
            ap.error(f"--column must look like metrics.KEY, params.KEY or tags.KEY, not {col!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    global _VERBOSE
    args = parse_args(argv)
    _VERBOSE = args.verbose
    uri = args.backend_store_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        print(f"mlflow_screenshot: no SQLite store at {uri[len('sqlite:///'):]!r} "
              f"(from {uri}); not starting a server that would create an empty one", file=sys.stderr)
        return 1
    if not os.access(CHROMIUM, os.X_OK):
        print(f"mlflow_screenshot: {CHROMIUM} not found", file=sys.stderr)
        return 1
    # SIGTERM -> SystemExit, so that the finally below stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="mlflow-screenshot-"))
    server = browser = None
    ok = False
    step = "starting the mlflow server"
    try:
        server, base = start_server(uri, work, args.server_timeout)
        step = "reading the experiment through the server"
        p = plan(base, args.experiment, args.column)
        step = "starting chromium"
        browser, ws_url = start_chromium(work, args.width, args.height)
        step = "driving the MLflow UI"
        capture(ws_url, base, p, args.output, args.width, args.height, args.ui_timeout)
        ok = True
    except StepFailed as exc:
        print(f"mlflow_screenshot: {step}: {exc}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - one line naming the step, not a traceback
        print(f"mlflow_screenshot: {step}: {type(exc).__name__}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"mlflow_screenshot: interrupted while {step}", file=sys.stderr)
    finally:
        stop_group(browser)
        stop_group(server)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(work / "chromium-profile", ignore_errors=True)
            print(f"mlflow_screenshot: logs kept in {work}", file=sys.stderr)
    if ok:
        print(args.output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
