"""E-stop from the run and the dashboard's intervention panel.

Fast tests: an env worker's :class:`RobotControl` on local mock-arm envs (the arm holds at
once, a latched env waits in its reset until cleared), and the panel driven through a
recording comm with an in-memory robot run (what a click or a key press sends). The live test
e-stops and clears envs of a real PPO run on mock arms of the session cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest
from rlinf_nb.runtime.robot_control import RobotControl
from rlinf_nb.widgets import dashboard
from rlinf_nb.widgets.intervention import KEY_HELP, InterventionPanel

from rlinf_nb.envs import make_env
from tests.test_widgets import FakeRun, RecordingComm


@pytest.fixture()
def recording(monkeypatch):
    """Every widget made in the test talks through a :class:`RecordingComm`."""
    import comm

    RecordingComm.log = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(**kw))
    yield RecordingComm
    RecordingComm.log = []


# ----------------------------------------------------------------------------- the env worker's side


def robot_envs(n: int = 2, **kwargs: Any):
    env = make_env("robot:mock_arm/reach", n, seed=0, human={"teleop": None, "blend_steps": 2}, max_steps=500,
                   **kwargs)  # fmt: skip
    env.reset()
    return env, RobotControl(env, "robot:mock_arm/reach")


def test_estop_holds_the_arm_at_once_and_the_env_waits_in_reset_until_cleared():
    env, control = robot_envs()
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(rng.uniform(-1, 1, (2, 3)))
    report = control.command({"kind": "estop", "env": 1, "reason": "test"})
    assert report["ok"]
    held = report["state"][1]
    assert held["estopped"] and held["reason"] == "test" and not report["state"][0]["estopped"]

    stepped = threading.Event()

    def step() -> None:
        env.step(rng.uniform(-1, 1, (2, 3)))  # env 1: one held step, then its reset waits
        stepped.set()

    worker = threading.Thread(target=step, daemon=True)
    worker.start()
    deadline = time.time() + 10
    while not control.state()[1]["waiting"] and time.time() < deadline:
        time.sleep(0.01)
    now = control.state()[1]
    assert now["waiting"] and not stepped.is_set()
    assert np.allclose(now["ee"], held["ee"], atol=1e-12)  # the step after the e-stop did not move it
    assert now["episode_step"] == held["episode_step"] + 1
    assert env.envs[1].arm.last_report.clipped == ("estop",)

    control.command({"kind": "clear_estop", "env": 1})
    worker.join(5)
    assert stepped.is_set()
    after = control.state()[1]
    assert not after["estopped"] and not after["waiting"] and after["episode_step"] == 0  # reset, then on


def test_state_reports_who_drives_and_errors_name_the_problem():
    env, control = robot_envs()
    env.envs[0].human_command({"kind": "take_over"})
    assert [s["mode"] for s in control.state()] == ["human", "agent"]
    env.step(np.zeros((2, 3)))
    env.envs[0].human_command({"kind": "hand_back"})
    env.step(np.zeros((2, 3)))
    assert control.state()[0]["mode"] == "blending" and 0 < control.state()[0]["human_weight"] < 1
    env.step(np.zeros((2, 3)))
    env.step(np.zeros((2, 3)))
    assert control.state()[0]["mode"] == "agent"

    assert "out of range" in control.command({"kind": "estop", "env": 5})["error"]
    assert "allowed values" in control.command({"kind": "explode"})["error"]
    cartpole = RobotControl(make_env("CartPole-v1", 1), "CartPole-v1").command({"kind": "estop"})
    assert not cartpole["ok"] and not cartpole["robot"]
    assert "'CartPole-v1' is not a robot env" in cartpole["error"]


def test_state_reports_each_arm_of_a_multi_arm_robot():
    env = make_env("robot:mock_bimanual/bireach", 2, seed=0, human={"teleop": None, "blend_steps": 2})
    env.reset()
    control = RobotControl(env, "robot:mock_bimanual/bireach")
    env.envs[1].human_command({"kind": "take_over", "arm": "right/arm"})
    env.step(np.zeros((2, 6)))
    arms = control.state()[1]["arms"]
    assert [(a["path"], a["mode"], a["human_weight"]) for a in arms] == [
        ("left/arm", "agent", 0.0), ("right/arm", "human", 1.0)
    ]  # fmt: skip
    assert all(len(a["ee"]) == 3 for a in arms) and control.state()[1]["mode"] == "human"
    assert [a["mode"] for a in control.state()[0]["arms"]] == ["agent", "agent"]
    env.envs[1].human_command({"kind": "hand_back", "arm": "right/arm"})
    env.step(np.zeros((2, 6)))
    assert control.state()[1]["arms"][1]["mode"] == "blending"


def test_a_robot_env_without_the_hook_still_refuses_to_reset_while_latched():
    from rlinf_nb.robots import EStopLatchedError

    env, _control = robot_envs(1)
    env.envs[0].estop_wait = None
    env.envs[0].robot.estop("test")
    with pytest.raises(EStopLatchedError, match="clear_estop"):
        env.step(np.zeros((1, 3)))


# ----------------------------------------------------------------------------- the panel


class FakeRobotRun(FakeRun):
    """FakeRun with two mock-arm envs: human commands and e-stops change what status() shows."""

    def __init__(self, n_envs: int = 2, slow_actions: float = 0.0):
        super().__init__("robot", n_rows=2)
        self.n_envs = n_envs
        self.calls: list[tuple] = []
        self.modes = ["agent"] * n_envs
        self.latched: dict[int, str] = {}
        self.slow_actions = slow_actions

    def config(self) -> dict[str, Any]:
        return {"env": {"id": "robot:mock_arm/reach", "num_envs": self.n_envs, "kwargs": {"human": {}}},
                "placement": {"env": {"num_workers": 1}}}  # fmt: skip

    def status(self) -> dict[str, Any]:
        envs = [{"env": i, "mode": self.modes[i], "human": True, "human_weight": float(self.modes[i] == "human"),
                 "estopped": i in self.latched, "reason": self.latched.get(i, ""), "waiting": i in self.latched,
                 "ee": [0.42, 0.0, 0.19], "episode_step": 3} for i in range(self.n_envs)]  # fmt: skip
        return {**super().status(), "robot_envs": envs, "estopped": sorted(self.latched)}

    def take_over(self, env: int = 0, arm: str | None = None) -> None:
        self.calls.append(("take_over", env, *([arm] if arm else [])))
        self.modes[env] = "human"

    def hand_back(self, env: int = 0, arm: str | None = None) -> None:
        self.calls.append(("hand_back", env, *([arm] if arm else [])))
        self.modes[env] = "blending"

    def human_action(self, action, env: int = 0, arm: str | None = None) -> None:
        time.sleep(self.slow_actions)
        self.calls.append(
            ("human_action", [round(float(x), 6) for x in action], env, *([arm] if arm else []))
        )

    def mark(self, outcome: str, env: int = 0) -> None:
        self.calls.append(("mark", outcome, env))

    def estop(self, reason: str = "dashboard", env: int | None = None) -> dict[str, Any]:
        self.calls.append(("estop", reason, env))
        self.latched.update(dict.fromkeys(range(self.n_envs), reason))
        return {"estopped": sorted(self.latched)}

    def clear_estop(self, env: int | None = None) -> dict[str, Any]:
        self.calls.append(("clear_estop", env))
        self.latched.clear()
        return {"estopped": []}


def page_click(button) -> None:
    """What the page sends when a Button is clicked."""
    _from_page(button, {"method": "custom", "content": {"event": "click"}})


def page_set(widget, **state: Any) -> None:
    """What the page sends when the user changes a control (a toggle, a dropdown)."""
    _from_page(widget, {"method": "update", "state": state, "buffer_paths": []})


def page_key(panel: InterventionPanel, key: str, down: bool = True) -> None:
    """What teleop_keys.js sends for a key press / release on the focused pad."""
    _from_page(panel.pad, {"method": "custom", "content": {"type": "key", "key": key, "down": down}})


def _from_page(widget, data: dict[str, Any]) -> None:
    widget.comm.handle_msg({"content": {"comm_id": widget.comm.comm_id, "data": data}, "buffers": []})


def settle(panel: InterventionPanel) -> None:
    """Wait for the panel's commands so far (their errors show in its message line)."""
    for actions in (panel.actions, panel.estop_actions):
        if actions.last is not None:
            actions.last.exception(5)
    time.sleep(0.05)  # done-callbacks run right after the result is set


