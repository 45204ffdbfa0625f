"""Dict observations (camera images + state) through the tree utility, the runtime and the learners.

In-process tests drive the real worker classes without Ray (a cheap mock-robot env with one
64x64 camera); the cluster test runs PPO on ManiSkill PushCube in ``rgb`` mode. SAC, CrossQ and
RLPD on dict observations: ``tests/test_offpolicy_images.py``.
"""

from __future__ import annotations

import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlinf_nb.runtime.workers import answered_at_once

from rlinf_nb import tree
from rlinf_nb.algorithms import functional as F

ROBOT_DICT_ENV = {"id": "robot:mock_arm/reach", "num_envs": 2, "kwargs": {"obs_mode": "dict", "max_steps": 5}}
SMALL_CNN = {"conv_channels": (4,), "conv_kernels": (8,), "conv_strides": (4,), "image_feature_dim": 16,
             "hidden_sizes": (16,)}  # fmt: skip


def _obs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "rgb": rng.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8),
        "state": rng.standard_normal((n, 5)).astype(np.float32),
    }


# ----------------------------------------------------------------------------- the tree utility


def test_tree_functions_on_a_dict_keep_shapes_and_dtypes():
    a, b = _obs(2, 0), _obs(2, 1)
    st = tree.stack([a, b])
    assert st["rgb"].shape == (2, 2, 4, 4, 3) and st["rgb"].dtype == np.uint8
    assert tree.batch_shape(st, 2) == (2, 2)
    cat = tree.concatenate([st, st], axis=1)
    assert tree.batch_shape(cat, 2) == (2, 4) and cat["state"].dtype == np.float32
    flat = tree.flatten_lead(cat)
    assert tree.batch_size(flat) == 8
    np.testing.assert_array_equal(tree.index(flat, 5)["rgb"], cat["rgb"][1, 1])
    store = tree.zeros(a, lead=(3,))
    assert store["rgb"].shape == (3, 2, 4, 4, 3) and store["rgb"].dtype == np.uint8
    tree.assign(store, 1, b)
    np.testing.assert_array_equal(store["state"][1], b["state"])
    picked = tree.where(np.array([True, False]), a, b)
    np.testing.assert_array_equal(picked["rgb"][0], a["rgb"][0])
    np.testing.assert_array_equal(picked["rgb"][1], b["rgb"][1])
    assert [p for p, _ in tree.items({"obs": a, "rewards": np.zeros(2)})] == [
        "obs/rgb",
        "obs/state",
        "rewards",
    ]
    as_torch = tree.map(torch.as_tensor, flat)
    assert as_torch["rgb"].dtype == torch.uint8
    assert tree.index(as_torch, torch.tensor([0, 7]))["state"].shape == (2, 5)
    assert tree.concatenate([as_torch, as_torch])["rgb"].shape == (16, 4, 4, 3)


def test_tree_functions_on_an_array_are_the_plain_numpy_operations():
    x = np.arange(24, dtype=np.float32).reshape(3, 2, 4)
    np.testing.assert_array_equal(tree.concatenate([x, x], axis=1), np.concatenate([x, x], axis=1))
    np.testing.assert_array_equal(tree.flatten_lead(x), x.reshape(6, 4))
    mask = np.array([True, False])
    np.testing.assert_array_equal(tree.where(mask, x[0], x[1]), np.where(mask[:, None], x[0], x[1]))
    assert tree.zeros(x[0], lead=(5,)).shape == (5, 2, 4) and tree.batch_size(x) == 3
    assert tree.items(x) == [("", x)]


def test_tree_shape_contract_names_the_offending_leaf():
    bad = {"rgb": np.zeros((2, 4, 4, 3), np.uint8), "state": np.zeros((3, 5), np.float32)}
    with pytest.raises(ValueError, match=r"state has leading dims \(3,\), but rgb has \(2,\)"):
        tree.batch_shape(bad)
    with pytest.raises(ValueError, match=r"keys differ at the root: \['rgb', 'state'\] vs \['rgb'\]"):
        tree.concatenate([_obs(2), {"rgb": np.zeros((2, 4, 4, 3), np.uint8)}])


