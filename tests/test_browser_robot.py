"""A robot run's dashboard in JupyterLab in headless Chromium: take over, drive with the keys, e-stop.

A notebook launching PPO on a mock arm (real-time clock, 20 Hz, so a human can follow it) and
showing its dashboard is opened in a JupyterLab served against the session cluster. The test
clicks **Take over** in the page, focuses the teleop pad and holds keys: the end effector moves
the keys' way (read from the run's status) and the transitions of the rollouts are flagged
``intervened`` with the keys' action. After **Hand back** the policy moves the arm every step;
**E-STOP** holds it within one control step (the ``estop`` event records where it was held)
and **Clear e-stop** lets the run go on. Screenshots go to test-output/browser_robot_*.png.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import numpy as np
import pytest

from tests.helpers import REPO
from tests.test_browser import (
    _ALL_RAN,
    CHROMIUM,
    OUT,
    _free_port,
    _page_problems,
    _wait,
    open_notebook,
)

pytestmark = pytest.mark.browser

NB = "robot_dashboard.ipynb"
STEP = 0.5  # the panel's default step size

LAUNCH = """\
import rlinf_nb as rl

run = rl.launch({{
    "algorithm": "ppo",
    "env": {{"id": "robot:mock_arm/reach", "num_envs": 1,
             "kwargs": {{"max_steps": 4000, "terminate_on_success": False, "robot_overrides": {{"clock": "real"}},
                         "human": {{"teleop": None, "blend_steps": 2}}}}}},
    "policy": {{"name": "mlp", "kwargs": {{"hidden_sizes": [32, 32]}}}},
    "algo": {{"rollout_steps": 16, "epochs": 2, "minibatch_size": 16}},
    "budget": {{"total_env_steps": 10**7, "stop_metric": None, "stop_value": None}},
    "checkpoint": {{"every": 0}},
    "linger_s": 30,
}}, name={name!r})
"""


@pytest.fixture(scope="module")
def run_name() -> str:
    return f"browser_robot_{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def robot_lab(cluster, session_home: Path, tmp_path_factory, run_name: str):
    """JupyterLab on 127.0.0.1 whose root holds a notebook with a robot run and its dashboard."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api")
    root = tmp_path_factory.mktemp("robotlab")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(LAUNCH.format(name=run_name)),
                nbformat.v4.new_code_cell("dash = rl.dashboard(run, metrics=['intervention_rate'])\ndash")]  # fmt: skip
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / NB)
    port, token = _free_port(), secrets.token_hex(16)
    log = root.parent / "robot_lab.log"
    code = (
        "from rlinf_nb.lab import serve_lab; import sys; "
        f"sys.exit(serve_lab(port={port}, open_path={NB!r}, root_dir={str(root)!r}, token={token!r}))"
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


@pytest.fixture(scope="module")
def robot_page(robot_lab, tmp_path_factory):
    base, token = robot_lab
    OUT.mkdir(exist_ok=True)
    yield from open_notebook(base, token, NB, tmp_path_factory.mktemp("chromium_robot"))


def _shot(pg, name: str) -> None:
    pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .rnb-teleop-pad").last.scroll_into_view_if_needed()
    pg.screenshot(path=str(OUT / f"browser_robot_{name}.png"), full_page=False)


def _env0(run) -> dict:
    return run.status()["robot_envs"][0]


def _hold(pg, key: str, until, timeout: float, what: str, shot: str | None = None):
    """Hold ``key`` on the focused pad until ``until()``; ``shot``: a screenshot before letting go."""
    pg.keyboard.down(key)
    try:
        value = _wait(until, timeout, what, poll=0.1)
        if shot:
            time.sleep(0.6)  # the page's pad label and mode line follow at the next status
            _shot(pg, shot)
        return value
    finally:
        pg.keyboard.up(key)


def test_take_over_keys_and_estop_from_the_page(robot_page, run_name, attached):
    import rlinf_nb as rl

    pg = robot_page
    pg.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        _wait(lambda: pg.evaluate(_ALL_RAN), 600, "the notebook's cells run")
        run = rl.get_run(run_name)
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        pad = panel.locator(".rnb-teleop-pad").last
        pad.wait_for(state="visible", timeout=60_000)
        _wait(lambda: run.status()["update_step"] >= 1, 300, "a first update")
        _wait(lambda: "episode step" in panel.inner_text(), 60, "the robots' state on the page")
        n_cells = pg.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length")
        _shot(pg, "dashboard")

        # Take over from the page: the env is in human mode, the toggle now reads "Hand back".
        panel.locator("button", has_text="Take over").last.click()
        _wait(lambda: _env0(run)["mode"] == "human", 60, "env 0 in human mode")
        _wait(lambda: panel.locator("button", has_text="Hand back").count() > 0, 30, "the Hand back toggle")

        # Hold W: the end effector moves along +x; then A: along +y.
        pad.click()
        start = _env0(run)["ee"]
        _hold(pg, "w", lambda: _env0(run)["ee"][0] > start[0] + 0.03, 60, "the end effector moving along +x",
              shot="teleop")  # fmt: skip
        mid = _env0(run)["ee"]
        assert abs(mid[1] - start[1]) < 0.02 and abs(mid[2] - start[2]) < 0.02, (start, mid)  # x only
        _hold(pg, "a", lambda: _env0(run)["ee"][1] > mid[1] + 0.03, 60, "the end effector moving along +y")
        end = _env0(run)["ee"]
        assert abs(end[0] - mid[0]) < 0.02, (mid, end)

        # Those steps were the human's: flagged intervened, with the keys' action stored.
        def intervened_batch():
            b = run.batch().to_local(["intervened", "actions"])
            iv = np.asarray(b.get("intervened", []), bool)
            forward = np.isclose(b["actions"], [STEP, 0.0, 0.0]).all(-1) if iv.any() else None
            return b if forward is not None and (forward & iv).any() else None

        pad.click()
        pg.keyboard.down("w")
        try:
            batch = _wait(intervened_batch, 60, "a rollout batch with the human's steps", poll=0.2)
        finally:
            pg.keyboard.up("w")
        iv = np.asarray(batch["intervened"], bool)
        human_actions = np.round(batch["actions"][iv], 4)
        allowed = {(0.0, 0.0, 0.0), (STEP, 0.0, 0.0), (0.0, STEP, 0.0)}  # no key, W or A held
        assert {tuple(a) for a in human_actions} <= allowed, {tuple(a) for a in human_actions}
        ev = run.events()
        assert (ev["kind"] == "intervention").any() and ev[ev["kind"] == "intervention"][
            "intervened_steps"
        ].sum() > 0
        assert pg.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length") == n_cells, (
            "the keys reached JupyterLab's notebook shortcuts"
        )

        # Hand back: the policy drives and moves the arm every step.
        panel.locator("button", has_text="Hand back").last.click()
        _wait(lambda: _env0(run)["mode"] == "agent", 60, "env 0 back with the agent")
        seen = set()
        _wait(lambda: seen.add(tuple(_env0(run)["ee"])) or len(seen) >= 3, 60, "the policy moving the arm")

        # E-STOP from the page: the arm holds within one control step.
        panel.locator("button", has_text=re.compile("E-STOP")).last.click()  # not "Clear e-stop"
        _wait(lambda: run.status()["estopped"] == [0], 30, "env 0 e-stopped")
        ev = run.events()
        (at,) = ev[ev["kind"] == "estop"]["at"].iloc[-1]
        assert ev[ev["kind"] == "estop"]["reason"].iloc[-1] == "dashboard"
        held = []
        for _ in range(20):  # 2 s, 40 control periods
            s = _env0(run)
            held.append(s)
            assert np.allclose(s["ee"], at["ee"], atol=1e-9), (s["ee"], at["ee"])
            assert s["episode_step"] <= at["episode_step"] + 1, (s["episode_step"], at["episode_step"])
            time.sleep(0.1)
        assert held[-1]["waiting"]
        _wait(lambda: "E-STOPPED" in panel.inner_text(), 30, "E-STOPPED on the page")
        _shot(pg, "estop")

        # Clear e-stop: the env resets and the rollout goes on.
        steps = run.status()["env_steps"]
        panel.locator("button", has_text="Clear e-stop").last.click()
        _wait(
            lambda: run.status()["estopped"] == [] and run.status()["env_steps"] > steps,
            120,
            "the run going on",
        )
        _wait(lambda: "E-STOPPED" not in panel.inner_text(), 30, "the page showing the e-stop cleared")
        _shot(pg, "cleared")
        assert not _page_problems(pg), _page_problems(pg)
    finally:
        try:
            rl.get_run(run_name).stop(timeout=120)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