def sent_to_page(widget, trait: str) -> list[Any]:
    return [
        d["state"][trait]
        for d, _b in widget.comm.messages()
        if d.get("method") == "update" and trait in d["state"]
    ]


def test_the_panel_is_hidden_for_runs_without_robots(recording):
    dash = dashboard(FakeRun(n_rows=2), start=False)
    dash.poll_once(["status"])
    assert not dash.intervention.visible
    dash.close()


def test_take_over_keys_and_hand_back_send_what_the_page_asked(recording):
    run = FakeRobotRun()
    dash = dashboard(run, start=False)
    panel = dash.intervention
    dash.poll_once(["status"])
    assert panel.visible and "agent" in panel.mode.value and "ee x=+0.420" in panel.mode.value
    assert "W/S" in panel.help.value and KEY_HELP in panel.help.value  # the key map is on the panel

    page_key(panel, "w")  # not taken over yet: keys do nothing
    settle(panel)
    assert run.calls == [] and "Take over" in panel.message.value
    page_key(panel, "w", down=False)

    page_set(panel.takeover_button, value=True)
    settle(panel)
    assert run.calls == [("take_over", 0)] and panel.takeover_button.description == "Hand back"
    assert sent_to_page(panel.pad, "active")[-1] is True

    page_key(panel, "w")
    settle(panel)
    page_key(panel, "a")
    settle(panel)
    page_key(panel, "w", down=False)
    settle(panel)
    page_set(panel.step_size, value=1.0)
    settle(panel)
    page_key(panel, "e")
    settle(panel)
    actions = [c[1] for c in run.calls if c[0] == "human_action"]
    assert actions == [[0.5, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0], [0, 1.0, 0], [0, 1.0, 1.0]]
    assert "driving env 0" in sent_to_page(panel.pad, "label")[-1]

    _from_page(
        panel.pad, {"method": "custom", "content": {"type": "blur"}}
    )  # focus lost: let go of every key
    settle(panel)
    assert run.calls[-1] == ("human_action", [0, 0, 0], 0)

    dash.poll_once(["status"])
    assert "human" in panel.mode.value and panel.takeover_button.value
    page_click(panel.success_button)
    settle(panel)
    assert run.calls[-1] == ("mark", "success", 0)
    page_set(panel.takeover_button, value=False)
    settle(panel)
    assert run.calls[-1] == ("hand_back", 0) and panel.takeover_button.description == "Take over"
    dash.close()