def test_batch_summary_has_a_row_per_obs_key():
    from rlinf_nb.runtime.stage_context import summarize_batch

    rows = summarize_batch({"obs": tree.stack([_obs(2)] * 3), "rewards": np.zeros((3, 2), np.float32)})
    by_key = {r["key"]: r for r in rows}
    assert by_key["obs/rgb"]["shape"] == (3, 2, 4, 4, 3) and by_key["obs/rgb"]["dtype"] == "uint8"
    assert by_key["obs/state"]["shape"] == (3, 2, 5) and "rewards" in by_key


# ----------------------------------------------------------------------------- the workers, in process


class _Sink:
    """Stands in for the trajectories channel."""

    def put(self, key, item, **kwargs):
        self.item = item


@pytest.fixture(scope="module")
def workers():
    from rlinf_nb.runtime.workers import EnvWorker, RolloutWorker

    env = EnvWorker(0, 1, "env", ROBOT_DICT_ENV, seed=0)
    obs_space, action_space = env.spaces()
    assert isinstance(obs_space, gym.spaces.Dict)
    rollout = RolloutWorker(
        0, 1, "rollout", {"name": "cnn", "kwargs": SMALL_CNN}, (obs_space, action_space), 0
    )
    yield env, rollout
    env.env.close()


def test_vec_env_keeps_the_true_final_dict_observation():
    from rlinf_nb.envs import make_env

    env = make_env(ROBOT_DICT_ENV["id"], 2, seed=0, **ROBOT_DICT_ENV["kwargs"])
    env.reset()
    for _ in range(5):
        res = env.step(np.zeros((2, 3), np.float32))
    assert res.truncated.all() and set(res.final_obs) == {"cams/front", "state"}
    assert res.final_obs["cams/front"].dtype == np.uint8 and res.final_obs["cams/front"].shape == (
        2,
        64,
        64,
        3,
    )
    assert not np.allclose(res.final_obs["state"], res.obs["state"])  # the last obs, not the reset one
    env.close()


def test_rollout_stores_dict_obs_uint8_and_bootstraps_from_final_dict_obs(workers):
    env, rollout = workers
    seen = []

    def ask(msg):
        seen.append(msg)
        return rollout.infer(msg)

    sink = _Sink()
    env.reset()
    out = env._rollout(8, answered_at_once(ask), sink, None, False)
    timing = {k: out.pop(k) for k in ("env_s", "policy_s")}  # seconds stepping envs / asking the policy
    assert out == {"env_steps": 16, "episodes": 2, "incarnation": env.incarnation}
    assert timing["env_s"] > 0 and timing["policy_s"] > 0
    b = sink.item["batch"]
    assert b["obs"]["cams/front"].shape == (8, 2, 64, 64, 3) and b["obs"]["cams/front"].dtype == np.uint8
    assert b["obs"]["state"].shape == (8, 2, 13) and b["obs"]["state"].dtype == np.float32
    assert seen[0]["obs"]["cams/front"].dtype == np.uint8  # not blown up to float32 before the policy
    # Steps 0..4 are the first episode: it is cut by the time limit at t = 4, bootstrapped from its final obs.
    assert b["truncated"][4].all() and b["truncated"].sum() == 2
    final = seen[5]["final_obs"]
    assert final is not None and final["cams/front"].dtype == np.uint8
    with torch.no_grad():
        expected = rollout.policy.value(tree.map(torch.as_tensor, final)).numpy()
    np.testing.assert_allclose(b["bootstrap_values"][4], expected, rtol=1e-6)
    assert not np.any(b["bootstrap_values"][np.arange(8) != 4])
    # Off-policy transitions: next_obs is the true final observation where an episode ended.
    results, step = [], env.env.step
    env.env.step = lambda action: results.append(step(action)) or results[-1]
    try:
        sink2 = _Sink()
        env.reset()
        env._rollout(6, answered_at_once(rollout.infer), sink2, None, True)
    finally:
        del env.env.step
    nxt, obs = sink2.item["batch"]["next_obs"], sink2.item["batch"]["obs"]
    assert nxt["cams/front"].dtype == np.uint8
    for key in ("state", "cams/front"):
        np.testing.assert_array_equal(nxt[key][:4], obs[key][1:5])
        np.testing.assert_array_equal(nxt[key][4], results[4].final_obs[key])
        assert not np.array_equal(nxt[key][4], obs[key][5])  # not the next episode's first obs


