"""SAC, CrossQ and RLPD on camera images + state (dict observations, the ``cnn`` policy).

Tiny images and nets throughout. The learning check is a one-step bandit whose answer is in the
image: a bright pixel's column is the target action, the state is noise, so a policy that cannot
see (state only) is bounded by the best constant action, computed here exactly.
"""

from __future__ import annotations

import copy
import io
import math
import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf_nb.algorithms.augment import shift_images
from rlinf_nb.algorithms.offpolicy_loop import train_offpolicy
from rlinf_nb.algorithms.offpolicy_nets import EncodedEnsembleQ, ObsEncoder
from rlinf_nb.algorithms.replay import ReplayBuffer, flatten_fields, unflatten_fields
from rlinf_nb.algorithms.sac import (
    CrossQConfig,
    CrossQLearner,
    RLPDConfig,
    RLPDLearner,
    SACConfig,
    SACLearner,
)
from rlinf_nb.config import ConfigError, build
from rlinf_nb.policies import make_policy
from rlinf_nb.run_config import RunConfig
from tests.helpers import assert_learners_continue_identically

H = W = 16
CAM = "cams/top"  # a robot camera path: the replay must cope with "/" in a key
OBS_SPACE = gym.spaces.Dict(
    {CAM: gym.spaces.Box(0, 255, (H, W, 1), np.uint8), "state": gym.spaces.Box(-1, 1, (2,), np.float32)}
)
ACT_SPACE = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
TINY_CNN = {"conv_channels": (8,), "conv_kernels": (3,), "conv_strides": (2,), "image_feature_dim": 32,
            "hidden_sizes": (64,), "action_head": "squashed_gaussian"}  # fmt: skip
SMALL = dict(batch_size=32, learning_starts=32, critic_hidden_sizes=(32, 32))
LEARNERS = [
    (SACLearner, SACConfig),
    (CrossQLearner, CrossQConfig),
    (RLPDLearner, lambda **kw: RLPDConfig(num_critics=4, critic_subset=2, **kw)),
]


class BrightPixelEnv(gym.Env):
    """One-step episodes: a black ``H x W`` image with one white pixel at a random place; the target
    action is its column mapped to ``[-1, 1]``, the reward ``-|action - target|``. The state is noise."""

    observation_space = OBS_SPACE
    action_space = ACT_SPACE

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        row, col = self.np_random.integers(H), self.np_random.integers(W)
        image = np.zeros((H, W, 1), np.uint8)
        image[row, col] = 255
        self.target = -1.0 + 2.0 * col / (W - 1)
        self.obs = {CAM: image, "state": self.np_random.uniform(-1, 1, 2).astype(np.float32)}
        return self.obs, {}

    def step(self, action):
        return self.obs, -abs(float(np.asarray(action).reshape(-1)[0]) - self.target), True, False, {}


