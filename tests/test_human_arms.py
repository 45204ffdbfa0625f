"""Per-arm take-over on a bimanual robot (``mock_bimanual`` / ``bireach``): the applied action is
the human's on the taken arm's slice and the policy's elsewhere, each arm blends back on its own,
flags per arm survive autoreset, unknown arm paths fail clearly, and HG-DAgger / RLPD learn from
exactly the human-driven dims / transitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rlinf_nb.robots.errors import SpecError

from rlinf_nb.algorithms.hgdagger import (
    HGDAggerConfig,
    HGDAggerLearner,
    intervention_samples,
    masked_bc_loss,
)
from rlinf_nb.algorithms.sac import RLPDConfig, RLPDLearner, sac_policy_kwargs
from rlinf_nb.envs import make_env
from rlinf_nb.envs.human import expert_action
from rlinf_nb.envs.robot_env import RobotEnv
from rlinf_nb.policies import make_policy

AGENT = np.array([0.5, -0.25, 0.0, 0.0, 0.5, 0.25])  # a fixed "policy" for both arms
LEFT, RIGHT = "left/arm", "right/arm"


def bimanual(**human) -> RobotEnv:
    env = RobotEnv("mock_bimanual", "bireach", human={"teleop": None, **human}, max_steps=200)
    env.reset(seed=0)
    return env


def test_the_action_layout_has_one_block_per_arm_and_the_expert_solves_bireach():
    env = RobotEnv("mock_bimanual", "bireach", max_steps=60)
    env.reset(seed=3)
    assert env.arm_paths == (LEFT, RIGHT) and env.action_space.shape == (6,)
    assert env.action_layout == {LEFT: slice(0, 3), RIGHT: slice(3, 6)}
    for _ in range(60):
        _, _, terminated, truncated, info = env.step(expert_action(env))
        if terminated or truncated:
            break
    assert terminated and info["success"] and info["arms_there"].all()


def test_per_arm_take_over_composes_the_action_exactly_and_flags_that_arm():
    env = bimanual(blend_steps=0)
    env.human_command({"kind": "take_over", "arm": LEFT})
    _, _, _, _, info = env.step(AGENT)  # left taken, no key yet: the left arm holds still
    np.testing.assert_allclose(info["applied_action"], [0, 0, 0, *AGENT[3:]])
    env.human_command({"kind": "action", "arm": LEFT, "action": [1.0, 0.0, -1.0]})
    _, _, _, _, info = env.step(AGENT)
    np.testing.assert_allclose(info["applied_action"], [1.0, 0.0, -1.0, *AGENT[3:]])
    assert info["intervened"] and info["intervened_arms"].tolist() == [True, False]
    assert info["arm_weights"].tolist() == [1.0, 0.0] and info["human_weight"] == 1.0
    assert info["human_mask"].tolist() == [True] * 3 + [False] * 3
    env.human_command({"kind": "action", "arm": RIGHT, "action": [0.0, 1.0]})  # short: rest is 0
    _, _, _, _, info = env.step(AGENT)
    np.testing.assert_allclose(info["applied_action"], [1.0, 0.0, -1.0, 0.0, 1.0, 0.0])
    assert info["intervened_arms"].tolist() == [True, True]
    env.human_command({"kind": "hand_back"})  # no arm: both
    _, _, _, _, info = env.step(AGENT)
    np.testing.assert_allclose(info["applied_action"], AGENT)
    assert not info["intervened"] and not info["human_mask"].any()


def test_each_arm_blends_back_on_its_own():
    env = bimanual(blend_steps=3)
    left, right = np.array([1.0, 1.0, 1.0]), np.array([-1.0, 0.0, 1.0])
    env.human_command({"kind": "action", "arm": LEFT, "action": left.tolist()})
    env.human_command({"kind": "action", "arm": RIGHT, "action": right.tolist()})
    env.step(AGENT)
    env.human_command({"kind": "hand_back", "arm": LEFT})  # the right arm stays the human's
    for w in (0.75, 0.5, 0.25, 0.0):
        _, _, _, _, info = env.step(AGENT)
        assert info["arm_weights"].tolist() == pytest.approx([w, 1.0])
        np.testing.assert_allclose(info["applied_action"][:3], w * left + (1 - w) * AGENT[:3], atol=1e-6)
        np.testing.assert_allclose(info["applied_action"][3:], right, atol=1e-6)
        assert info["intervened"] and info["intervened_arms"].tolist() == [False, True]
    assert env.intervention.arm_modes() == {LEFT: ("agent", 0.0), RIGHT: ("human", 1.0)}


def test_scripted_per_arm_flags_survive_autoreset():
    human = {"teleop": None, "blend_steps": 0,
             "scripted_arms": {LEFT: {"every": 1, "start": 0, "steps": 2},
                               RIGHT: {"every": 2, "start": 1, "steps": 2}}}  # fmt: skip
    env = make_env("robot:mock_bimanual/bireach", num_envs=1, seed=0, human=human, max_steps=4,
                   terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    flags, masks, ended = [], [], []
    for _ in range(8):  # two episodes of 4 steps; the 4th step autoresets in the same step
        res = env.step(AGENT[None].astype(np.float32))
        flags.append(res.intervened_arms[0].tolist())
        masks.append(res.human_mask[0].tolist())
        ended += res.episode_intervened
    assert res.arm_paths == (LEFT, RIGHT)
    L, R, B, N = [True, False], [False, True], [True, True], [False, False]
    assert flags == [L, B, R, N, L, L, N, N]  # the right arm's schedule: episodes 0, 2, ...
    assert masks[2] == [False] * 3 + [True] * 3 and masks[0] == [True] * 3 + [False] * 3
    assert ended == [True, True]
    env.close()


def test_unknown_arm_paths_fail_with_a_message_listing_the_arms():
    env = bimanual()
    with pytest.raises(SpecError, match=r"'middle/arm' is not an arm of this env; arms: left/arm, right/arm"):
        env.human_command({"kind": "take_over", "arm": "middle/arm"})
    with pytest.raises(ValueError, match="takes no arm"):
        env.human_command({"kind": "mark", "mark": "success", "arm": LEFT})
    with pytest.raises(
        SpecError, match=r"human.scripted_arms: 'arm' is not an arm of this env; arms: left/arm"
    ):
        RobotEnv("mock_bimanual", "bireach", human={"scripted_arms": {"arm": {}}})
    with pytest.raises(SpecError, match="multi-arm"):
        RobotEnv("mock_bimanual", "bireach", gripper=True)


def _rollout_batch(T: int = 6) -> dict[str, np.ndarray]:
    """[T, 1] on-policy batch of a bimanual env whose scripted human drives the left arm in steps 1-2."""
    human = {"teleop": None, "blend_steps": 1, "scripted_arms": {LEFT: {"every": 1, "start": 1, "steps": 2}}}
    env = make_env("robot:mock_bimanual/bireach", num_envs=1, seed=0, human=human, max_steps=50)
    obs = env.reset(seed=0)
    out: dict[str, list] = {k: [] for k in ("obs", "actions", "intervened", "human_mask", "rewards",
                                            "next_obs", "terminated")}  # fmt: skip
    for _ in range(T):
        res = env.step(AGENT[None].astype(np.float32))
        for key, value in (("obs", obs), ("actions", res.applied_actions), ("intervened", res.intervened),
                           ("human_mask", res.human_mask), ("rewards", res.reward), ("next_obs", res.obs),
                           ("terminated", res.terminated)):  # fmt: skip
            out[key].append(np.asarray(value))
        obs = res.obs
    env.close()
    return {k: np.stack(v) for k, v in out.items()}


def test_hgdagger_labels_only_the_human_dims_and_aggregates_over_rounds():
    batch = _rollout_batch()
    assert batch["intervened"][:, 0].tolist() == [False, True, True, False, False, False]  # step 3 blends
    samples = intervention_samples(batch)
    assert samples["actions"].shape == (2, 6) and samples["mask"].tolist() == [[True] * 3 + [False] * 3] * 2
    np.testing.assert_allclose(samples["obs"], batch["obs"][1:3, 0])
    np.testing.assert_allclose(
        samples["actions"][:, 3:], np.tile(AGENT[3:], (2, 1)), atol=1e-6
    )  # the policy's

    # The masked loss ignores the unlabelled dims: a policy wrong only there has zero loss.
    class Mode:
        def __init__(self, m):
            self.m = m

        def mode(self):
            return self.m

    a = torch.zeros(2, 6)
    wrong_right = torch.tensor([[0.0, 0, 0, 5, 5, 5]] * 2)
    mask = torch.as_tensor(samples["mask"])
    assert float(masked_bc_loss(Mode(wrong_right), a, mask)) == 0.0
    assert float(masked_bc_loss(Mode(wrong_right + 1.0), a, mask)) == pytest.approx(1.0)

    env = RobotEnv("mock_bimanual", "bireach")
    policy = make_policy("mlp", env.observation_space, env.action_space)
    learner = HGDAggerLearner(policy, HGDAggerConfig(batch_size=8, updates_per_iter=3))
    out1 = learner.update(batch, HGDAggerConfig(batch_size=8, updates_per_iter=3))
    out2 = learner.update(batch, HGDAggerConfig(batch_size=8, updates_per_iter=3))
    assert (out1["labelled_added"], out1["dataset_size"]) == (2.0, 2.0) and out1["updates"] == 3.0
    assert (out2["dataset_size"], out2["labelled_total"]) == (4.0, 4.0)  # aggregated, not replaced
    empty = {**batch, "human_mask": np.zeros_like(batch["human_mask"])}
    assert HGDAggerLearner(policy, HGDAggerConfig()).update(empty, HGDAggerConfig())["updates"] == 0.0


def test_rlpd_puts_the_per_arm_intervened_transitions_into_its_demos():
    batch = _rollout_batch()
    env = RobotEnv("mock_bimanual", "bireach")
    policy = make_policy("mlp", env.observation_space, env.action_space, **sac_policy_kwargs((16,)))
    learner = RLPDLearner(policy, RLPDConfig(num_critics=2, critic_hidden_sizes=(16,)))
    learner.add(batch)
    assert len(learner.replay) == 6 and len(learner.demos) == 2 and learner.num_intervention_demos == 2
    np.testing.assert_allclose(learner.demos.ordered()["actions"], batch["actions"][1:3, 0])
