"""The package's scripted experts solve their ManiSkill tasks (they are the demos BC and RLPD learn from)."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_nb.envs.scripted import SCRIPTED_POLICIES, pickcube_policy, scripted_episodes

KWARGS = {"reward_mode": "normalized_dense", "sim_backend": "physx_cpu"}


@pytest.mark.parametrize("env_id", sorted(SCRIPTED_POLICIES))
def test_each_scripted_expert_solves_its_task(env_id):
    _, stats = scripted_episodes(env_id, 6, seed=3, successful_only=False, **KWARGS)
    assert stats["tried"] == 6
    assert stats["success_rate"] >= 5 / 6, stats


def test_pickcube_expert_opens_over_the_cube_closes_at_it_and_carries_it_to_the_goal():
    obs = np.zeros((3, 42), np.float32)
    obs[:, 29:32] = [0.0, 0.0, 0.02]  # the cube
    obs[:, 26:29] = [0.1, 0.1, 0.3]  # the goal
    obs[0, 19:22] = [0.1, 0.0, 0.2]  # far from the cube: go over it, gripper open
    obs[1, 19:22] = [0.0, 0.0, 0.02]  # at the cube, not grasped yet: close
    obs[2, 19:22] = [0.0, 0.0, 0.05]  # grasped (lifted): towards the goal, closed
    obs[2, 18] = 1.0
    act = pickcube_policy(obs)
    assert act[0, 3] == 1.0 and act[0, 0] < 0 and act[0, 2] < 0  # towards x=0 and down to 5 cm over the cube
    assert act[1, 3] == -1.0 and np.allclose(act[1, :3], 0.0)
    assert act[2, 3] == -1.0 and (act[2, :3] > 0).all()