def test_rollout_worker_answers_several_dict_messages_at_once(workers):
    _, rollout = workers
    msgs = [{"obs": tree.map(np.copy, _robot_obs(rollout, n)), "final_obs": None, "final_mask": None,
             "value_only": False} for n in (1, 3)]  # fmt: skip
    replies = rollout.server.answer(msgs)
    assert [r["actions"].shape for r in replies] == [(1, 3), (3, 3)]
    assert [r["values"].shape for r in replies] == [(1,), (3,)]


def _robot_obs(rollout, n):
    space = rollout.policy.obs_space
    return {k: np.stack([s.sample() for _ in range(n)]) for k, s in space.spaces.items()}


def _ppo_batch(env, rollout):
    sink = _Sink()
    env.reset()
    env._rollout(8, answered_at_once(rollout.infer), sink, None, False)
    return sink.item["batch"]


def test_ppo_learner_updates_on_dict_obs_minibatches(workers):
    from rlinf_nb.algorithms.ppo import PPOConfig, PPOLearner
    from rlinf_nb.policies import make_policy

    env, rollout = workers
    b = _ppo_batch(env, rollout)
    adv, ret = F.gae(*(torch.as_tensor(b[k]) for k in ("rewards", "values", "dones", "truncated", "last_values",
                                                        "bootstrap_values")), gamma=0.9, lam=0.9)  # fmt: skip
    b.update(advantages=adv.numpy(), returns=ret.numpy())
    policy = make_policy("cnn", rollout.policy.obs_space, rollout.policy.action_space, **SMALL_CNN)
    policy.load_state_dict(rollout.policy.state_dict())
    seen = []
    evaluate = policy.evaluate
    policy.evaluate = lambda obs, act: (seen.append(obs), evaluate(obs, act))[1]
    learner = PPOLearner(policy, PPOConfig(epochs=2, minibatch_size=4, lr=1e-3))
    before = [p.detach().clone() for p in policy.parameters()]
    out = learner.update(b, PPOConfig(epochs=2, minibatch_size=4), 0.0)
    assert out["epochs_run"] == 2 and np.isfinite(out["policy_loss"]) and np.isfinite(out["value_loss"])
    assert len(seen) == 2 * 4 and seen[0]["cams/front"].dtype == torch.uint8
    assert seen[0]["cams/front"].shape == (4, 64, 64, 3) and seen[0]["state"].shape == (4, 13)
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters(), strict=True))


def test_grpo_learner_updates_on_dict_obs(workers):
    from rlinf_nb.algorithms.grpo import GroupPolicyLearner, GRPOConfig, group_advantages
    from rlinf_nb.policies import make_policy

    env, rollout = workers
    b = _ppo_batch(env, rollout)
    cfg = GRPOConfig(group_size=2, epochs=1, minibatch_size=4, mask_unfinished=False)
    group_advantages(b, cfg)
    policy = make_policy("cnn", rollout.policy.obs_space, rollout.policy.action_space, **SMALL_CNN)
    out = GroupPolicyLearner(policy, cfg).update(b, cfg)
    assert out["valid_steps"] == 16 and np.isfinite(out["policy_loss"])