def test_switching_env_hands_the_old_one_back_and_the_toggle_follows_the_run(recording, monkeypatch):
    import rlinf_nb.widgets.intervention as mod

    monkeypatch.setattr(mod, "SYNC_GRACE_S", 0.0)
    run = FakeRobotRun()
    panel = InterventionPanel.for_run(run)
    panel.update(run.status())
    page_set(panel.takeover_button, value=True)
    settle(panel)
    page_set(panel.env_select, index=1)  # a Dropdown syncs its index
    settle(panel)
    assert run.calls == [("take_over", 0), ("hand_back", 0)] and not panel.takeover_button.value
    run.take_over(env=1)  # from code: the panel's toggle follows at the next status
    panel.update(run.status())
    assert panel.takeover_button.value and panel.takeover_button.description == "Hand back"
    assert run.calls[-1] == ("take_over", 1)  # following the run sent nothing back
    panel.close()


def test_estop_is_latched_on_the_page_and_never_waits_behind_key_actions(recording):
    run = FakeRobotRun(slow_actions=1.0)
    panel = InterventionPanel.for_run(run)
    panel.update(run.status())
    assert panel.clear_button.disabled and panel.estop_button.button_style == "danger"
    page_set(panel.takeover_button, value=True)
    page_key(panel, "w")
    page_key(panel, "w", down=False)
    t0 = time.perf_counter()
    page_click(panel.estop_button)
    panel.estop_actions.wait(5)
    assert time.perf_counter() - t0 < 0.5, "the e-stop waited behind a slow human action"
    assert ("estop", "dashboard", None) in run.calls
    assert sent_to_page(panel.estop_button, "description")[-1] == "E-STOPPED"
    panel.update(run.status())
    assert "E-STOPPED" in panel.mode.value and "(dashboard)" in panel.mode.value
    assert not panel.clear_button.disabled and panel.estop_button.description == "E-STOPPED"

    page_click(panel.clear_button)
    settle(panel)
    commands = [c for c in run.calls if c[0] != "human_action"]
    assert commands[-1] == ("clear_estop", None)
    panel.update(run.status())
    assert panel.estop_button.description == "E-STOP" and panel.clear_button.disabled

    page_key(panel, "escape")  # Esc on the pad is an e-stop too
    settle(panel)
    assert run.calls[-1] == ("estop", "keyboard", None)
    # no backlog of key actions: at most one per job, the newest (here: the release)
    sent = [c[1] for c in run.calls if c[0] == "human_action"]
    assert 1 <= len(sent) <= 2 and sent[-1] == [0, 0, 0]
    panel.close()


