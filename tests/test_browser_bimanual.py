"""A bimanual robot run's dashboard in JupyterLab in headless Chromium: take over one arm.

A notebook launching PPO on ``mock_bimanual/bireach`` (two mock arms, each its own action block)
and showing its dashboard is opened in a JupyterLab served against the session cluster. The
intervention panel shows an **arm** selector (hidden on single-arm robots). The test picks
``right/arm`` in the page, clicks **Take over** and holds E on the teleop pad: the run's status shows
the right arm driven by the human and the left one by the policy, and the rollout batches carry
human-driven action dims only in the right arm's block, with the key's action there. Picking the
left arm hands the right one back. Nothing is timed: every wait is on a condition. Screenshots go
to test-output/browser_bimanual_*.png.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.test_browser import _ALL_RAN, OUT, _page_problems, _wait, page_on_new_notebook

pytestmark = pytest.mark.browser

NB = "bimanual_dashboard.ipynb"
STEP = 0.5  # the panel's default step size
LEFT, RIGHT = "left/arm", "right/arm"
RIGHT_DIMS = slice(3, 6)  # env.action_layout of mock_bimanual/bireach in ee_delta mode

LAUNCH = """\
import rlinf_nb as rl

run = rl.launch({{
    "algorithm": "ppo",
    "env": {{"id": "robot:mock_bimanual/bireach", "num_envs": 1,
             "kwargs": {{"max_steps": 200, "terminate_on_success": False,
                         "human": {{"teleop": None, "blend_steps": 0}}}}}},
    "policy": {{"name": "mlp", "kwargs": {{"hidden_sizes": [32, 32]}}}},
    "algo": {{"rollout_steps": 16, "epochs": 1, "minibatch_size": 16}},
    "budget": {{"total_env_steps": 10**7, "stop_metric": None, "stop_value": None}},
    "checkpoint": {{"every": 0}},
    "linger_s": 30,
}}, name={name!r})
"""


@pytest.fixture(scope="module")
def run_name() -> str:
    return f"browser_bimanual_{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def bimanual_page(cluster, session_home: Path, tmp_path_factory, run_name: str):
    """A Chromium page on a notebook with a bimanual robot run and its dashboard, in a JupyterLab of its own."""
    cells = [LAUNCH.format(name=run_name), "dash = rl.dashboard(run)\ndash"]
    yield from page_on_new_notebook(cells, NB, session_home, tmp_path_factory, "bimanual")


def _arms(run) -> dict[str, str]:
    return {a["path"]: a["mode"] for a in run.status()["robot_envs"][0]["arms"]}


def _shot(pg, name: str) -> None:
    pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .rnb-teleop-pad").last.scroll_into_view_if_needed()
    pg.screenshot(path=str(OUT / f"browser_bimanual_{name}.png"), full_page=False)


def test_take_over_one_arm_of_a_bimanual_robot_from_the_page(bimanual_page, run_name, attached):
    import rlinf_nb as rl

    pg = bimanual_page
    pg.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        _wait(lambda: pg.evaluate(_ALL_RAN), 600, "the notebook's cells run")
        run = rl.get_run(run_name)
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        pad = panel.locator(".rnb-teleop-pad").last
        pad.wait_for(state="visible", timeout=60_000)
        _wait(lambda: run.status()["update_step"] >= 1, 300, "a first update")
        arm_select = panel.locator(".widget-dropdown", has=pg.locator("label", has_text=re.compile(r"^arm$")))
        arm_select = arm_select.locator("select").last
        arm_select.wait_for(state="visible", timeout=60_000)  # shown once the status names two arms
        options = [t.replace("\xa0", " ") for t in arm_select.locator("option").all_inner_texts()]
        assert options == ["all arms", LEFT, RIGHT]
        _wait(lambda: f"{LEFT} agent" in panel.inner_text(), 60, "the per-arm modes on the page")

        arm_select.select_option(label=RIGHT)
        panel.locator("button", has_text="Take over").last.click()
        _wait(lambda: _arms(run) == {LEFT: "agent", RIGHT: "human"}, 60, "the right arm in human mode")
        # the page learns the new mode on its next status poll: under load that can come a little later
        _wait(lambda: "driving env 0 right/arm" in pad.inner_text(), 30, "the pad naming the right arm")

        def right_arm_batch():  # a rollout whose human-driven dims carry the E key's action
            b = run.batch().to_local(["human_mask", "actions"])
            mask = np.asarray(b.get("human_mask", []), bool)
            if not mask.size or not mask.any():
                return None
            held = np.isclose(b["actions"][..., RIGHT_DIMS], [0.0, 0.0, STEP]).all(-1) & mask[..., 3]
            return b if held.any() else None

        pad.click()
        pg.keyboard.down("e")
        try:
            batch = _wait(
                right_arm_batch, 120, "a rollout batch with the human driving the right arm", poll=0.2
            )
            _shot(pg, "right_arm")
        finally:
            pg.keyboard.up("e")
        mask = np.asarray(batch["human_mask"], bool)
        assert not mask[..., :3].any(), "the human drove the left arm's dims"
        driven = np.round(batch["actions"][..., RIGHT_DIMS][mask[..., 3]], 4)
        assert {tuple(a) for a in driven} <= {(0.0, 0.0, 0.0), (0.0, 0.0, STEP)}, {tuple(a) for a in driven}

        # Picking the other arm lets go of the right one first.
        arm_select.select_option(label=LEFT)
        _wait(lambda: _arms(run) == {LEFT: "agent", RIGHT: "agent"}, 60, "the right arm handed back")
        ev = run.events()
        human = ev[ev["kind"] == "human"]
        assert human["command"].tolist()[-1] == "hand_back" and human["arm"].tolist()[-1] == RIGHT
        assert not _page_problems(pg), _page_problems(pg)
    finally:
        try:
            rl.get_run(run_name).stop(timeout=120)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
