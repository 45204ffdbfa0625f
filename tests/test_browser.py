"""The quickstart in JupyterLab in headless Chromium: the dashboard lives, and the page drives the run.

A copy of notebooks/00_quickstart.ipynb (so the repo's copy never gets outputs) is opened in a
JupyterLab served by ``rlinf_nb.lab.serve_lab`` against the session cluster; the test runs all
cells and checks the page: the curve gains points while the run trains, the rollout tile's
image changes, no widget fails to render. Then a cell with a long run and its dashboard is
added, and the page's controls are used: a hyperparameter slider dragged and applied shows up
as an ``hparams`` event of the run, and Pause stops its env steps. Screenshots go to
test-output/.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
OUT = REPO / "test-output"
NB = "00_quickstart.ipynb"

# JS run in the page. The active notebook panel:
_PANEL = "document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"
_KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle';
}"""
_ALL_RAN = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  return nb.widgets.every(c => c.model.type !== 'code' || (c.model.executionCount !== null && !c.hasClass('jp-mod-running')))
    && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle';
}"""
# Points in each plotly graph's first trace, and the src of each rollout image.
_PLOT_POINTS = f"""() => Array.from({_PANEL}.querySelectorAll('.js-plotly-plot'))
  .map(gd => (gd.data && gd.data.length && gd.data[0].x) ? gd.data[0].x.length : 0)"""
_IMAGE_SRCS = f"""() => Array.from({_PANEL}.querySelectorAll('.widget-image'))
  .map(img => img.getAttribute('src') || '')"""
# Run every cell but the last (which closes the dashboard), and then the last one: the test watches the
# dashboard in between, however fast the run ends.
_RUN_ALL_BUT_LAST = """() => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  app.commands.execute('notebook:run-all-above');  // not awaited: resolves when every cell above has run
}"""
_RUN_LAST = """() => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  app.commands.execute('notebook:run-cell');
}"""
_ADD_AND_RUN = """async (code) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute('notebook:insert-cell-below');
  nb.activeCell.model.sharedModel.setSource(code);
  app.commands.execute('notebook:run-cell');  // not awaited: resolves when the cell is done
}"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(cond, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} not seen within {timeout:.0f} s")


@pytest.fixture(scope="module")
def lab(cluster, session_home: Path, tmp_path_factory):
    """JupyterLab on 127.0.0.1 with a token, root = a temp dir holding a copy of the quickstart."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api")
    root = tmp_path_factory.mktemp("labroot")
    shutil.copy(REPO / "notebooks" / NB, root / NB)
    for base, token in serve_lab_in(root, NB, session_home, root.parent / "lab.log"):
        yield base, token, root


def serve_lab_in(root: Path, notebook: str, session_home: Path, log: Path):
    """Yield ``(base_url, token)`` of ``rlinf-nb lab`` serving ``root`` on 127.0.0.1; stop it after."""
    port, token = _free_port(), secrets.token_hex(16)
    code = (
        "from rlinf_nb.lab import serve_lab; import sys; "
        f"sys.exit(serve_lab(port={port}, open_path={notebook!r}, root_dir={str(root)!r}, token={token!r}))"
    )
    env = dict(os.environ, RLINF_NB_HOME=str(session_home), RLINF_NB_CI="1")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"the lab exited early:\n{log.read_text()}"
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        _wait(up, 120, "the lab answering")
        yield base, token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def page_on_new_notebook(cells: list[str], notebook: str, session_home: Path, tmp_path_factory, label: str):
    """Yield a Chromium page on a new ``notebook`` of code ``cells`` in a JupyterLab of its own (skips the
    test without Chromium or playwright)."""
    import nbformat

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api")
    root = tmp_path_factory.mktemp(f"{label}lab")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / notebook)
    OUT.mkdir(exist_ok=True)
    for base, token in serve_lab_in(root, notebook, session_home, root.parent / f"{label}_lab.log"):
        yield from open_notebook(base, token, notebook, tmp_path_factory.mktemp(f"chromium_{label}"))


def open_notebook(base: str, token: str, notebook: str, profile: Path):
    """Yield a headless Chromium page with ``notebook`` open in JupyterLab and its kernel idle."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True,
            viewport={"width": 1400, "height": 1100},
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        pg.goto(f"{base}/lab/tree/{notebook}?reset&token={token}")
        deadline = time.time() + 180
        while not pg.evaluate(_KERNEL_IDLE):
            dialog = pg.locator(".jp-Dialog .jp-mod-accept")
            if dialog.count():
                dialog.first.click()  # "Select Kernel": accept the default
            assert time.time() < deadline, "the notebook's kernel never became idle"
            time.sleep(0.5)
        yield pg
        ctx.close()


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    base, token, _root = lab
    OUT.mkdir(exist_ok=True)
    yield from open_notebook(base, token, NB, tmp_path_factory.mktemp("chromium"))


def _shot(pg, name: str) -> None:
    pg.screenshot(path=str(OUT / f"browser_{name}.png"), full_page=False)


def _scroll_to(pg, selector: str) -> None:
    loc = pg.locator(f".jp-NotebookPanel:not(.lm-mod-hidden) {selector}").last
    if loc.count():
        loc.scroll_into_view_if_needed()