def test_failed_take_over_puts_the_toggle_back(recording):
    run = FakeRobotRun()

    def refuse(env: int = 0, arm: str | None = None) -> None:
        raise ValueError("this env has no human in the loop")

    run.take_over = refuse
    panel = InterventionPanel.for_run(run)
    page_set(panel.takeover_button, value=True)
    settle(panel)
    assert not panel.takeover_button.value and "no human in the loop" in panel.message.value
    panel.close()


LEFT, RIGHT = "left/arm", "right/arm"


class FakeBimanualRun(FakeRobotRun):
    """FakeRobotRun with two arms per env: take-overs and hand-backs act per arm (None: every arm)."""

    def __init__(self) -> None:
        super().__init__(n_envs=2)
        self.arm_modes = [{LEFT: "agent", RIGHT: "agent"} for _ in range(self.n_envs)]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "env": {"id": "robot:mock_bimanual/bireach", "num_envs": self.n_envs,
                                            "kwargs": {"human": {}}}}  # fmt: skip

    def status(self) -> dict[str, Any]:
        st = super().status()
        for env in st["robot_envs"]:
            modes = self.arm_modes[env["env"]]
            env["mode"] = "human" if "human" in modes.values() else "agent"
            env["arms"] = [{"path": p, "mode": m, "human_weight": float(m == "human"), "ee": [0.4, y, 0.2]}
                           for (p, m), y in zip(modes.items(), (0.1, -0.1), strict=True)]  # fmt: skip
        return st

    def _set(self, env: int, arm: str | None, mode: str) -> None:
        for path in [arm] if arm else list(self.arm_modes[env]):
            self.arm_modes[env][path] = mode

    def take_over(self, env: int = 0, arm: str | None = None) -> None:
        super().take_over(env, arm)
        self._set(env, arm, "human")

    def hand_back(self, env: int = 0, arm: str | None = None) -> None:
        super().hand_back(env, arm)
        self._set(env, arm, "agent")


def test_single_arm_robots_show_no_arm_selector(recording):
    run = FakeRobotRun()
    panel = InterventionPanel.for_run(run)
    panel.update(run.status())
    assert panel.arm_select.layout.display == "none" and panel.arm is None
    panel.close()


def test_the_arm_selector_takes_over_and_drives_one_arm_of_a_bimanual_robot(recording, monkeypatch):
    import rlinf_nb.widgets.intervention as mod

    monkeypatch.setattr(mod, "SYNC_GRACE_S", 0.0)
    run = FakeBimanualRun()
    dash = dashboard(run, start=False)
    panel = dash.intervention
    dash.poll_once(["status"])
    assert panel.arm_select.layout.display is None  # shown: the robot has two arms
    assert [v for _label, v in panel.arm_select.options] == ["", LEFT, RIGHT]
    assert f"{LEFT} <span" in panel.mode.value and f"{RIGHT} <span" in panel.mode.value
    assert "agent</span> (ee x=+0.400 y=-0.100 z=+0.200)" in panel.mode.value  # each arm's own end effector
    assert "ee x=+0.420" not in panel.mode.value  # not the env's first-arm summary

    page_set(panel.arm_select, index=2)  # the right arm
    page_set(panel.takeover_button, value=True)
    settle(panel)
    page_key(panel, "w")
    settle(panel)
    assert run.calls == [("take_over", 0, RIGHT), ("human_action", [0.5, 0, 0], 0, RIGHT)]
    assert "driving env 0 right/arm" in sent_to_page(panel.pad, "label")[-1]
    dash.poll_once(["status"])
    assert panel.takeover_button.value  # the right arm is the human's

    page_set(panel.arm_select, index=1)  # choosing the left arm lets go of the right one first
    settle(panel)
    assert run.calls[-1] == ("hand_back", 0, RIGHT) and not panel.takeover_button.value
    run.take_over(env=0, arm=LEFT)  # from code: the toggle follows the selected arm's mode
    dash.poll_once(["status"])
    assert panel.takeover_button.value
    page_set(panel.arm_select, index=2)
    settle(panel)
    dash.poll_once(["status"])
    assert run.arm_modes[0] == {LEFT: "agent", RIGHT: "agent"} and not panel.takeover_button.value

    page_set(panel.arm_select, index=0)  # every arm: the same key step for each arm's slice
    page_set(panel.takeover_button, value=True)
    settle(panel)
    page_key(panel, "e")
    settle(panel)
    assert run.calls[-2:] == [("take_over", 0), ("human_action", [0, 0, 0.5, 0, 0, 0.5], 0)]
    dash.close()