def _dict_batch(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def obs():
        return {CAM: rng.integers(0, 256, (n, H, W, 1), dtype=np.uint8),
                "state": rng.uniform(-1, 1, (n, 2)).astype(np.float32)}  # fmt: skip

    return {"obs": obs(), "actions": rng.uniform(-1, 1, (n, 1)).astype(np.float32),
            "rewards": rng.normal(size=n).astype(np.float32), "next_obs": obs(),
            "terminated": rng.random(n) < 0.1}  # fmt: skip


def _learner(cls, cfg_fn, seed=0, **cfg_kw):
    torch.manual_seed(seed)
    cfg = cfg_fn(**(SMALL | cfg_kw))
    policy = make_policy("cnn", OBS_SPACE, ACT_SPACE, **TINY_CNN)
    learner = cls(policy, cfg, seed=seed)
    data = _dict_batch(100, seed)
    learner.add(data)
    if isinstance(learner, RLPDLearner):
        learner.add_demos({k: _index(v, slice(0, 30)) for k, v in data.items()})
    return learner, cfg


def _index(v, idx):
    return {k: x[idx] for k, x in v.items()} if isinstance(v, dict) else v[idx]


# ----------------------------------------------------------------------------- actor and critic networks


def test_cnn_squashed_gaussian_actor_samples_bounded_reparameterised_actions():
    torch.manual_seed(0)
    policy = make_policy("cnn", OBS_SPACE, gym.spaces.Box(-2.0, 2.0, (3,), np.float32), **TINY_CNN)
    assert policy.head_kind == "squashed_gaussian"
    obs = {k: torch.as_tensor(v) for k, v in _dict_batch(5)["obs"].items()}
    a, logp = policy.sample(obs)
    assert a.shape == (5, 3) and logp.shape == (5,) and a.abs().max() <= 2.0
    (a.sum() + logp.sum()).backward()
    head = list(policy.actor_head.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head)


def test_run_config_gives_sac_family_policies_a_squashed_gaussian_head_by_default():
    for algorithm in ("sac", "crossq", "rlpd"):
        cfg = build(RunConfig, {"algorithm": algorithm, "policy": {"name": "cnn"}})
        assert cfg.policy.kwargs == {"action_head": "squashed_gaussian"}
    explicit = build(
        RunConfig, {"algorithm": "sac", "policy": {"name": "cnn", "kwargs": {"action_head": "gaussian"}}}
    )
    assert explicit.policy.kwargs["action_head"] == "gaussian"  # a choice is kept
    assert (
        "action_head" not in build(RunConfig, {"algorithm": "ppo", "policy": {"name": "cnn"}}).policy.kwargs
    )


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_encoded_critic_shapes_and_uint8_input(norm):
    torch.manual_seed(0)
    policy = make_policy("cnn", OBS_SPACE, ACT_SPACE, **TINY_CNN)
    encoder = ObsEncoder({CAM: policy.actor_encoders[CAM]}, ["state"], 2)
    assert encoder.out_dim == 32 + 2
    critic = EncodedEnsembleQ(encoder, 1, (16,), 3, norm)
    obs = {k: torch.as_tensor(v) for k, v in _dict_batch(7)["obs"].items()}
    assert obs[CAM].dtype == torch.uint8
    q = critic(obs, torch.zeros(7, 1))
    assert q.shape == (3, 7) and q.dtype == torch.float32
    # uint8 pixels are scaled to [0, 1] inside the encoder; the state follows the image features as it is
    enc = policy.actor_encoders[CAM]
    feat = encoder(obs)
    torch.testing.assert_close(feat[:, :32], enc.proj(enc.conv(obs[CAM].float().permute(0, 3, 1, 2) / 255)))
    torch.testing.assert_close(feat[:, 32:], obs["state"])


def test_single_image_box_observations_work_too():
    space = gym.spaces.Box(0, 255, (H, W, 1), np.uint8)
    policy = make_policy("cnn", space, ACT_SPACE, **TINY_CNN)
    learner = SACLearner(policy, SACConfig(**SMALL))
    d = _dict_batch(40)
    learner.add({**d, "obs": d["obs"][CAM], "next_obs": d["next_obs"][CAM]})
    out = learner.train(2, SACConfig(**SMALL))
    assert out["updates"] == 2 and math.isfinite(out["critic_loss"])


def test_dict_obs_without_image_encoders_is_refused_with_the_fix():
    class Blind(torch.nn.Module):
        obs_space = OBS_SPACE
        action_space = ACT_SPACE

    with pytest.raises(
        ValueError, match=r"SACLearner: dict observations .* need a policy with image encoders"
    ):
        SACLearner(Blind(), SACConfig())


# ----------------------------------------------------------------------------- gradient separation


def _grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)


