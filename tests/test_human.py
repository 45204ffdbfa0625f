"""Human in the loop on robot envs: take over / hand back with blending, marks, scripted humans,
teleop take-over, flags through the vector env, and intervention transitions into RLPD's demos."""

from __future__ import annotations

import numpy as np
import pytest
from rlinf_nb.robots.errors import SpecError

from rlinf_nb.algorithms.sac import RLPDConfig, RLPDLearner, sac_policy_kwargs
from rlinf_nb.envs import make_env
from rlinf_nb.envs.human import HumanInTheLoop, expert_action
from rlinf_nb.envs.robot_env import RobotEnv
from rlinf_nb.policies import make_policy

AGENT = np.array([0.0, 0.5, 0.0], np.float32)  # a fixed "policy": +y


def reach_env(**human) -> RobotEnv:
    env = RobotEnv("mock_arm", "reach", human={"teleop": None, **human}, max_steps=200)
    env.reset(seed=0)
    return env


def test_take_over_applies_the_human_action_and_flags_the_steps():
    env = reach_env(blend_steps=0)
    ee0 = env.task.ee().copy()
    _, _, _, _, info = env.step(AGENT)
    assert not info["intervened"] and info["human_weight"] == 0.0
    np.testing.assert_allclose(info["applied_action"], AGENT)
    env.human_command({"kind": "take_over"})
    _, _, _, _, info = env.step(AGENT)  # taken over, no key yet: hold still
    assert info["intervened"] and np.all(info["applied_action"] == 0)
    ee1 = env.task.ee().copy()
    env.human_command({"kind": "action", "action": [1.0, 0.0, 0.0]})
    for _ in range(3):
        _, _, _, _, info = env.step(AGENT)
        assert info["intervened"]
        np.testing.assert_allclose(info["applied_action"], [1.0, 0.0, 0.0])
    moved = env.task.ee() - ee1
    assert (
        moved[0] > 2.5 * env.config.max_ee_step and abs(moved[1]) < 0.2 * moved[0]
    )  # +x, not the agent's +y
    assert env.task.ee()[1] - ee0[1] > 0  # the agent's first step did move +y
    env.human_command({"kind": "hand_back"})
    _, _, _, _, info = env.step(AGENT)
    assert not info["intervened"]
    np.testing.assert_allclose(info["applied_action"], AGENT)


def test_hand_back_blends_linearly_over_blend_steps():
    env = reach_env(blend_steps=3)
    human = np.array([1.0, 0.0, 0.0])
    env.human_command({"kind": "action", "action": human.tolist()})
    env.step(AGENT)
    env.human_command({"kind": "hand_back"})
    weights = []
    for _ in range(5):
        _, _, _, _, info = env.step(AGENT)
        w = info["human_weight"]
        weights.append(w)
        np.testing.assert_allclose(info["applied_action"], w * human + (1 - w) * AGENT, atol=1e-6)
        assert not info["intervened"]
    np.testing.assert_allclose(weights, [0.75, 0.5, 0.25, 0.0, 0.0])


def test_a_mark_ends_the_episode_with_the_humans_verdict():
    env = reach_env(success_reward=5.0, failure_reward=-1.0)
    env.human_command({"kind": "mark", "mark": "success"})
    _, reward, terminated, _, info = env.step(AGENT)
    assert terminated and info["success"] and reward == 5.0
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(AGENT)
    assert not terminated  # a mark is used once
    env.human_command({"kind": "mark", "mark": "failure"})
    _, reward, terminated, _, info = env.step(AGENT)
    assert terminated and not info["success"] and reward == -1.0


def test_bad_commands_and_envs_without_a_human_are_clear_errors():
    env = reach_env()
    with pytest.raises(ValueError, match="take_over, hand_back, action, mark"):
        env.human_command({"kind": "grab"})
    with pytest.raises(ValueError, match="success, failure"):
        env.human_command({"kind": "mark", "mark": "meh"})
    plain = RobotEnv("mock_arm", "reach")
    with pytest.raises(SpecError, match="no human in the loop"):
        plain.human_command({"kind": "take_over"})
    with pytest.raises(SpecError, match="scripted.every"):
        HumanInTheLoop({"scripted": {"every": 0}})
    with pytest.raises(SpecError, match="unknown|blend"):
        HumanInTheLoop({"blend": 3})


