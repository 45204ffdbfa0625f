"""Observation features computed in the env (rlinf_nb.envs.obs_features), the PegInsertionSide geometry they
read, and DART-style noisy scripted demos (the two pieces that let bc_peginsertion clone the insertion)."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_nb.config import ConfigError
from rlinf_nb.envs import make_env, obs_features
from rlinf_nb.envs import quaternion as Q
from rlinf_nb.envs.obs_features import get_obs_features, obs_feature_names, register_obs_features
from rlinf_nb.envs.peg_insertion import PegScene, peg_insertion_features, peginsertion_policy
from rlinf_nb.envs.scripted import scripted_episodes

PEG = "maniskill:PegInsertionSide-v1"
PEG_KW = {"obs_mode": "state", "control_mode": "pd_ee_delta_pose", "sim_backend": "physx_cpu"}


def _peg_state(n: int = 1) -> np.ndarray:
    """A hand-made state: peg lying along +y at the origin, hole along +y 10 cm further, TCP above the peg."""
    obs = np.zeros((n, 43), np.float32)
    along_y = Q.yaw_quat(np.full(n, np.pi / 2))  # x axis turned onto +y
    obs[:, 18:21] = [0.0, -0.05, 0.1]  # TCP
    obs[:, 21:25] = [0.0, 1.0, 0.0, 0.0]  # TCP pointing down
    obs[:, 25:28] = [0.0, 0.0, 0.02]  # peg centre
    obs[:, 28:32] = along_y
    obs[:, 32:35] = [0.1, 0.02, 0.02]  # half length, radius, radius
    obs[:, 35:38] = [0.0, 0.2, 0.02]  # hole centre
    obs[:, 38:42] = along_y
    obs[:, 42] = 0.023
    obs[:, 7:9] = 0.04  # fingers open
    return obs


def test_peg_scene_reads_the_geometry_from_the_state():
    s = PegScene.from_obs(_peg_state())
    np.testing.assert_allclose(s.peg_x[0], [0.0, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(
        s.seated[0], [0.0, 0.1, 0.02], atol=1e-6
    )  # centre one half length before the hole
    assert s.along[0] == pytest.approx(-0.1) and s.lateral[0] == pytest.approx(0.0, abs=1e-7)
    np.testing.assert_allclose(
        s.head_in_hole[0], [-0.1, 0.0, 0.0], atol=1e-6
    )  # head 10 cm short, on the axis
    np.testing.assert_allclose(s.grasp_p[0], [0.0, -0.05, 0.02], atol=1e-6)  # between centre and tail
    assert np.abs(s.tilt_rotvec).max() < 1e-6  # peg already has the hole's orientation
    assert s.off_axis[0] == pytest.approx(0.08, abs=1e-6)  # TCP 8 cm above the peg's axis


def test_peg_insertion_features_are_clipped_scales_of_the_errors_then_the_state():
    state = _peg_state(3)
    state[1, 25] += 0.001  # 1 mm off the axis sideways
    state[2, 25] += 0.05  # 5 cm off
    featured = get_obs_features("peg_insertion")(state)
    assert featured.shape == (3, 83 + 43) and featured.dtype == np.float32
    np.testing.assert_array_equal(featured[:, 83:], state)  # the state follows the features, untouched
    feats = peg_insertion_features(state)
    assert np.abs(feats).max() <= 10.0
    # the offset from seated, in the world, at 10 cm, 1 cm and 2 mm (columns 12:21): x is the sideways error
    offset_x = feats[:, [12, 15, 18]]
    np.testing.assert_allclose(offset_x[1], [0.01, 0.1, 0.5], atol=1e-5)  # the fine scale resolves 1 mm
    np.testing.assert_allclose(offset_x[2], [0.5, 1.0, 1.0], atol=1e-5)  # coarse sees 5 cm, fine ones clip
    assert offset_x[0].tolist() == [0.0, 0.0, 0.0]


def test_feature_registry_names_its_sets_and_refuses_unknown_and_misshapen_input(monkeypatch):
    monkeypatch.setattr(obs_features, "_REGISTRY", dict(obs_features._REGISTRY))  # registered here only
    assert "peg_insertion" in obs_feature_names()
    with pytest.raises(ValueError, match="obs_features: got 'nope'; allowed values: .*peg_insertion"):
        get_obs_features("nope")
    with pytest.raises(ValueError, match="reads a state of 43 values per env, got an observation of shape"):
        get_obs_features("peg_insertion")(np.zeros((2, 35), np.float32))

    @register_obs_features("test_doubled", state_dim=2)
    def doubled(state):
        """Twice the state."""
        return 2 * state

    out = get_obs_features("test_doubled")(np.array([[1.0, 3.0]], np.float32))
    np.testing.assert_array_equal(out, [[2.0, 6.0, 1.0, 3.0]])
    assert get_obs_features("test_doubled").doc == "Twice the state."

    import threading

    lock = threading.Lock()

    @register_obs_features("test_holds_a_lock", state_dim=2)
    def locked(state):
        with lock:
            return state

    with pytest.raises(
        TypeError, match="obs_features 'test_holds_a_lock' cannot be sent to the cluster.*lock"
    ):
        obs_features.shippable_obs_features("test_holds_a_lock")


def test_maniskill_env_with_features_gives_features_then_state_and_the_expert_its_state():
    env = make_env(PEG, 2, seed=4, obs_features="peg_insertion", **PEG_KW)
    plain = make_env(PEG, 2, seed=4, **PEG_KW)
    try:
        assert env.observation_space.shape == (126,) and plain.observation_space.shape == (43,)
        obs, ref = env.reset(), plain.reset()
        np.testing.assert_array_equal(env.raw_state(obs), ref)
        np.testing.assert_allclose(obs[:, :83], peg_insertion_features(ref), atol=1e-6)
        for _ in range(3):
            action = peginsertion_policy(env.raw_state(obs))
            res, ref_res = env.step(action), plain.step(action)
            obs = res.obs
            np.testing.assert_array_equal(env.raw_state(obs), ref_res.obs)
    finally:
        env.close()
        plain.close()


def test_maniskill_features_config_errors_name_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"obs_features: got 'pegs'; allowed values: .*peg_insertion"):
        make_env(PEG, 1, obs_features="pegs", **PEG_KW)
    with pytest.raises(
        ConfigError, match=r"obs_features: got 'peg_insertion'; only used with obs_mode 'state'"
    ):
        make_env(PEG, 1, obs_features="peg_insertion", **{**PEG_KW, "obs_mode": "rgb"})
    with pytest.raises(ValueError, match=r"reads a state of 43 values, and 'PushCube-v1' has 35"):
        make_env("maniskill:PushCube-v1", 1, obs_features="peg_insertion", sim_backend="physx_cpu")


def test_noisy_scripted_demos_keep_the_experts_clean_labels_and_failed_episodes():
    kwargs = {**PEG_KW, "obs_features": "peg_insertion", "max_episode_steps": 40}
    clean, clean_stats = scripted_episodes(PEG, 2, seed=1, successful_only=False, **kwargs)
    noisy, stats = scripted_episodes(PEG, 3, seed=1, successful_only=False, action_noise=(0.3,), **kwargs)
    assert stats["tried"] == 3 and noisy["done"].sum() == 3
    # labels: the expert's action for the plain state of every observed (featured) observation
    np.testing.assert_array_equal(noisy["actions"], peginsertion_policy(noisy["obs"][:, -43:]))
    assert noisy["obs"].shape[1] == 126
    # the env was driven off the clean trajectory (same seed, same first state)
    np.testing.assert_array_equal(noisy["obs"][0], clean["obs"][0])
    n = min(40, len(clean["obs"]))
    assert np.abs(noisy["obs"][1:n, -43:] - clean["obs"][1:n, -43:]).max() > 0.01
    # 40 steps are too few to insert (the expert needs ~55): failed episodes are kept, marked unsuccessful
    assert stats["success_rate"] == 0.0 and not noisy["success"].any()
    with pytest.raises(ValueError, match=r"action_noise: got \[-0.1\]"):
        scripted_episodes(PEG, 1, action_noise=(-0.1,), **kwargs)


def test_a_noisy_scripted_dataset_is_split_at_every_episode_end_and_lerobot_reads_it(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from rlinf_nb.data.expert import record_scripted_dataset
    from rlinf_nb.data.transitions import dataset_to_transitions
    from rlinf_nb.envs.scripted import pickcube_policy

    kwargs = {"obs_mode": "state", "control_mode": "pd_ee_delta_pos", "sim_backend": "physx_cpu"}
    out = record_scripted_dataset(
        tmp_path / "dart", "maniskill:PickCube-v1", 4, seed=2, action_noise=(0.0, 1.0), **kwargs
    )
    ds = LeRobotDataset("local/dart", root=out, video_backend="pyav")
    assert ds.meta.total_episodes == 4
    data = dataset_to_transitions(out, obs_keys="observation.state")
    np.testing.assert_array_equal(data["actions"], pickcube_policy(data["obs"]))  # clean labels
    expected, stats = scripted_episodes(
        "maniskill:PickCube-v1", 4, seed=2, successful_only=False, action_noise=(0.0, 1.0), **kwargs
    )
    np.testing.assert_array_equal(data["obs"], expected["obs"].astype(np.float32))
    assert 0.0 < stats["success_rate"] < 1.0, stats  # both kinds of episode are in it (seeded draw)
    ends = np.flatnonzero(np.diff(data["episode_index"])) + 1
    np.testing.assert_array_equal(ends, np.flatnonzero(expected["done"])[:-1] + 1)


def test_a_feature_set_registered_in_the_client_runs_on_the_cluster(attached, monkeypatch):
    """As in a notebook cell: the set exists only in this process; launch ships it to the env workers and
    to the learner that records the demos, and a name registered nowhere fails at launch, naming the key."""
    import random
    import uuid

    import rlinf_nb as rl

    monkeypatch.setattr(obs_features, "_REGISTRY", dict(obs_features._REGISTRY))  # registered here only
    pushcube = {"obs_mode": "state", "control_mode": "pd_ee_delta_pos", "sim_backend": "physx_cpu"}
    state_dim = make_env("maniskill:PushCube-v1", 1, seed=0, **pushcube).observation_space.shape[0]

    @register_obs_features("test_client_only", state_dim=state_dim)
    def first_three_doubled(state):  # a local function: cloudpickled by value, as a notebook cell's
        return 2 * state[:, :3]

    with pytest.raises(ConfigError, match=r"env\.kwargs\.obs_features.*'not_registered'.*test_client_only"):
        rl.launch("bc_pushcube", env__kwargs__obs_features="not_registered")
    run = rl.launch(
        "bc_pushcube", name=f"feat-{uuid.uuid4().hex[:6]}", seed=random.randrange(10_000, 10**9),
        env__kwargs__obs_features="test_client_only", algo__dataset="scripted:5", budget__total_env_steps=200,
    )  # fmt: skip
    run.wait(timeout=300, progress=False)
    status = run.status()
    assert status["state"] == "finished", status[
        "error"
    ]  # env workers built featured envs; BC evaluated on them
    dataset = run.events().query("kind == 'dataset'").iloc[0]["dataset"]
    from rlinf_nb.data.transitions import dataset_to_transitions

    obs = dataset_to_transitions(dataset, obs_keys="observation.state")["obs"]
    assert obs.shape[1] == state_dim + 3  # the learner recorded the demos with the features too
    np.testing.assert_allclose(obs[:, :3], 2 * obs[:, 3:6], rtol=1e-6)