@pytest.mark.parametrize("mode", ["critic", "own"])
@pytest.mark.parametrize("cls,cfg_fn", LEARNERS)
def test_actor_and_critic_gradients_stay_separate_with_image_encoders(cls, cfg_fn, mode):
    learner, cfg = _learner(cls, cfg_fn, actor_encoder=mode)
    policy = learner.policy
    enc_params = list(policy.actor_encoders.parameters())
    critic_enc = list(learner.critic.encoder.parameters())
    critic_params = list(learner.critic.parameters())
    assert {id(p) for p in critic_enc} <= {id(p) for p in critic_params}
    assert not {id(p) for p in critic_enc} & {id(p) for p in policy.parameters()}  # the critic's own encoder
    actor_ids = {id(p) for p in learner.actor_params}
    # "critic": the actor's encoder is a copy that the actor loss does not train; "own": it does
    assert all((id(p) in actor_ids) == (mode == "own") for p in enc_params)
    body = [p for p in learner.actor_params if all(p is not e for e in enc_params)]

    b = learner.sample_batch(cfg)
    assert b["obs"][CAM].dtype == torch.uint8 and b["next_obs"]["state"].dtype == torch.float32
    c = learner.critic_loss(b, cfg)
    trainable_actor = [p for p in policy.parameters() if p.requires_grad]
    g = _grads(c.loss, trainable_actor + [learner.log_alpha])
    assert all(x is None for x in g), "the critic loss reached the actor or alpha"
    g = _grads(c.loss, critic_enc)
    assert all(x is not None and x.abs().sum() > 0 for x in g), "the critic loss does not train its encoder"

    actor, temp = learner.actor_loss(b, cfg)
    g = _grads(actor.loss, critic_params + [learner.log_alpha])
    assert all(x is None for x in g), "the actor loss reached the critic (its encoder included) or alpha"
    if mode == "critic":  # nothing can flow into the copy
        assert not any(p.requires_grad for p in enc_params), (
            "the actor loss can reach the actor's (copied) encoder"
        )
    else:
        assert any(x is not None and x.abs().sum() > 0 for x in _grads(actor.loss, enc_params))
    assert any(x is not None and x.abs().sum() > 0 for x in _grads(actor.loss, body))

    # Real optimizer steps: the critic step leaves the actor's MLP and head as they were, the actor step
    # leaves every critic parameter as it was.
    before_actor = [p.detach().clone() for p in body]
    learner._step(learner.critic_optimizer, c.loss, critic_params, cfg)
    learner._sync_actor_encoder()
    assert all(torch.equal(a, p) for a, p in zip(before_actor, body, strict=True))
    before_critic = [p.detach().clone() for p in critic_params]
    actor, _ = learner.actor_loss(b, cfg)
    learner._step(learner.actor_optimizer, actor.loss, learner.actor_params, cfg)
    assert all(torch.equal(a, p) for a, p in zip(before_critic, critic_params, strict=True))
    assert any(not torch.equal(a, p) for a, p in zip(before_actor, body, strict=True))


@pytest.mark.parametrize("cls,cfg_fn", LEARNERS)
def test_the_actor_reads_the_critics_encoder_after_every_critic_step(cls, cfg_fn):
    learner, cfg = _learner(cls, cfg_fn)
    start = [p.detach().clone() for p in learner.critic.encoder.parameters()]
    out = learner.train(3, cfg)
    assert out["updates"] == 3 and math.isfinite(out["critic_loss"])
    critic_enc = list(learner.critic.encoder.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(start, critic_enc, strict=True))  # it was trained
    for a, p in zip(learner.policy.actor_encoders.parameters(), critic_enc, strict=True):
        assert torch.equal(a, p) and not a.requires_grad
    assert learner.policy_state()[f"actor_encoders.{CAM}.proj.0.weight"].shape == (32, 8 * 7 * 7)
    if learner.critic_target is not None:  # the target's encoder is a slow copy
        tgt = list(learner.critic_target.encoder.parameters())
        assert all(not p.requires_grad for p in tgt)
        assert any(not torch.equal(t, p) for t, p in zip(tgt, critic_enc, strict=True))


# ----------------------------------------------------------------------------- replay and checkpoints