def test_scripted_human_intervenes_on_schedule_and_its_expert_solves_reach():
    env = RobotEnv("mock_arm", "reach", human={"teleop": None, "blend_steps": 0,
                                                "scripted": {"every": 2, "start": 2, "steps": 4}})  # fmt: skip
    flags = []
    for ep in range(3):
        env.reset(seed=ep)
        ep_flags = []
        for _ in range(8):
            _, _, term, trunc, info = env.step(AGENT)
            ep_flags.append(info["intervened"])
            if term or trunc:
                break
        flags.append(ep_flags)
    assert flags[0][:6] == [False, False, True, True, True, True]
    assert not any(flags[1])
    assert flags[2][2] and not flags[2][1]
    # The expert alone reaches every target.
    env.reset(seed=7)
    for _ in range(env.task.config.max_steps):
        _, _, term, _, info = env.step(expert_action(env))
        if term:
            break
    assert info["success"]


def test_teleop_take_over_and_success_button():
    env = RobotEnv("mock_arm", "reach", human={"blend_steps": 0}, max_steps=200)
    env.reset(seed=0)
    teleop = env.robot.component("teleop")
    env.step(AGENT)  # the first tick polls the teleop
    teleop.press("t")  # toggle take-over
    teleop.press("s")  # -x
    env.step(AGENT)  # this tick polls the teleop: the next step is the human's
    x0 = env.task.ee()[0]
    _, _, _, _, info = env.step(AGENT)
    assert info["intervened"] and info["applied_action"][0] == -1.0
    assert env.task.ee()[0] < x0
    teleop.tap("y")
    env.step(AGENT)
    _, _, terminated, _, info = env.step(AGENT)
    assert terminated and info["success"]


def test_vector_env_reports_flags_applied_actions_and_episode_interventions():
    vec = make_env("robot:mock_arm/reach", num_envs=2, seed=0, max_steps=5,
                   human={"teleop": None, "blend_steps": 0})  # fmt: skip
    vec.reset()
    vec.envs[1].human_command({"kind": "action", "action": [0.0, 0.0, 1.0]})
    agent = np.tile(AGENT, (2, 1))
    ended = []
    for _ in range(5):
        res = vec.step(agent)
        np.testing.assert_array_equal(res.intervened, [False, True])
        np.testing.assert_allclose(res.applied_actions, [AGENT, [0.0, 0.0, 1.0]])
        ended += res.episode_intervened
    assert ended == [False, True]  # both truncated at step 5; only env 1 had a human
    res = vec.step(agent)  # env 1 is still driven by the human in its next episode
    assert res.intervened.tolist() == [False, True]
    plain = make_env("CartPole-v1", num_envs=2, seed=0)
    plain.reset()
    assert plain.step(np.zeros(2, int)).intervened is None


def test_rlpd_puts_intervened_transitions_into_the_demo_buffer():
    env = RobotEnv("mock_arm", "reach")
    policy = make_policy("mlp", env.observation_space, env.action_space,
                         **sac_policy_kwargs((32,)))  # fmt: skip
    cfg = RLPDConfig(learning_starts=10_000)
    learner = RLPDLearner(policy, cfg, seed=0)
    T, N, d = 4, 3, env.observation_space.shape[0]
    rng = np.random.default_rng(0)
    intervened = np.zeros((T, N), bool)
    intervened[1:3, 2] = True
    batch = {"obs": rng.normal(size=(T, N, d)).astype(np.float32), "actions": rng.uniform(-1, 1, (T, N, 3)),
             "rewards": rng.normal(size=(T, N)), "next_obs": rng.normal(size=(T, N, d)).astype(np.float32),
             "terminated": np.zeros((T, N), bool), "intervened": intervened}  # fmt: skip
    assert learner.add(batch) == T * N
    assert len(learner.replay) == T * N and len(learner.demos) == 2
    demo = learner.demos.ordered()
    np.testing.assert_allclose(demo["obs"], batch["obs"][1:3, 2])
    np.testing.assert_allclose(demo["actions"], batch["actions"][1:3, 2])
    assert learner.train(0, cfg)["intervention_demos"] == 2
    state = learner.state_dict()
    again = RLPDLearner(policy, cfg, seed=0)
    again.load_state_dict(state)
    assert len(again.demos) == 2 and again.num_intervention_demos == 2
