"""The ``maniskill:`` backend of make_env: CPU physx, state and rgb observations, bookkeeping.

Needs ManiSkill 3 and a Vulkan device (lavapipe on CPU-only machines, see RECIPES.md); the
module is skipped when SAPIEN finds none.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf_nb.config import ConfigError
from rlinf_nb.envs import make_env

pytest.importorskip("mani_skill")
# ManiSkill calls np.isnan on torch tensors (its own code, NumPy 2 deprecation).
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

ENV = "maniskill:PushCube-v1"


@pytest.fixture(scope="module")
def state_env():
    try:
        env = make_env(ENV, num_envs=2, seed=0, max_episode_steps=10)
    except RuntimeError as exc:  # SAPIEN: "failed to find a rendering device"
        pytest.skip(f"ManiSkill cannot start here: {exc}")
    yield env
    env.close()


def _actions(n: int, steps: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, 8)).astype(np.float32)


def test_backend_registers_without_importing_maniskill():
    code = (
        "import sys, rlinf_nb.envs as e; "
        "assert 'maniskill' in e._BACKENDS, e._BACKENDS; "
        "assert 'mani_skill' not in sys.modules and 'sapien' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_state_construct_step_and_truncation(state_env):
    env = state_env
    assert env.num_envs == 2 and env.sim_backend == "physx_cpu" and env.max_episode_steps == 10
    assert env.observation_space.shape == (35,) and env.action_space.shape == (8,)
    obs = env.reset(seed=0)
    assert obs.shape == (2, 35) and obs.dtype == np.float32
    actions = _actions(2, 10)
    total = np.zeros(2)
    for t in range(10):
        res = env.step(actions[t])
        assert res.obs.shape == (2, 35) and res.reward.dtype == np.float32
        assert res.terminated.shape == res.truncated.shape == (2,)
        total += res.reward
        if t < 9:
            assert res.final_obs is None and not res.truncated.any()
    # random actions do not solve PushCube in 10 steps: both hit the time limit together
    assert res.truncated.all() and not res.terminated.any()
    assert res.episode_lengths == [10, 10]
    np.testing.assert_allclose(res.episode_returns, total, rtol=1e-5)
    assert res.successes == [0.0, 0.0]
    assert res.final_obs.shape == (2, 35)
    # the returned obs is a fresh episode, the final obs the true last one
    assert not np.allclose(res.final_obs, res.obs)


def test_final_obs_is_the_true_last_observation():
    """A twin env with a longer time limit, same seed and actions, sees final_obs at step 10."""
    short = make_env(ENV, num_envs=1, seed=5, max_episode_steps=4)
    long = make_env(ENV, num_envs=1, seed=5, max_episode_steps=50)
    short.reset(), long.reset()
    actions = _actions(1, 4, seed=1)
    for t in range(4):
        res_s, res_l = short.step(actions[t]), long.step(actions[t])
    assert res_s.truncated[0] and not res_l.truncated[0]
    np.testing.assert_allclose(res_s.final_obs, res_l.obs, rtol=1e-6, atol=1e-6)
    short.close(), long.close()


def test_success_terminates_and_is_counted(state_env):
    """ManiSkill terminates on info["success"]; fake a success in env 1 at its 3rd step."""
    env = state_env
    env.reset(seed=1)
    base = env._envs[1].unwrapped
    real_evaluate = base.evaluate
    calls = {"n": 0}

    def evaluate(*args, **kwargs):
        info = real_evaluate(*args, **kwargs)
        calls["n"] += 1
        info["success"] = torch.tensor([calls["n"] == 3])
        return info

    base.evaluate = evaluate
    try:
        actions = _actions(2, 3, seed=2)
        for t in range(3):
            res = env.step(actions[t])
    finally:
        base.evaluate = real_evaluate
    assert res.terminated.tolist() == [False, True] and not res.truncated.any()
    assert res.episode_lengths == [3] and res.successes == [1.0]
    assert res.final_obs is not None and not res.final_obs[0].any() and res.final_obs[1].any()
    # env 1 restarted: its next episode ends at the time limit, 7 steps after env 0's
    lengths = []
    for t in range(10):
        lengths += env.step(_actions(2, 1, seed=3 + t)[0]).episode_lengths
    assert lengths == [10, 10]


def test_seeds_reproduce_including_autoresets():
    def trajectory(seed):
        env = make_env(ENV, num_envs=2, seed=seed, max_episode_steps=5)
        obs = [env.reset()]
        for a in _actions(2, 12, seed=4):
            obs.append(env.step(a).obs)
        env.close()
        return np.stack(obs)

    a, b, c = trajectory(7), trajectory(7), trajectory(8)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[0], c[0])
    assert not np.allclose(a[0, 0], a[0, 1])  # env i is seeded with seed + i
    assert not np.allclose(a[0], a[5])  # the auto-reset episode (after 5 steps) starts elsewhere


def test_rgb_obs_dict_with_cnn_policy():
    from rlinf_nb.policies import make_policy

    env = make_env(ENV, num_envs=2, seed=0, obs_mode="rgb", camera_width=64, camera_height=64,
                   max_episode_steps=3, render_mode="rgb_array")  # fmt: skip
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"state", "rgb_base_camera"}
    assert space["rgb_base_camera"].shape == (64, 64, 3) and space["rgb_base_camera"].dtype == np.uint8
    obs = env.reset()
    assert obs["rgb_base_camera"].shape == (2, 64, 64, 3) and obs["rgb_base_camera"].dtype == np.uint8
    assert obs["state"].shape == (2, *space["state"].shape) and obs["rgb_base_camera"].any()
    policy = make_policy("cnn", space, env.action_space, conv_channels=(8, 8), conv_kernels=(8, 4),
                         conv_strides=(4, 2), image_feature_dim=32, hidden_sizes=(32,))  # fmt: skip
    for _ in range(3):
        action, _, _ = policy.act(obs)
        res = env.step(action.numpy())
        obs = res.obs
    assert res.truncated.all() and set(res.final_obs) == set(obs)
    assert res.final_obs["rgb_base_camera"].shape == (2, 64, 64, 3)
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    env.close()


@pytest.mark.parametrize("env_id", ["PickCube-v1", "PegInsertionSide-v1"])
def test_other_tasks_construct_and_step(env_id):
    env = make_env(f"maniskill:{env_id}", num_envs=1, seed=0)
    obs = env.reset()
    res = env.step(np.zeros((1, *env.action_space.shape), np.float32))
    assert obs.shape == res.obs.shape == (1, *env.observation_space.shape)
    env.close()


def test_clear_errors():
    with pytest.raises(ValueError, match=r"unknown ManiSkill env id 'PushCub-v1'.*'PushCube-v1'"):
        make_env("maniskill:PushCub-v1")
    with pytest.raises(ConfigError, match="obs_mode"):
        make_env(ENV, obs_mode="pointcloudz")
    with pytest.raises(ValueError, match="cameras"):
        make_env(ENV, obs_mode="rgb", cameras=("wrist",), camera_width=32, camera_height=32)


def test_ignore_terminations_counts_success_once():
    env = make_env(ENV, num_envs=1, seed=0, max_episode_steps=4, ignore_terminations=True)
    env.reset()
    base = env._envs[0].unwrapped
    real_evaluate = base.evaluate
    calls = {"n": 0}

    def evaluate(*args, **kwargs):
        info = real_evaluate(*args, **kwargs)
        calls["n"] += 1
        info["success"] = torch.tensor([calls["n"] == 2])  # success at step 2 only
        return info

    base.evaluate = evaluate
    results = [env.step(a) for a in _actions(1, 4, seed=5)]
    base.evaluate = real_evaluate
    assert not any(r.terminated.any() for r in results)
    assert results[-1].truncated[0] and results[-1].episode_lengths == [4] and results[-1].successes == [1.0]
    env.close()


def test_maniskill_runs_without_autograd(state_env):
    """reset, step (and its same-step autoreset) run ManiSkill under torch.inference_mode (no autograd
    bookkeeping on its many small ops), and nothing of that mode leaks to the caller."""
    env = state_env
    base = env._envs[0].unwrapped
    real_evaluate, real_reset = base.evaluate, base.reset
    seen: list[tuple[str, bool]] = []

    def evaluate(*args, **kwargs):
        seen.append(("step", torch.is_inference_mode_enabled()))
        return real_evaluate(*args, **kwargs)

    def reset(*args, **kwargs):
        seen.append(("reset", torch.is_inference_mode_enabled()))
        return real_reset(*args, **kwargs)

    base.evaluate, base.reset = evaluate, reset
    try:
        env.reset(seed=5)
        for t in range(10):  # the time limit (10) ends the episode: a same-step autoreset
            obs = env.step(_actions(2, 1, seed=t)[0]).obs
    finally:
        base.evaluate, base.reset = real_evaluate, real_reset
    assert {kind for kind, _ in seen} == {"step", "reset"}
    assert all(mode for _, mode in seen), seen
    assert not torch.is_inference_mode_enabled()
    assert isinstance(obs, np.ndarray) and obs.flags.writeable


def test_physx_cuda_without_a_gpu_is_refused_by_name_and_auto_falls_back_to_cpu():
    from rlinf_nb.envs.maniskill import _resolve_backend

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"physx_cuda.*needs a CUDA GPU.*physx_cpu"):
        make_env(ENV, num_envs=2, sim_backend="physx_cuda")
    assert _resolve_backend("auto") == "physx_cpu"


def test_a_missing_physx_gpu_library_says_where_it_goes(monkeypatch, tmp_path):
    """SAPIEN downloads libPhysXGpu_64.so from GitHub on first GPU use; offline (this workplace, many lab
    clusters) that fails with a bare network error. We say what to fetch and where it goes; ``auto`` then
    warns and simulates on the CPU, an explicit ``physx_cuda`` raises."""
    import requests
    import sapien.physx

    from rlinf_nb.envs.maniskill import _resolve_backend

    def offline(*args, **kwargs):
        raise requests.ConnectionError("could not resolve host github.com")

    monkeypatch.setattr(requests, "get", offline)
    monkeypatch.setenv("HOME", str(tmp_path))  # SAPIEN keeps the library under ~/.sapien/physx/<version>
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    folder = tmp_path / ".sapien" / "physx" / sapien.physx.version()
    with pytest.raises(RuntimeError, match=r"libPhysXGpu_64\.so.*ConnectionError") as err:
        _resolve_backend("physx_cuda")
    assert "https://github.com/sapien-sim/physx-precompiled/releases/download/" in str(err.value)
    assert str(folder) in str(err.value)
    with pytest.warns(UserWarning, match=r"libPhysXGpu_64\.so.*Using sim_backend='physx_cpu'"):
        assert _resolve_backend("auto") == "physx_cpu"