def test_replay_keeps_images_uint8_and_keys_with_slashes():
    T, N = 3, 4
    d = _dict_batch(T * N)
    batch = {k: ({kk: vv.reshape(T, N, *vv.shape[1:]) for kk, vv in v.items()} if isinstance(v, dict)
                 else v.reshape(T, N, *v.shape[1:])) for k, v in d.items()}  # fmt: skip
    learner, cfg = _learner(SACLearner, SACConfig)
    learner.replay = ReplayBuffer(50)
    assert learner.add(batch) == 12
    data = learner.replay.data
    assert data["obs/cams%2Ftop"].dtype == np.uint8 and "next_obs/cams%2Ftop" in learner.replay.fields
    ordered = learner.replay.ordered()
    np.testing.assert_array_equal(ordered["obs/cams%2Ftop"][:12], d["obs"][CAM])
    np.testing.assert_array_equal(ordered["next_obs/cams%2Ftop"][:12], d["next_obs"][CAM])
    assert ordered["next_obs/cams%2Ftop"].dtype == np.uint8
    # bytes per transition: two uint8 images (random: no next frame is a later obs frame), two float32
    # states, the action, reward and termination
    assert learner.replay.stored_bytes() == 12 * (2 * (H * W * 1 + 4 * 2) + 4 * 1 + 4 + 4)
    assert learner.train(0, cfg)["replay_mb"] == learner.replay.stored_bytes() / 1e6  # a run's metric
    s = learner.replay.sample(5, np.random.default_rng(0))
    assert set(s["obs"]) == {CAM, "state"} and s["obs"][CAM].dtype == np.uint8
    tree = {"obs": {"a/b": 1, "c%2Fd": 2, "e": {"f/g": 3}}}
    flat = flatten_fields(tree)
    assert set(flat) == {"obs/a%2Fb", "obs/c%252Fd", "obs/e/f%2Fg"} and unflatten_fields(flat) == tree


def test_dict_obs_replay_state_dict_round_trip_through_torch_save():
    buf = ReplayBuffer(8)
    for i in range(3):  # 15 transitions: wrapped
        buf.extend(_dict_batch(5, i))
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    other = ReplayBuffer(8)
    other.load_state_dict(torch.load(io.BytesIO(blob.getvalue()), weights_only=False))
    for k, v in buf.ordered().items():
        np.testing.assert_array_equal(other.ordered()[k], v)
        assert other.ordered()[k].dtype == v.dtype
    a, b = buf.sample(6, np.random.default_rng(2)), other.sample(6, np.random.default_rng(2))
    np.testing.assert_array_equal(a["obs"][CAM], b["obs"][CAM])
    assert b["obs"][CAM].dtype == np.uint8
    smaller = ReplayBuffer(4)
    smaller.load_state_dict(buf.state_dict())
    np.testing.assert_array_equal(smaller.ordered()["obs/cams%2Ftop"], buf.ordered()["obs/cams%2Ftop"][-4:])


@pytest.mark.parametrize("cls,cfg_fn", LEARNERS)
@pytest.mark.parametrize("mode", ["critic", "own"])
def test_image_learner_checkpoint_round_trip_continues_identically(cls, cfg_fn, mode):
    learner, cfg = _learner(cls, cfg_fn, actor_encoder=mode)
    learner.train(4, cfg)
    blob = io.BytesIO()
    torch.save(learner.state_dict(), blob)
    other, _ = _learner(cls, cfg_fn, seed=1, actor_encoder=mode)
    other.load_state_dict(torch.load(io.BytesIO(blob.getvalue()), weights_only=False))
    assert len(other.replay) == len(learner.replay) and other.replay.data["obs/cams%2Ftop"].dtype == np.uint8
    assert_learners_continue_identically(learner, other, cfg, seed=5)


def test_intervened_dict_transitions_join_rlpd_demos():
    learner, _ = _learner(RLPDLearner, lambda **kw: RLPDConfig(num_critics=2, **kw))
    before = len(learner.demos)
    d = _dict_batch(6, 3)
    human = np.array([False, True, False, True, True, False])
    learner.add({**d, "intervened": human})
    assert len(learner.demos) == before + 3
    np.testing.assert_array_equal(learner.demos.ordered()["obs/cams%2Ftop"][-3:], d["obs"][CAM][human])


