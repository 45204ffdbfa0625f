"""Policies: every head and chunk length on the MLP and CNN networks, log-probs against references."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf_nb.config import ConfigError
from rlinf_nb.policies import CNNActorCritic, make_policy, registered_policies
from rlinf_nb.policies.distributions import Chunked, SquashedGaussian, make_action_head

STATE = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0, -1.0], np.float32), np.array([2.0, 1.0, 1.0], np.float32))
DISCRETE = gym.spaces.Discrete(4)
# Small images and a small conv stack keep the CNN tests fast.
IMG = gym.spaces.Box(0, 255, (24, 24, 3), np.uint8)
DICT_OBS = gym.spaces.Dict({"state": STATE, "rgb_base_camera": IMG, "rgb_hand_camera": IMG})
SMALL_CNN = {"conv_channels": (8, 8), "conv_kernels": (4, 3), "conv_strides": (2, 2), "image_feature_dim": 16,
             "hidden_sizes": (32,)}  # fmt: skip

HEADS = [
    ("categorical", DISCRETE),
    ("gaussian", BOX),
    ("squashed_gaussian", BOX),
]


def _obs(space: gym.Space, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if isinstance(space, gym.spaces.Dict):
        return {k: _obs(s, n, seed + i + 1) for i, (k, s) in enumerate(space.spaces.items())}
    if space.dtype == np.uint8:
        return torch.randint(0, 256, (n, *space.shape), generator=g, dtype=torch.uint8)
    return torch.randn(n, *space.shape, generator=g)


def _policy(kind: str, head: str, action_space: gym.Space, chunk: int):
    if kind == "mlp":
        return make_policy("mlp", STATE, action_space, action_head=head, chunk=chunk, hidden_sizes=(16,))
    return make_policy("cnn", DICT_OBS, action_space, action_head=head, chunk=chunk, **SMALL_CNN)


def _expected_action_shape(action_space: gym.Space, n: int, chunk: int) -> tuple[int, ...]:
    per_step = () if isinstance(action_space, gym.spaces.Discrete) else action_space.shape
    return (n, *per_step) if chunk == 1 else (n, chunk, *per_step)


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("head,action_space", HEADS, ids=[h for h, _ in HEADS])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_shapes_for_every_head_and_chunk(kind, head, action_space, chunk):
    torch.manual_seed(0)
    policy = _policy(kind, head, action_space, chunk)
    assert policy.head_kind == head
    obs = _obs(STATE if kind == "mlp" else DICT_OBS, 6)
    action, logp, value = policy.act(obs)
    assert action.shape == _expected_action_shape(action_space, 6, chunk)
    assert logp.shape == (6,) and value.shape == (6,) and not logp.requires_grad
    logp2, entropy, value2 = policy.evaluate(obs, action)
    assert logp2.shape == entropy.shape == value2.shape == (6,) and logp2.requires_grad
    torch.testing.assert_close(logp2, logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value2, value)
    torch.testing.assert_close(policy.value(obs), value)
    det1, _, _ = policy.act(obs, deterministic=True)
    det2, _, _ = policy.act(obs, deterministic=True)
    torch.testing.assert_close(det1, det2)
    if head == "categorical":
        assert action.dtype == torch.int64 and ((action >= 0) & (action < action_space.n)).all()
        with pytest.raises(NotImplementedError):
            policy.sample(obs)
    else:
        a, lp = policy.sample(obs)
        assert a.shape == action.shape and lp.shape == (6,) and a.requires_grad
    if head == "squashed_gaussian":
        low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
        assert ((action >= low) & (action <= high)).all()


def _squash_log_prob_reference(mean, log_std, loc, scale, u):
    """log N(u) - log|det d(loc + scale * tanh(u))/du|, the Jacobian from autograd, float64."""
    base = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1)
    log_dets = []
    for row in u:
        jac = torch.autograd.functional.jacobian(lambda x: loc + scale * torch.tanh(x), row)
        log_dets.append(torch.linalg.slogdet(jac).logabsdet)
    return base - torch.stack(log_dets)


@pytest.mark.parametrize("chunk", [1, 2])
def test_squashed_gaussian_log_prob_matches_change_of_variables(chunk):
    torch.manual_seed(0)
    head, kind = make_action_head("squashed_gaussian", BOX, 7, chunk=chunk, gain=1.0)
    head = head.double()
    feats = torch.randn(5, 7, dtype=torch.float64)
    dist = head(feats)
    base_dist: SquashedGaussian = dist.base if chunk > 1 else dist
    loc = torch.as_tensor(np.tile(BOX.low + BOX.high, chunk) / 2, dtype=torch.float64)
    scale = torch.as_tensor(np.tile(BOX.high - BOX.low, chunk) / 2, dtype=torch.float64)
    mean, log_std = base_dist.base.mean, base_dist.base.log_std

    # rsample: the log-prob returned with the sample is that of the pre-squash u.
    action, logp = dist.rsample_with_log_prob()
    assert action.shape == _expected_action_shape(BOX, 5, chunk)
    u = torch.atanh(((action.reshape(5, -1) - loc) / scale).clamp(-1 + 1e-12, 1 - 1e-12))
    ref = _squash_log_prob_reference(mean, log_std, loc, scale, u)
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    # log_prob of a given in-bounds action inverts the squash.
    u2 = torch.randn(5, 3 * chunk, dtype=torch.float64)
    y = (loc + scale * torch.tanh(u2)).reshape(action.shape)
    torch.testing.assert_close(dist.log_prob(y), _squash_log_prob_reference(mean, log_std, loc, scale, u2))
    # The density on [loc - scale, loc + scale] = [-1, 2] integrates to 1.
    grid = torch.linspace(-1.0, 2.0, 200_001, dtype=torch.float64)[1:-1].unsqueeze(-1)
    one = SquashedGaussian(torch.full_like(grid, 0.3), torch.full((1,), -0.2, dtype=torch.float64), 0.5, 1.5)
    assert float(torch.trapezoid(one.log_prob(grid).exp(), grid.squeeze(-1))) == pytest.approx(1.0, abs=1e-4)


def test_chunked_categorical_and_gaussian_match_per_step_sums():
    torch.manual_seed(0)
    head, _ = make_action_head("categorical", DISCRETE, 6, chunk=3, gain=1.0)
    feats = torch.randn(4, 6)
    dist = head(feats)
    assert isinstance(dist, Chunked)
    action = dist.sample()
    assert action.shape == (4, 3)
    logits = head.head.logits(feats).reshape(4, 3, 4)
    ref = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(dist.log_prob(action), ref.log_prob(action).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.mode(), logits.argmax(-1))

    ghead, _ = make_action_head("gaussian", BOX, 6, chunk=2, log_std_init=-0.5, gain=1.0)
    gdist = ghead(feats)
    a = gdist.sample()
    assert a.shape == (4, 2, 3)
    mean = ghead.head.mean(feats).reshape(4, 2, 3)
    normal = torch.distributions.Normal(mean, torch.full_like(mean, float(np.exp(-0.5))))
    torch.testing.assert_close(gdist.log_prob(a), normal.log_prob(a).sum((-1, -2)))
    torch.testing.assert_close(gdist.mode(), mean)


def test_cnn_forward_on_dict_obs_numpy_and_gradients():
    torch.manual_seed(0)
    policy = make_policy("cnn", DICT_OBS, BOX, **SMALL_CNN)
    assert isinstance(policy, CNNActorCritic)
    assert policy.image_keys == ["rgb_base_camera", "rgb_hand_camera"] and policy.state_keys == ["state"]
    # numpy in, as an env gives it
    obs = {k: v.numpy() for k, v in _obs(DICT_OBS, 3).items()}
    action, logp, value = policy.act(obs)
    assert action.shape == (3, 3) and value.shape == (3,)
    # the image matters (scaled uint8 input reaches the output)
    changed = dict(obs, rgb_hand_camera=np.zeros_like(obs["rgb_hand_camera"]))
    assert not torch.allclose(policy.value(changed), value)
    # unshared encoders keep actor and critic gradients apart
    split = make_policy("cnn", DICT_OBS, BOX, share_encoder=False, **SMALL_CNN)
    t_obs = _obs(DICT_OBS, 3)
    split.value(t_obs).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in split.actor_parameters())
    assert all(p.grad is not None for p in split.critic_parameters())
    # shared encoders get the value loss's gradient
    policy.value(t_obs).sum().backward()
    assert all(p.grad is not None and p.grad.any() for p in policy.actor_encoders.parameters())
    # a single image Box works too, and a state-only space is refused
    single = make_policy("cnn", IMG, DISCRETE, **SMALL_CNN)
    a, _, _ = single.act(_obs(IMG, 2))
    assert a.shape == (2,)


def test_registry_and_config_errors():
    assert {"mlp", "cnn"} <= set(registered_policies())
    with pytest.raises(ValueError, match=r"unknown policy 'cnnn'.*'cnn'.*'mlp'"):
        make_policy("cnnn", DICT_OBS, BOX)
    with pytest.raises(ValueError, match="no image keys"):
        make_policy("cnn", gym.spaces.Dict({"state": STATE}), BOX)
    with pytest.raises(ValueError, match="mlp"):
        make_policy("cnn", gym.spaces.Dict({"state": STATE}), BOX)
    with pytest.raises(ConfigError, match="conv_kernels"):
        make_policy("cnn", DICT_OBS, BOX, conv_kernels=(3,))
    with pytest.raises(ValueError, match="too small"):
        make_policy("cnn", gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)}), BOX)
    with pytest.raises(ValueError, match="not in the observation space"):
        make_policy("cnn", DICT_OBS, BOX, image_keys=("rgb_wrist",), **SMALL_CNN)
    with pytest.raises(ConfigError, match="action_head"):
        make_policy("cnn", DICT_OBS, BOX, action_head="beta", **SMALL_CNN)
    with pytest.raises(ValueError, match="Discrete"):
        make_policy("cnn", DICT_OBS, BOX, action_head="categorical", **SMALL_CNN)
    with pytest.raises(ConfigError, match="chunk"):
        make_policy("mlp", STATE, BOX, chunk=0)
    with pytest.raises(ValueError, match="Box observation"):
        make_policy("mlp", DICT_OBS, BOX)