def _page_problems(pg) -> list[str]:
    text = pg.evaluate(f"() => {_PANEL}.innerText")
    problems = [m for m in ("Error displaying widget", "Traceback (most recent call last)") if m in text]
    errors = pg.evaluate(
        f"() => {_PANEL}.querySelectorAll('[data-mime-type=\"application/vnd.jupyter.error\"]').length"
    )
    if errors:
        problems.append(f"{errors} error output(s)")
    return problems


_HEADER = f"""() => Array.from({_PANEL}.querySelectorAll('.widget-html-content'))
  .slice(0, 3).map(e => e.innerText).join(' | ')"""


def _watch(pg, seconds: float, need_points: int, need_images: int) -> tuple[list, list]:
    """Sample the last plot's point count and the last image's src until both have changed enough."""
    points, images = [], []
    pg.header_seen = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        p, s = pg.evaluate(_PLOT_POINTS), pg.evaluate(_IMAGE_SRCS)
        if p:
            points.append(p[-1])
        if s and s[-1]:
            images.append(s[-1])
        pg.header_seen.append(pg.evaluate(_HEADER))
        grew = len({x for x in points if x}) >= need_points
        changed = len(set(images)) >= need_images
        if grew and changed:
            break
        time.sleep(0.5)
    return points, images


def test_quickstart_runs_in_the_browser_and_its_dashboard_lives(page):
    pg = page
    pg.evaluate(_RUN_ALL_BUT_LAST)
    pg.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot", timeout=240_000)
    _scroll_to(pg, ".js-plotly-plot")
    points, images = _watch(pg, 240, need_points=3, need_images=3)
    _shot(pg, "quickstart_live")
    assert len({x for x in points if x}) >= 3, (
        f"the curve did not gain points: {points}; header: {pg.header_seen[-3:]}"
    )
    assert points == sorted(points), points
    assert len(set(images)) >= 3, f"the rollout image did not change: {len(set(images))} distinct"
    pg.evaluate(_RUN_LAST)  # queued behind the cells above: the kernel runs them in order
    _wait(lambda: pg.evaluate(_ALL_RAN), 900, "every cell run")
    _shot(pg, "quickstart_done")
    assert not _page_problems(pg), _page_problems(pg)


def test_page_controls_reach_the_run(page, attached):
    import rlinf_nb as rl

    pg = page
    name = f"browser_{uuid.uuid4().hex[:6]}"
    code = (
        "from rlinf_nb.widgets import CARTPOLE_WITH_FRAMES\n"
        f"run2 = rl.launch('ppo_cartpole', name={name!r}, env__id=CARTPOLE_WITH_FRAMES, env__render_every=64,\n"
        "                  budget__total_env_steps=10**7, budget__stop_metric=None, budget__stop_value=None)\n"
        "dash2 = rl.dashboard(run2)\n"
        "dash2"
    )
    pg.evaluate(_ADD_AND_RUN, code)
    try:
        _wait(lambda: pg.evaluate(_ALL_RAN), 300, "the new cell run")
        run = rl.get_run(name)
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        _scroll_to(pg, ".js-plotly-plot")
        # The kernel is idle now: pongs flow and the page is fed at full rate.
        points, images = _watch(pg, 120, need_points=3, need_images=5)
        assert len({x for x in points if x}) >= 3, points
        assert len(set(images)) >= 5, len(set(images))
        _shot(pg, "dashboard_idle_kernel")

        # Drag the lr slider of the hyperparameter panel, then Apply.
        slider = panel.locator(".widget-hslider").filter(
            has=pg.locator("label.widget-label", has_text=re.compile(r"^(● )?lr$"))
        ).last  # fmt: skip
        slider.scroll_into_view_if_needed()
        handle = slider.locator(".noUi-handle").first

        def drag_left() -> float:
            """Drag the handle 40 px left; the readout after it. (On a loaded box the page may still be
            laying out after the scroll: a drag from a stale handle box misses, so it is tried again.)"""
            box = handle.bounding_box()
            pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            pg.mouse.down()
            pg.mouse.move(box["x"] - 40, box["y"] + box["height"] / 2, steps=8)
            pg.mouse.up()
            return float(slider.locator(".widget-readout").inner_text())

        readouts = [drag_left()]
        while readouts[-1] >= 1e-3 and len(readouts) < 3:
            pg.wait_for_timeout(1000)
            readouts.append(drag_left())
        readout = readouts[-1]
        assert readout < 1e-3, readouts
        panel.locator("button", has_text="Apply").last.click()

        def lr_event():
            ev = run.events()
            hp = ev[ev["kind"] == "hparams"] if "kind" in ev else ev.iloc[:0]
            return [c["algo.lr"]["new"] for c in hp.get("changes", []) if "algo.lr" in c]

        (new_lr,) = _wait(lr_event, 60, "the slider's hparams event")
        assert new_lr == pytest.approx(readout, rel=0.02)
        _shot(pg, "slider_applied")

        # Pause from the page: env steps stop growing.
        panel.locator("button", has_text="Pause").last.click()
        _wait(lambda: run.status()["state"] == "paused", 120, "the run paused")
        before = run.status()["env_steps"]
        time.sleep(3)
        assert run.status()["env_steps"] == before
        assert "pause" in run.events()["kind"].tolist()
        _wait(lambda: "paused" in panel.inner_text(), 30, "'paused' in the page's status line")
        _shot(pg, "paused")
        assert not _page_problems(pg), _page_problems(pg)
    finally:
        try:
            rl.get_run(name).stop(timeout=120)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