# ----------------------------------------------------------------------------- on the cluster


CHANNEL_TIMEOUT_S = 15.0  # the e-stop hold's run: placement.channel_timeout_s, held past


def robot_run_config(total: int = 10**7) -> dict[str, Any]:
    return {
        "algorithm": "ppo",
        "env": {
            "id": "robot:mock_arm/reach",
            "num_envs": 2,
            "kwargs": {
                "max_steps": 200,
                "terminate_on_success": False,
                "human": {"teleop": None, "blend_steps": 2},
            },
        },
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [32, 32]}},
        "algo": {"rollout_steps": 16, "epochs": 2, "minibatch_size": 32},
        "budget": {"total_env_steps": total, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0},
        "linger_s": 30,
    }


def _wait(cond, timeout: float, what: str, poll: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} not seen within {timeout:.0f} s")


@pytest.mark.usefixtures("attached")
def test_estop_and_clear_from_the_run_reach_the_stepping_robots():
    import rlinf_nb as rl

    cfg = robot_run_config()
    cfg["placement"] = {"env_to_rollout": "direct"}  # the channel path: the test below
    run = rl.launch(cfg, name=f"estop_{uuid.uuid4().hex[:6]}")
    try:
        _wait(lambda: run.status()["update_step"] >= 1, 300, "a first update")
        st = run.status()
        assert [s["env"] for s in st["robot_envs"]] == [0, 1] and st["estopped"] == []

        # The human drives env 0 along +x: its end effector goes that way.
        run.take_over(env=0)
        run.human_action([1.0, 0.0, 0.0], env=0)
        _wait(lambda: run.status()["robot_envs"][0]["mode"] == "human", 30, "env 0 in human mode")
        x0 = run.status()["robot_envs"][0]["ee"][0]
        _wait(lambda: run.status()["robot_envs"][0]["ee"][0] > x0 + 0.03 or
              run.status()["robot_envs"][0]["ee"][0] > 0.6, 60, "env 0's end effector moving along +x")  # fmt: skip

        # Env 1 is driven by the (random) policy: it moves every step until the e-stop.
        seen = {tuple(run.status()["robot_envs"][1]["ee"]) for _ in range(20)}
        assert len(seen) > 1, "env 1's arm did not move before the e-stop"
        report = run.estop(reason="test", env=1)
        assert report["estopped"] == [1]
        at_estop = report["robot_envs"][1]
        states = [run.status()["robot_envs"][1] for _ in range(20)]
        for s in states:
            assert np.allclose(s["ee"], at_estop["ee"], atol=1e-9), (s["ee"], at_estop["ee"])
            assert s["episode_step"] <= at_estop["episode_step"] + 1  # at most the one held step
        _wait(lambda: run.status()["robot_envs"][1]["waiting"], 60, "env 1 waiting in its reset")
        st = run.status()
        assert st["estopped"] == [1] and st["robot_envs"][1]["reason"] == "test"
        assert st["state"] != "failed"
        steps = st["env_steps"]
        time.sleep(1.0)
        assert run.status()["env_steps"] == steps  # the worker's rollout waits for the clear

        run.clear_estop(env=1)
        _wait(lambda: run.status()["env_steps"] > steps, 120, "the rollout going on after clear_estop")
        st = run.status()
        assert st["estopped"] == [] and not st["robot_envs"][1]["waiting"]

        assert run.estop()["estopped"] == [0, 1]  # every env
        assert run.clear_estop()["estopped"] == []
        with pytest.raises(ValueError, match="out of range"):
            run.estop(env=7)
        ev = run.events()
        stops = ev[ev["kind"] == "estop"]
        assert stops["envs"].tolist() == [[1], [0, 1]] and stops["reason"].tolist() == ["test", "dashboard"]
        (held,) = stops["at"].iloc[0]  # where the arm was held, for the record
        assert (
            held["env"] == 1
            and np.allclose(held["ee"], at_estop["ee"])
            and held["episode_step"] == at_estop["episode_step"]
        )
        assert ev[ev["kind"] == "clear_estop"]["envs"].tolist() == [[1], [0, 1]]
        run.hand_back(env=0)
        assert run.status()["state"] in ("running", "paused", "stepping")
    finally:
        run.stop(timeout=120)


