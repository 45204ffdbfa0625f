"""Human in the loop on the real cluster: RLPD on a mock robot with a scripted human; the
interventions reach the learner's demo buffer, show up as metrics and events, and a notebook's
take-over / hand-back commands reach the env while it is stepping."""

from __future__ import annotations

import time
import uuid

import pytest

import rlinf_nb as rl
from rlinf_nb.algorithms.sac import sac_policy_kwargs

pytestmark = pytest.mark.usefixtures("attached")


def hil_config(total: int) -> dict:
    return {
        "algorithm": "rlpd",
        "env": {
            "id": "robot:mock_arm/reach",
            "num_envs": 2,
            "kwargs": {
                "max_steps": 20,
                "human": {"teleop": None, "blend_steps": 2, "scripted": {"every": 2, "start": 0, "steps": 8}},
            },
        },
        "policy": {"name": "mlp", "kwargs": sac_policy_kwargs([64, 64])},
        "algo": {"collect_steps": 20, "learning_starts": 80, "batch_size": 32, "utd": 0.25},
        "budget": {"total_env_steps": total, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0},
        "linger_s": 30,
    }


def test_scripted_human_interventions_reach_rlpds_demo_buffer_and_the_curves():
    run = rl.launch(hil_config(400), name=f"hil_{uuid.uuid4().hex[:6]}")
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    events = run.events()
    hil = events[events["kind"] == "intervention"]
    assert len(hil) > 0
    # Every intervened transition (scripted human: steps 0..7 of every other episode) went to the demos.
    total_intervened = int(hil["intervened_steps"].sum())
    assert total_intervened > 0 and df["intervention_demos"].iloc[-1] == total_intervened
    assert df["demo_size"].iloc[-1] == total_intervened
    # Rate per segment: 2 envs x 20 steps; one episode in two has 8 human steps.
    assert 0 < df["intervention_rate"].max() <= 0.5
    assert "success_without_intervention" in df.columns


def test_take_over_and_hand_back_from_the_notebook_reach_the_stepping_env():
    cfg = hil_config(10**6)
    cfg["env"]["kwargs"]["human"] = {"teleop": None, "blend_steps": 0}  # no scripted human: only commands
    run = rl.launch(cfg, name=f"hil_cmd_{uuid.uuid4().hex[:6]}")
    try:
        deadline = time.time() + 300
        while run.status()["update_step"] < 2 and time.time() < deadline:
            time.sleep(0.5)
        with pytest.raises(ValueError, match="out of range"):
            run.take_over(env=5)
        with pytest.raises(ValueError, match="success, failure"):
            run.mark("meh", env=0)
        run.take_over(env=1)
        run.human_action([0.0, 0.0, 1.0], env=1)
        deadline = time.time() + 300
        rates: list[float] = []
        while time.time() < deadline:
            df = run.metrics()
            rates = df["intervention_rate"].dropna().tolist()
            if rates and rates[-1] >= 0.5 and df["intervention_demos"].iloc[-1] > 0:
                break
            time.sleep(0.5)
        assert rates and rates[-1] == pytest.approx(0.5)  # env 1 of 2 driven by the human, every step
        run.hand_back(env=1)
        deadline = time.time() + 300
        while time.time() < deadline and run.metrics()["intervention_rate"].iloc[-1] > 0:
            time.sleep(0.5)
        assert run.metrics()["intervention_rate"].iloc[-1] == 0
        kinds = run.events()
        human = kinds[kinds["kind"] == "human"]
        assert human["command"].tolist() == ["take_over", "hand_back"] and set(human["env"]) == {1}
    finally:
        run.stop(timeout=120)
