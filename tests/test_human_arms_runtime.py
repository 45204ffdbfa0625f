"""Per-arm human in the loop on the real cluster: HG-DAgger on ``mock_bimanual/bireach`` with a
scripted human per arm; per-arm intervention counts reach the metrics and events and exactly the
human-driven steps reach the learner's aggregated dataset; per-arm commands reach the stepping env."""

from __future__ import annotations

import time
import uuid

import pytest

import rlinf_nb as rl

pytestmark = pytest.mark.usefixtures("attached")

LEFT, RIGHT = "left/arm", "right/arm"


def config(total: int, human: dict) -> dict:
    return {
        "algorithm": "hgdagger",
        "env": {
            "id": "robot:mock_bimanual/bireach",
            "num_envs": 2,
            # episodes of exactly 20 steps = one collect segment: schedules line up with segments
            "kwargs": {"max_steps": 20, "terminate_on_success": False, "human": human},
        },
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [32, 32]}},
        "algo": {"collect_steps": 20, "batch_size": 32, "updates_per_iter": 5},
        "budget": {"total_env_steps": total, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0},
        "linger_s": 30,
    }


def test_scripted_per_arm_humans_reach_the_metrics_events_and_the_hgdagger_dataset():
    human = {"teleop": None, "blend_steps": 2,
             "scripted_arms": {LEFT: {"every": 1, "start": 0, "steps": 5},     # every episode, steps 0-4
                               RIGHT: {"every": 2, "start": 10, "steps": 5}}}  # even episodes, steps 10-14  # fmt: skip
    run = rl.launch(config(160, human), name=f"hg_{uuid.uuid4().hex[:6]}")
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    events = run.events()
    hil = events[events["kind"] == "intervention"]
    assert len(hil) == 4  # one per round: the left arm takes over at step 0 of every episode
    # 2 envs x 5 steps on the left every round; on the right in rounds 0 and 2 only.
    assert hil[f"intervened_steps/{LEFT}"].tolist() == [10, 10, 10, 10]
    assert hil[f"intervened_steps/{RIGHT}"].tolist() == [10, 0, 10, 0]
    assert hil["intervened_steps"].tolist() == [20, 10, 20, 10]  # steps with any arm driven
    assert df[f"intervention_rate/{LEFT}"].tolist() == [0.25] * 4
    assert df[f"intervention_rate/{RIGHT}"].tolist() == [0.25, 0.0, 0.25, 0.0]
    # Every human-driven step (any arm) joined the aggregated dataset; blends did not.
    assert df["labelled_total"].iloc[-1] == hil["intervened_steps"].sum() == 60
    assert df["dataset_size"].tolist() == [20, 30, 50, 60]


def test_per_arm_take_over_and_hand_back_from_the_notebook_reach_the_stepping_env():
    run = rl.launch(config(10**6, {"teleop": None, "blend_steps": 0}), name=f"hg_cmd_{uuid.uuid4().hex[:6]}")
    try:
        deadline = time.time() + 300
        while run.status()["update_step"] < 1 and time.time() < deadline:
            time.sleep(0.5)
        with pytest.raises(ValueError, match=r"arm 'middle/arm'.*arms: left/arm, right/arm"):
            run.take_over(env=1, arm="middle/arm")
        run.human_action([0.0, 0.0, 1.0], env=1, arm=RIGHT)  # takes the right arm of env 1 over
        deadline = time.time() + 300
        while time.time() < deadline:
            df = run.metrics()
            if f"intervention_rate/{RIGHT}" in df and df[f"intervention_rate/{RIGHT}"].iloc[-1] == 0.5:
                break
            time.sleep(0.5)
        last = run.metrics().iloc[-1]
        assert last[f"intervention_rate/{RIGHT}"] == 0.5 and last[f"intervention_rate/{LEFT}"] == 0.0
        arms = {a["path"]: a["mode"] for a in run.status()["robot_envs"][1]["arms"]}  # the dashboard's view
        assert arms == {LEFT: "agent", RIGHT: "human"}
        run.hand_back(env=1, arm=RIGHT)
        deadline = time.time() + 300
        while time.time() < deadline and run.metrics()[f"intervention_rate/{RIGHT}"].iloc[-1] > 0:
            time.sleep(0.5)
        assert run.metrics()[f"intervention_rate/{RIGHT}"].iloc[-1] == 0
        events = run.events()
        human = events[events["kind"] == "human"]
        assert human["command"].tolist() == ["hand_back"] and human["arm"].tolist() == [
            RIGHT
        ]  # actions: no event
    finally:
        run.stop(timeout=120)