def test_sac_learner_trains_on_the_env_workers_dict_transitions(workers):
    from rlinf_nb.algorithms.sac import SACConfig, SACLearner
    from rlinf_nb.policies import make_policy

    env, rollout = workers
    sink = _Sink()
    env.reset()
    env._rollout(8, answered_at_once(rollout.infer), sink, None, True)
    b = sink.item["batch"]
    policy = make_policy("cnn", rollout.policy.obs_space, rollout.policy.action_space,
                         **{**SMALL_CNN, "action_head": "squashed_gaussian"})  # fmt: skip
    cfg = SACConfig(batch_size=8, learning_starts=16, critic_hidden_sizes=(16,))
    learner = SACLearner(policy, cfg)
    out = learner.update({k: b[k] for k in ("obs", "actions", "rewards", "next_obs", "terminated")}, cfg)
    assert out["updates"] == 16 and np.isfinite(out["critic_loss"]) and np.isfinite(out["actor_loss"])
    ordered = learner.replay.ordered()
    np.testing.assert_array_equal(ordered["obs/cams%2Ffront"], b["obs"]["cams/front"].reshape(16, 64, 64, 3))
    stored = ordered["next_obs/cams%2Ffront"]
    assert stored.dtype == np.uint8 and stored.shape[1:] == (64, 64, 3)
    np.testing.assert_array_equal(stored, b["next_obs"]["cams/front"].reshape(16, 64, 64, 3))
    # next frames that are the following step's obs frame are links: copies only where an episode ended
    # (the true last frame) and on the segment's last row
    frames = learner.replay.next_frames["next_obs/cams%2Ffront"]
    own = np.array([f is not None for f in frames.own[:16]]).reshape(8, 2)
    ended = np.asarray(b["dones"], bool)
    assert own[-1].all() and ended[:-1].any()
    np.testing.assert_array_equal(own[:-1], ended[:-1])


# ----------------------------------------------------------------------------- on the cluster


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


@pytest.mark.usefixtures("attached")
def test_ppo_on_maniskill_rgb_runs_on_the_cluster_with_dict_obs_in_the_batch():
    import rlinf_nb as rl

    T, updates = 16, 3
    cfg = {
        "algorithm": "ppo",
        "env": {"id": "maniskill:PushCube-v1", "num_envs": 2,
                "kwargs": {"obs_mode": "rgb", "camera_width": 64, "camera_height": 64, "sim_backend": "physx_cpu",
                           "control_mode": "pd_ee_delta_pos", "max_episode_steps": 10}},
        "algo": {"rollout_steps": T, "epochs": 2, "minibatch_size": 16},
        "policy": {"name": "cnn", "kwargs": {"conv_channels": (8, 16), "conv_kernels": (8, 4),
                                             "conv_strides": (4, 2), "image_feature_dim": 32,
                                             "hidden_sizes": (32,)}},
        "budget": {"total_env_steps": T * 2 * updates, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0},
        "linger_s": 60,
    }  # fmt: skip
    run = rl.launch(cfg, name=_unique("ppo_rgb"))
    st = run.wait(timeout=900, progress=False)
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    assert df["step"].tolist() == list(range(1, updates + 1))
    assert np.isfinite(df["policy_loss"]).all() and np.isfinite(df["value_loss"]).all()
    assert df["episodes"].iloc[-1] >= 4  # 10-step episodes: the truncation path was taken
    view = run.batch()
    keys = set(view.keys())
    assert {"obs/rgb_base_camera", "obs/state", "advantages", "returns"} <= keys, keys
    b = view.to_local(["obs", "bootstrap_values", "truncated"])
    rgb, state = b["obs"]["rgb_base_camera"], b["obs"]["state"]
    assert rgb.shape == (T, 2, 64, 64, 3) and rgb.dtype == np.uint8 and rgb.any()
    assert state.ndim == 3 and state.shape[:2] == (T, 2) and state.dtype == np.float32
    trunc = b["truncated"]
    assert trunc.any() and np.all(b["bootstrap_values"][~trunc] == 0)
    assert np.all(b["bootstrap_values"][trunc] != 0)