# ----------------------------------------------------------------------------- learning from pixels


def _blind_best(num_targets: int) -> float:
    """The best mean reward of any policy that ignores the image: the best constant action's."""
    targets = -1.0 + 2.0 * np.arange(num_targets) / (num_targets - 1)
    grid = np.linspace(-1, 1, 2001)
    return float(max(-np.abs(a - targets).mean() for a in grid))


def _deterministic_reward(policy, env_cls, episodes: int = 400) -> float:
    """The mean reward of the policy's deterministic action on fresh seeded one-step episodes."""
    env, obs, targets = env_cls(), [], []
    for i in range(episodes):
        obs.append(env.reset(seed=10_000 + i)[0])
        targets.append(env.target)
    batch = {k: torch.as_tensor(np.stack([o[k] for o in obs])) for k in obs[0]}
    with torch.no_grad():
        action, _ = policy.sample(batch, deterministic=True)
    return float(-np.abs(action[:, 0].numpy() - np.array(targets)).mean())


def test_sac_learns_the_target_from_the_pixels_beyond_any_blind_policy():
    """1500 env steps (~1300 gradient steps) in-process: the deterministic actor's mean reward on fresh
    images beats the best state-only policy by a wide margin (measured: about -0.15 vs -0.53)."""
    torch.set_num_threads(1)
    blind = _blind_best(W)
    assert -0.54 < blind < -0.53  # the best constant action, 0, is 0.53 away on average
    cfg = SACConfig(batch_size=64, learning_starts=200, random_steps=200, critic_hidden_sizes=(64, 64),
                    buffer_size=5000)  # fmt: skip
    r = train_offpolicy("sac", BrightPixelEnv(), total_steps=1500, cfg=cfg, seed=0, policy="cnn",
                        policy_kwargs=TINY_CNN)  # fmt: skip
    assert len(r.episode_returns) == 1500 and r.learner.replay.data["obs/cams%2Ftop"].dtype == np.uint8
    reward = _deterministic_reward(r.learner.policy, BrightPixelEnv)
    print(f"mean reward {reward:.3f} (blind best {blind:.3f}), {r.wall_time_s:.1f} s")
    assert reward > -0.3 > blind + 0.2


class ShadeEnv(BrightPixelEnv):
    """Like :class:`BrightPixelEnv`, but the whole image is one grey level ``17 k`` and the target is ``k``
    mapped to ``[-1, 1]``: an answer that no shift of the image changes (DrQ's assumption)."""

    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        k = int(self.np_random.integers(W))
        self.target = -1.0 + 2.0 * k / (W - 1)
        image = np.full((H, W, 1), 17 * k, np.uint8)
        self.obs = {CAM: image, "state": self.np_random.uniform(-1, 1, 2).astype(np.float32)}
        return self.obs, {}


def test_sac_with_random_shift_still_learns_from_the_pixels():
    """DrQ's augmentation on (3 pixels of 16): the critic and actor train on shifted images, each its own
    shift. Images mixed up between transitions, or corrupted, would leave the actor blind."""
    torch.set_num_threads(1)
    cfg = SACConfig(batch_size=64, learning_starts=200, random_steps=200, critic_hidden_sizes=(64, 64),
                    buffer_size=5000, random_shift=3)  # fmt: skip
    r = train_offpolicy("sac", ShadeEnv(), total_steps=1500, cfg=cfg, seed=0, policy="cnn",
                        policy_kwargs=TINY_CNN)  # fmt: skip
    reward = _deterministic_reward(r.learner.policy, ShadeEnv)
    print(f"mean reward {reward:.3f} (blind best {_blind_best(W):.3f}), {r.wall_time_s:.1f} s")
    assert reward > -0.3 > _blind_best(W) + 0.2