@pytest.mark.usefixtures("attached")
def test_an_estop_held_past_the_channel_timeout_leaves_a_channel_mode_run_waiting():
    """In ``channel`` mode the rollout worker reads its env workers' obs from a channel. An e-stop held longer
    than the run's channel timeout (``placement.channel_timeout_s``, here 15 s instead of the default 60 s so
    that the hold is short) must leave the run waiting for the clear, as in ``direct`` mode: the controller's
    abort, not a timeout, wakes those reads."""
    import rlinf_nb as rl

    cfg = robot_run_config()
    cfg["placement"] = {"env_to_rollout": "channel", "channel_timeout_s": CHANNEL_TIMEOUT_S}
    run = rl.launch(cfg, name=f"estop_ch_{uuid.uuid4().hex[:6]}")
    try:
        _wait(lambda: run.status()["update_step"] >= 1, 300, "a first update")
        run.estop(reason="long", env=1)
        _wait(lambda: run.status()["robot_envs"][1]["waiting"], 60, "env 1 waiting in its reset")
        steps = run.status()["env_steps"]
        time.sleep(CHANNEL_TIMEOUT_S + 5.0)
        st = run.status()
        assert st["state"] not in ("failed", "stopped"), st.get("error")
        assert st["env_steps"] == steps and st["estopped"] == [1]
        run.clear_estop(env=1)
        _wait(lambda: run.status()["env_steps"] > steps, 120, "the rollout going on after clear_estop")
        assert run.status()["state"] in ("running", "paused", "stepping")
    finally:
        run.stop(timeout=120)


@pytest.mark.usefixtures("attached")
def test_a_rollout_worker_lost_under_an_estop_shows_as_failing_and_recovers_after_the_clear():
    """SIGKILL the rollout worker of a channel-mode run while an e-stop holds env 1 in its reset. The held env
    cannot take the rollout's abort until it is cleared, so the rollout's end waits for the clear; meanwhile
    the status says what will end it (``failing``) and a ``worker_failed`` event records it. After the clear
    the controller recovers: Ray's restarted rollout worker serves the repeated rollout."""
    import rlinf_nb as rl
    from tests.helpers import sigkill_worker

    cfg = robot_run_config()
    cfg["placement"] = {"env_to_rollout": "channel"}
    run = rl.launch(cfg, name=f"estop_lost_{uuid.uuid4().hex[:6]}")
    try:
        _wait(lambda: run.status()["update_step"] >= 1, 300, "a first update")
        run.estop(reason="held", env=1)
        _wait(lambda: run.status()["robot_envs"][1]["waiting"], 60, "env 1 waiting in its reset")
        assert run.status()["failing"] is None
        sigkill_worker(run, "rollout")
        failing = _wait(lambda: run.status()["failing"], 60, "the lost rollout worker in status()['failing']")
        assert failing.startswith("a rollout worker was lost during the rollout"), failing
        st = run.status()
        assert st["state"] == "running" and st["estopped"] == [1]
        ev = run.events()
        (detail,) = ev[ev["kind"] == "worker_failed"]["detail"]
        assert detail == failing
        steps = st["env_steps"]

        run.clear_estop(env=1)
        _wait(lambda: run.status()["env_steps"] > steps, 120, "the repeated rollout after clear_estop")
        st = run.status()
        assert st["state"] == "running" and st["failing"] is None, st.get("error")
        ev = run.events()
        lost = ev[(ev["kind"] == "recovery") & (ev["group"] == "rollout")]
        assert lost["action"].tolist()[0] == "restarted", lost
    finally:
        run.stop(timeout=120)
