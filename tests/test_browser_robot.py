"""A robot run's dashboard in JupyterLab in headless Chromium: take over, drive with the keys, e-stop.

A notebook launching PPO on the ManiSkill Panda (``sim_panda``: real physics and a rendered
camera) and showing its dashboard is opened in a JupyterLab served against the session cluster.
The spec's clock is simulated (the env steps as fast as the CPU allows); the test paces it with
the real clock (20 Hz, so a human can follow it; the scene is only touched from the env's thread:
the per-tick watchdog replaces the background one). The test clicks **Take over** in the page,
focuses the teleop pad and holds keys: the Panda's end effector moves the keys' way (read from
the run's status; each key is the one with room to move in the workspace) and the transitions of
the rollouts are flagged ``intervened`` with the keys' action. After **Hand back** the policy
moves the arm every step; **E-STOP** holds it within one control step (the ``estop`` event
records where it was when the latch engaged; one period of momentum later nothing moves) and
**Clear e-stop** lets the run go on. Nothing is timed: every wait is on a condition. Screenshots
go to test-output/browser_robot_*.png.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from rlinf_nb.robots.spec import load_spec

from tests.test_browser import (
    _ALL_RAN,
    OUT,
    _page_problems,
    _wait,
    page_on_new_notebook,
)

pytestmark = pytest.mark.browser

NB = "robot_dashboard.ipynb"
STEP = 0.5  # the panel's default step size
KEYS = {(0, 1): "w", (0, -1): "s", (1, 1): "a", (1, -1): "d"}  # (axis, sign) -> the pad's key
ONE_STEP = 0.03  # m: the most the hand moves in one control period (max_ee_step 2 cm, plus coasting)

LAUNCH = """\
import rlinf_nb as rl

run = rl.launch({{
    "algorithm": "ppo",
    "env": {{"id": "robot:sim_panda/reach", "num_envs": 1, "render_every": 20,
             "kwargs": {{"max_steps": 10**6, "terminate_on_success": False,
                         "robot_overrides": {{"clock": "real", "components.arm.safety.watchdog_thread": False,
                                              "components.cams/front.config": {{"name": "front", "width": 64,
                                                                                "height": 64}}}},
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
def robot_page(cluster, session_home: Path, tmp_path_factory, run_name: str):
    """A Chromium page on a notebook with a robot run and its dashboard, in a JupyterLab of its own."""
    cells = [LAUNCH.format(name=run_name), "dash = rl.dashboard(run, metrics=['intervention_rate'])\ndash"]
    yield from page_on_new_notebook(cells, NB, session_home, tmp_path_factory, "robot")


def _shot(pg, name: str) -> None:
    pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .rnb-teleop-pad").last.scroll_into_view_if_needed()
    pg.screenshot(path=str(OUT / f"browser_robot_{name}.png"), full_page=False)


def _env0(run) -> dict:
    return run.status()["robot_envs"][0]


def _key_with_room(run, axis: int) -> tuple[str, int]:
    """The pad key (and its sign) that moves the end effector along ``axis`` toward the farther wall."""
    (safety,) = [c.safety for c in load_spec("sim_panda").components if c.path == "arm"]
    low, high = safety["workspace_low"], safety["workspace_high"]
    ee = _env0(run)["ee"]
    sign = 1 if high[axis] - ee[axis] >= ee[axis] - low[axis] else -1
    return KEYS[(axis, sign)], sign


def _settled(run) -> list[float]:
    """Env 0's end effector once it has stopped (no key held: the human's action holds still)."""
    last = [_env0(run)["ee"]]

    def still():
        ee = _env0(run)["ee"]
        done = np.allclose(ee, last[0], atol=1e-3)
        last[0] = ee
        return ee if done else None

    return _wait(still, 60, "the end effector settling", poll=0.3)


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
        frames = _wait(run.latest_frames, 300, "a camera frame from the sim")
        assert frames[0]["cameras"]["cams/front"].shape == (64, 64, 3)  # the Panda's front camera, rendered
        n_cells = pg.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length")
        _shot(pg, "dashboard")

        # Take over from the page: the env is in human mode, the toggle now reads "Hand back".
        panel.locator("button", has_text="Take over").last.click()
        _wait(lambda: _env0(run)["mode"] == "human", 60, "env 0 in human mode")
        _wait(lambda: panel.locator("button", has_text="Hand back").count() > 0, 30, "the Hand back toggle")

        # Hold W (+x) or S (-x), whichever has room: the end effector moves that way; then A (+y) or D (-y).
        pad.click()
        x_key, x_sign = _key_with_room(run, 0)
        start = _settled(run)
        _hold(pg, x_key, lambda: x_sign * (_env0(run)["ee"][0] - start[0]) > 0.04, 60,
              f"the end effector moving along {x_sign:+d}x", shot="teleop")  # fmt: skip
        mid = _settled(run)
        assert x_sign * (mid[0] - start[0]) > 0.04, (start, mid)
        assert abs(mid[1] - start[1]) < 0.02 and abs(mid[2] - start[2]) < 0.02, (start, mid)  # x only
        y_key, y_sign = _key_with_room(run, 1)
        _hold(pg, y_key, lambda: y_sign * (_env0(run)["ee"][1] - mid[1]) > 0.04, 60,
              f"the end effector moving along {y_sign:+d}y")  # fmt: skip
        end = _settled(run)
        assert abs(end[0] - mid[0]) < 0.02 and abs(end[2] - mid[2]) < 0.02, (mid, end)  # y only

        # Those steps were the human's: flagged intervened, with the keys' action stored.
        def intervened_batch():
            b = run.batch().to_local(["intervened", "actions"])
            iv = np.asarray(b.get("intervened", []), bool)
            forward = np.isclose(b["actions"], [x_sign * STEP, 0.0, 0.0]).all(-1) if iv.any() else None
            return b if forward is not None and (forward & iv).any() else None

        pad.click()
        pg.keyboard.down(x_key)
        try:
            batch = _wait(intervened_batch, 60, "a rollout batch with the human's steps", poll=0.2)
        finally:
            pg.keyboard.up(x_key)
        iv = np.asarray(batch["intervened"], bool)
        human_actions = np.round(batch["actions"][iv], 4)
        # no key, the x key or the y key held
        allowed = {(0.0, 0.0, 0.0), (x_sign * STEP, 0.0, 0.0), (0.0, y_sign * STEP, 0.0)}
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

        # E-STOP from the page: the arm holds within one control step. The step under way when the latch
        # engaged may still run one period of physics; then the env waits in its reset and nothing moves.
        panel.locator("button", has_text=re.compile("E-STOP")).last.click()  # not "Clear e-stop"
        _wait(lambda: run.status()["estopped"] == [0], 30, "env 0 e-stopped")
        ev = run.events()
        (at,) = ev[ev["kind"] == "estop"]["at"].iloc[-1]
        assert ev[ev["kind"] == "estop"]["reason"].iloc[-1] == "dashboard"
        held = _wait(lambda: (s := _env0(run))["waiting"] and s, 60, "env 0 waiting for the clear")
        assert np.abs(np.subtract(held["ee"], at["ee"])).max() < ONE_STEP, (held["ee"], at["ee"])
        for _ in range(20):  # 2 s, 40 control periods
            s = _env0(run)
            assert np.allclose(s["ee"], held["ee"], atol=1e-9), (s["ee"], held["ee"])
            assert s["episode_step"] <= at["episode_step"] + 1, (s["episode_step"], at["episode_step"])
            assert s["waiting"], s
            time.sleep(0.1)
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