@pytest.mark.parametrize("cls,cfg_fn", LEARNERS)
def test_random_shift_gives_the_losses_shifted_images_and_the_state_as_it_is(cls, cfg_fn):
    learner, cfg = _learner(cls, cfg_fn, random_shift=2)
    state = copy.deepcopy(learner.rng.bit_generator.state)
    raw = learner.sample_batch(cfg)
    learner.rng.bit_generator.state = state  # the training step draws the same transitions
    seen = []
    critic_loss = learner.critic_loss
    learner.critic_loss = lambda b, c: seen.append(b) or critic_loss(b, c)
    assert learner.train(1, cfg)["updates"] == 1
    (b,) = seen
    torch.testing.assert_close(b["actions"], raw["actions"])
    moved = {}
    for key in ("obs", "next_obs"):
        torch.testing.assert_close(b[key]["state"], raw[key]["state"])
        img, ref = b[key][CAM], raw[key][CAM]
        assert img.dtype == torch.uint8 and img.shape == ref.shape
        candidates = {(dy, dx): shift_images(ref, np.tile([dy, dx], (len(ref), 1)))
                      for dy in range(-2, 3) for dx in range(-2, 3)}  # fmt: skip
        # each image is one of its own 25 shifts (random pixels: no two shifts coincide)
        found = [[d for d, c in candidates.items() if torch.equal(c[i], img[i])] for i in range(len(img))]
        assert all(len(f) == 1 for f in found)
        moved[key] = [f[0] for f in found]
        assert len(set(moved[key])) > 5
    assert moved["obs"] != moved["next_obs"]  # drawn independently


def test_random_shift_needs_image_observations():
    with pytest.raises(ConfigError, match=r"algo\.random_shift: got 4; .*image observations"):
        build(RunConfig, {"algorithm": "sac", "algo": {"random_shift": 4}})
    ok = build(RunConfig, {"algorithm": "rlpd", "algo": {"random_shift": 4}, "policy": {"name": "cnn"}})
    assert ok.algo.random_shift == 4
    flat = make_policy(
        "mlp", gym.spaces.Box(-1, 1, (3,), np.float32), ACT_SPACE, action_head="squashed_gaussian"
    )
    with pytest.raises(ConfigError, match=r"algo\.random_shift"):
        SACLearner(flat, SACConfig(random_shift=2))


# ----------------------------------------------------------------------------- on the cluster


@pytest.mark.usefixtures("attached")
def test_sac_on_a_mock_robot_camera_runs_on_the_cluster():
    """``policy: {name: cnn}`` (head filled in), robot dict obs with a 64x64 camera under ``cams/front``,
    DrQ's random shift on."""
    import rlinf_nb as rl

    cfg = {
        "algorithm": "sac",
        "env": {"id": "robot:mock_arm/reach", "num_envs": 2, "kwargs": {"obs_mode": "dict", "max_steps": 5}},
        "policy": {"name": "cnn", "kwargs": {"conv_channels": (4,), "conv_kernels": (8,), "conv_strides": (4,),
                                             "image_feature_dim": 16, "hidden_sizes": (16,)}},
        "algo": {"collect_steps": 8, "learning_starts": 16, "random_steps": 16, "batch_size": 8,
                 "critic_hidden_sizes": (16,), "buffer_size": 1000, "random_shift": 4},
        "budget": {"total_env_steps": 32, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0},
        "linger_s": 10,
    }  # fmt: skip
    run = rl.launch(cfg, name=f"sac_img_{uuid.uuid4().hex[:6]}")
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    assert df["env_steps"].iloc[-1] == 32 and df["replay_size"].iloc[-1] == 32
    trained = df[df["updates"] > 0]
    assert len(trained) and np.isfinite(trained["critic_loss"]).all()
    assert run.config()["policy"]["kwargs"]["action_head"] == "squashed_gaussian"
    assert run.config()["algo"]["random_shift"] == 4
    state = run.run_dir.load_checkpoint(run.run_dir.latest_checkpoint())
    replay = state["learner"]["learner"]["replay"]
    image = replay["data"]["obs/cams%2Ffront"]
    assert image.dtype == np.uint8 and image.shape == (32, 64, 64, 3) and image.any()
