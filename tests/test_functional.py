"""The PPO maths (rlinf_nb.algorithms.functional) against slow reference loops, and the policies."""

from __future__ import annotations

import math
import random

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf_nb.algorithms.functional import (
    entropy_bonus,
    gae,
    masked_mean,
    normalize_advantages,
    ppo_policy_loss,
    value_loss,
)
from rlinf_nb.policies import ActorCritic, MLPPolicyConfig, make_policy, register_policy
from rlinf_nb.policies.distributions import Categorical, DiagGaussian, SquashedGaussian

# ----------------------------------------------------------------------------- GAE reference


def gae_reference(rewards, values, dones, truncated, last_values, bootstrap_values, gamma, lam):
    """Slow, obviously-correct GAE: per env, per step, the explicit sum over the episode's future.

    ``A_t = sum_k (gamma * lam)^k * delta_{t+k}``, summing from ``t`` up to and including the
    step where the episode ends (or the end of the rollout). ``delta_s = r_s + gamma * V_next(s)
    - V(s)`` where ``V_next`` is 0 after a termination, ``V(final obs)`` after a truncation and
    the next row's value (or ``last_values``) otherwise.
    """
    T, N = len(rewards), len(rewards[0])

    def next_value(s, n):
        if truncated[s][n]:
            return bootstrap_values[s][n] if bootstrap_values is not None else 0.0
        if dones[s][n]:
            return 0.0
        return values[s + 1][n] if s + 1 < T else last_values[n]

    def delta(s, n):
        return rewards[s][n] + gamma * next_value(s, n) - values[s][n]

    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for t in range(T):
            total, k = 0.0, 0
            while t + k < T:
                s = t + k
                total += (gamma * lam) ** k * delta(s, n)
                if dones[s][n] or truncated[s][n]:
                    break
                k += 1
            adv[t][n] = total
    ret = [[adv[t][n] + values[t][n] for n in range(N)] for t in range(T)]
    return adv, ret


def _random_rollout(T, N, p_done, p_trunc, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=dtype)
    values = torch.randn(T, N, generator=g, dtype=dtype)
    last_values = torch.randn(N, generator=g, dtype=dtype)
    bootstrap = torch.randn(T, N, generator=g, dtype=dtype)
    ended = torch.rand(T, N, generator=g) < p_done
    trunc = ended & (torch.rand(T, N, generator=g) < p_trunc)
    return rewards, values, ended, trunc, last_values, bootstrap


def _check_gae(T, N, gamma, lam, p_done, p_trunc, with_bootstrap, seed):
    rewards, values, dones, trunc, last, boot = _random_rollout(T, N, p_done, p_trunc, seed)
    boot = boot if with_bootstrap else None
    adv, ret = gae(rewards, values, dones, trunc, last, boot, gamma, lam)
    ref_adv, ref_ret = gae_reference(
        rewards.tolist(),
        values.tolist(),
        dones.tolist(),
        trunc.tolist(),
        last.tolist(),
        None if boot is None else boot.tolist(),
        gamma,
        lam,
    )
    assert adv.shape == (T, N) and ret.shape == (T, N)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("T", [1, 4, 33])
@pytest.mark.parametrize("N", [1, 3, 8])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
@pytest.mark.parametrize("with_bootstrap", [True, False])
def test_gae_matches_reference_grid(T, N, gamma, lam, with_bootstrap):
    seed = hash((T, N, gamma, lam, with_bootstrap)) % 2**31
    _check_gae(T, N, gamma, lam, p_done=0.2, p_trunc=0.5, with_bootstrap=with_bootstrap, seed=seed)


@pytest.mark.parametrize("p_done,p_trunc", [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.5, 1.0), (0.05, 0.3)])
@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_reference_done_patterns(p_done, p_trunc, seed):
    _check_gae(16, 5, 0.97, 0.9, p_done, p_trunc, with_bootstrap=True, seed=seed)


def test_gae_matches_reference_hypothesis():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(
        T=st.integers(1, 20),
        N=st.integers(1, 6),
        gamma=st.floats(0.0, 1.0),
        lam=st.floats(0.0, 1.0),
        p_done=st.floats(0.0, 1.0),
        p_trunc=st.floats(0.0, 1.0),
        seed=st.integers(0, 2**16),
    )
    def check(T, N, gamma, lam, p_done, p_trunc, seed):
        _check_gae(T, N, gamma, lam, p_done, p_trunc, with_bootstrap=True, seed=seed)

    check()


@pytest.mark.parametrize("L", [1, 2, 7, 50])
@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_gae_terminal_reward(L, gamma):
    """Reward 1 only at the terminal step, zero values, lam=1: A_t = gamma^(L-1-t)."""
    rewards = torch.zeros(L, 1, dtype=torch.float64)
    rewards[-1] = 1.0
    dones = torch.zeros(L, 1, dtype=torch.bool)
    dones[-1] = True
    values = torch.zeros(L, 1, dtype=torch.float64)
    adv, ret = gae(
        rewards, values, dones, torch.zeros_like(dones), torch.zeros(1, dtype=torch.float64), None, gamma, 1.0
    )
    expected = torch.tensor([[gamma ** (L - 1 - t)] for t in range(L)], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_gae_truncation_bootstraps_without_continuing_chain():
    """A truncation adds gamma * V(final obs) but the next row (a new episode) does not leak in."""
    rewards = torch.tensor([[1.0], [1.0], [5.0]])
    values = torch.tensor([[0.5], [0.25], [100.0]])
    dones = torch.tensor([[False], [True], [False]])
    trunc = torch.tensor([[False], [True], [False]])
    boot = torch.tensor([[-7.0], [2.0], [-7.0]])  # only boot[1] is read
    gamma, lam = 0.9, 0.95
    adv, _ = gae(rewards, values, dones, trunc, torch.tensor([0.0]), boot, gamma, lam)
    d1 = 1.0 + gamma * 2.0 - 0.25
    d0 = 1.0 + gamma * 0.25 - 0.5
    torch.testing.assert_close(adv[1, 0], torch.tensor(d1))
    torch.testing.assert_close(adv[0, 0], torch.tensor(d0 + gamma * lam * d1))
    # Values in bootstrap_values where not truncated are ignored.
    adv2, _ = gae(rewards, values, dones, trunc, torch.tensor([0.0]), boot.clone().fill_(2.0), gamma, lam)
    torch.testing.assert_close(adv, adv2)
    # truncated without dones still ends the episode.
    adv3, _ = gae(rewards, values, torch.zeros_like(dones), trunc, torch.tensor([0.0]), boot, gamma, lam)
    torch.testing.assert_close(adv, adv3)


def test_gae_last_values_only_used_when_last_step_continues():
    rewards, values, dones, trunc, last, boot = _random_rollout(6, 4, 0.3, 0.5, seed=1)
    dones[-1] = torch.tensor([True, False, True, False])
    trunc[-1] = torch.tensor([False, False, True, False])
    a1, _ = gae(rewards, values, dones, trunc, last, boot, 0.99, 0.95)
    last2 = last.clone()
    last2[[0, 2]] += 1000.0
    a2, _ = gae(rewards, values, dones, trunc, last2, boot, 0.99, 0.95)
    torch.testing.assert_close(a1, a2)
    last3 = last.clone()
    last3[1] += 1.0
    a3, _ = gae(rewards, values, dones, trunc, last3, boot, 0.99, 0.95)
    assert (a3[:, 1] - a1[:, 1]).abs().max() > 0.1


def test_gae_accepts_float_flags_and_checks_shapes():
    rewards, values, dones, trunc, last, boot = _random_rollout(5, 2, 0.3, 0.5, seed=2, dtype=torch.float32)
    a_bool, _ = gae(rewards, values, dones, trunc, last, boot, 0.99, 0.95)
    a_float, _ = gae(rewards, values, dones.float(), trunc.float(), last, boot, 0.99, 0.95)
    torch.testing.assert_close(a_bool, a_float)
    a_none, _ = gae(rewards, values, dones, None, last, None, 0.99, 0.95)
    a_zero, _ = gae(rewards, values, dones, torch.zeros_like(trunc), last, None, 0.99, 0.95)
    torch.testing.assert_close(a_none, a_zero)
    with pytest.raises(ValueError, match="last_values"):
        gae(rewards, values, dones, trunc, last[:1], boot, 0.99, 0.95)
    with pytest.raises(ValueError, match="values"):
        gae(rewards, values[:-1], dones, trunc, last, boot, 0.99, 0.95)
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        gae(rewards[:, 0], values, dones, trunc, last, boot, 0.99, 0.95)


# ----------------------------------------------------------------------------- masked statistics


def test_masked_mean_ignores_masked_entries():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([True, False, True, False])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    y = x.clone()
    y[1] = float("nan")
    y[3] = float("inf")
    assert masked_mean(y, mask).item() == pytest.approx(2.0)
    assert masked_mean(x, mask.float()).item() == pytest.approx(2.0)
    assert masked_mean(x).item() == pytest.approx(2.5)
    assert masked_mean(x, None).item() == pytest.approx(x.mean().item())


def test_masked_mean_all_invalid_is_zero_with_finite_grads():
    x = torch.tensor([float("nan"), 1.0], requires_grad=True)
    out = masked_mean(x, torch.zeros(2, dtype=torch.bool))
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(x.grad).all() and (x.grad == 0).all()


def test_masked_mean_broadcast_mask_2d():
    x = torch.arange(6.0).reshape(2, 3)
    mask = torch.tensor([[True], [False]])
    assert masked_mean(x, mask).item() == pytest.approx(1.0)


def test_normalize_advantages_masked():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(40, generator=g, dtype=torch.float64) * 3 + 2
    mask = torch.rand(40, generator=g) < 0.6
    out = normalize_advantages(adv, mask)
    valid = out[mask]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-6)
    assert (out[~mask] == 0).all()
    adv2 = adv.clone()
    adv2[~mask] = 1e6
    torch.testing.assert_close(normalize_advantages(adv2, mask), out)
    plain = normalize_advantages(adv)
    torch.testing.assert_close(plain, (adv - adv.mean()) / (adv.std() + 1e-8))
    # A single valid entry -> 0, not nan.
    one = normalize_advantages(adv, torch.arange(40) == 3)
    assert torch.isfinite(one).all() and (one == 0).all()


def test_entropy_bonus_masked():
    ent = torch.tensor([0.5, 1.5, 100.0])
    assert entropy_bonus(ent).item() == pytest.approx(34.0)
    assert entropy_bonus(ent, torch.tensor([1, 1, 0])).item() == pytest.approx(1.0)


# ----------------------------------------------------------------------------- PPO losses


def policy_loss_reference(new, old, adv, clip_eps, mask, clip_high):
    """Per-element loop: the loss, diagnostics and d(loss)/d(new_logprob)."""
    high = clip_eps if clip_high is None else clip_high
    n = len(new)
    valid = [i for i in range(n) if mask is None or mask[i]]
    count = max(len(valid), 1)
    loss = kl = clipped = ratio_sum = 0.0
    grad = [0.0] * n
    for i in valid:
        ratio = math.exp(new[i] - old[i])
        clipped_ratio = min(max(ratio, 1 - clip_eps), 1 + high)
        unclipped_obj, clipped_obj = ratio * adv[i], clipped_ratio * adv[i]
        loss -= min(unclipped_obj, clipped_obj) / count
        # The gradient flows only through the unclipped branch, and only when it is the minimum
        # or the ratio is inside the clip range (then both branches agree).
        if unclipped_obj <= clipped_obj or (1 - clip_eps < ratio < 1 + high):
            grad[i] = -ratio * adv[i] / count
        kl += ((ratio - 1) - (new[i] - old[i])) / count
        clipped += float(ratio < 1 - clip_eps or ratio > 1 + high) / count
        ratio_sum += ratio / count
    return loss, kl, clipped, ratio_sum, grad


@pytest.mark.parametrize("clip_eps,clip_high", [(0.2, None), (0.1, None), (0.2, 0.28), (0.3, 0.1)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_ppo_policy_loss_matches_reference(clip_eps, clip_high, masked, seed):
    g = torch.Generator().manual_seed(seed)
    n = 64
    old = torch.randn(n, generator=g, dtype=torch.float64)
    # Log-ratios spread over [-0.6, 0.6] hit both clip branches for both advantage signs.
    new = (old + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.2).requires_grad_(True)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) < 0.7) if masked else None
    terms = ppo_policy_loss(new, old, adv, clip_eps, mask=mask, clip_eps_high=clip_high)
    ref_loss, ref_kl, ref_clip, ref_ratio, ref_grad = policy_loss_reference(
        new.tolist(), old.tolist(), adv.tolist(), clip_eps, None if mask is None else mask.tolist(), clip_high
    )
    assert terms.loss.item() == pytest.approx(ref_loss, rel=1e-9, abs=1e-12)
    assert terms.approx_kl.item() == pytest.approx(ref_kl, rel=1e-9, abs=1e-12)
    assert terms.clip_fraction.item() == pytest.approx(ref_clip, rel=1e-9, abs=1e-12)
    assert terms.ratio_mean.item() == pytest.approx(ref_ratio, rel=1e-9, abs=1e-12)
    assert 0.05 < ref_clip < 0.95  # the data exercised both branches
    for diag in (terms.approx_kl, terms.clip_fraction, terms.ratio_mean):
        assert not diag.requires_grad
    terms.loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)


def test_ppo_policy_loss_masked_garbage_is_harmless():
    new = torch.tensor([0.1, float("nan"), -0.2, 50.0], requires_grad=True)
    old = torch.tensor([0.0, 0.0, 0.0, -50.0])
    adv = torch.tensor([1.0, float("inf"), -1.0, 3.0])
    mask = torch.tensor([True, False, True, False])
    terms = ppo_policy_loss(new, old, adv, 0.2, mask=mask)
    ref = ppo_policy_loss(new[[0, 2]], old[[0, 2]], adv[[0, 2]], 0.2)
    torch.testing.assert_close(terms.loss, ref.loss)
    terms.loss.backward()
    assert torch.isfinite(new.grad).all()
    assert new.grad[1] == 0 and new.grad[3] == 0


def test_ppo_policy_loss_identity_ratio():
    """At ratio 1 the loss is -mean(A), KL 0, nothing clipped."""
    lp = torch.randn(10)
    adv = torch.randn(10)
    terms = ppo_policy_loss(lp, lp.clone(), adv, 0.2)
    assert terms.loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert terms.approx_kl.item() == pytest.approx(0.0, abs=1e-7)
    assert terms.clip_fraction.item() == 0.0
    assert terms.ratio_mean.item() == pytest.approx(1.0)


def value_loss_reference(new, old, ret, clip_eps, mask):
    valid = [i for i in range(len(new)) if mask is None or mask[i]]
    total = 0.0
    for i in valid:
        sq = (new[i] - ret[i]) ** 2
        if clip_eps is not None:
            v_clip = old[i] + min(max(new[i] - old[i], -clip_eps), clip_eps)
            sq = max(sq, (v_clip - ret[i]) ** 2)
        total += sq
    return 0.5 * total / max(len(valid), 1)


@pytest.mark.parametrize("clip_eps", [None, 0.1, 0.5])
@pytest.mark.parametrize("masked", [False, True])
def test_value_loss_matches_reference(clip_eps, masked):
    g = torch.Generator().manual_seed(3)
    n = 50
    old = torch.randn(n, generator=g, dtype=torch.float64)
    new = old + torch.randn(n, generator=g, dtype=torch.float64) * 0.5
    ret = old + torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) < 0.6) if masked else None
    got = value_loss(new, old, ret, clip_eps=clip_eps, mask=mask)
    ref = value_loss_reference(
        new.tolist(), old.tolist(), ret.tolist(), clip_eps, None if mask is None else mask.tolist()
    )
    assert got.item() == pytest.approx(ref, rel=1e-10)
    if clip_eps is not None:
        unclipped = value_loss(new, old, ret, mask=mask)
        assert got.item() >= unclipped.item()  # the max() is pessimistic


def test_value_loss_clipping_branch():
    """V moved past the clip range away from the target: the clipped error dominates and grads stop."""
    old = torch.tensor([0.0])
    ret = torch.tensor([1.0])
    new = torch.tensor([1.5], requires_grad=True)  # overshoots: unclipped err 0.25, clipped (0.2-1)^2 = 0.64
    loss = value_loss(new, old, ret, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.5 * 0.64)
    loss.backward()
    assert new.grad.item() == 0.0
    new2 = torch.tensor([0.1], requires_grad=True)  # inside the range: plain MSE gradient
    value_loss(new2, old, ret, clip_eps=0.2).backward()
    assert new2.grad.item() == pytest.approx(0.1 - 1.0)


def test_value_loss_masked_garbage_is_harmless():
    new = torch.tensor([0.5, float("inf")], requires_grad=True)
    old = torch.tensor([0.0, float("nan")])
    ret = torch.tensor([1.0, 2.0])
    loss = value_loss(new, old, ret, clip_eps=0.2, mask=torch.tensor([True, False]))
    assert loss.item() == pytest.approx(0.5 * 0.8**2)
    loss.backward()
    assert torch.isfinite(new.grad).all()


# ----------------------------------------------------------------------------- policies

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
BOX_ACT = gym.spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 1.0], dtype=np.float32))


def _grads_zero(params):
    return all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in params)


def _grads_nonzero(params):
    return all(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in params)


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), BOX_ACT], ids=["discrete", "box"])
def test_actor_and_critic_gradients_are_separate(action_space):
    torch.manual_seed(0)
    policy = ActorCritic(CARTPOLE_OBS, action_space)
    obs = torch.randn(32, 4)
    action, old_logprob, old_values = policy.act(obs)
    advantages = torch.randn(32)
    returns = old_values + torch.randn(32)

    logprob, entropy, values = policy.evaluate(obs, action)
    (
        ppo_policy_loss(logprob, old_logprob + 0.05, advantages, 0.2).loss - 0.01 * entropy_bonus(entropy)
    ).backward()
    assert _grads_zero(policy.critic_parameters())
    assert _grads_nonzero(policy.actor_parameters())

    policy.zero_grad(set_to_none=True)
    logprob, entropy, values = policy.evaluate(obs, action)
    value_loss(values, old_values, returns, clip_eps=0.2).backward()
    assert _grads_zero(policy.actor_parameters())
    assert _grads_nonzero(policy.critic_parameters())


def test_shared_trunk_gets_both_gradients():
    policy = ActorCritic(CARTPOLE_OBS, gym.spaces.Discrete(2), share_trunk=True)
    obs = torch.randn(16, 4)
    value_loss(policy.value(obs), torch.zeros(16), torch.ones(16)).backward()
    assert _grads_nonzero(policy.actor_body.parameters())
    assert _grads_zero(policy.actor_head.parameters())
    assert len(list(policy.parameters())) == 4 + 2 + 2  # trunk once, two heads


def test_policy_api_shapes_and_consistency():
    torch.manual_seed(0)
    for space, head, action_shape in [
        (gym.spaces.Discrete(2), "auto", (7,)),
        (BOX_ACT, "auto", (7, 2)),
        (BOX_ACT, "squashed_gaussian", (7, 2)),
    ]:
        policy = make_policy("mlp", CARTPOLE_OBS, space, action_head=head, hidden_sizes=(16, 16))
        obs = torch.randn(7, 4)
        action, logprob, value = policy.act(obs)
        assert action.shape == action_shape and logprob.shape == (7,) and value.shape == (7,)
        assert not logprob.requires_grad
        lp2, ent, v2 = policy.evaluate(obs, action)
        torch.testing.assert_close(lp2, logprob, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v2, value)
        torch.testing.assert_close(policy.value(obs), value)
        assert ent.shape == (7,) and lp2.requires_grad
        det, _, _ = policy.act(obs, deterministic=True)
        det2, _, _ = policy.act(obs, deterministic=True)
        torch.testing.assert_close(det, det2)
        if head == "squashed_gaussian":
            low, high = torch.as_tensor(BOX_ACT.low), torch.as_tensor(BOX_ACT.high)
            assert ((action >= low) & (action <= high)).all()
            a, lp = policy.sample(obs)
            assert a.requires_grad and lp.shape == (7,)


def test_orthogonal_init_gains():
    policy = ActorCritic(CARTPOLE_OBS, gym.spaces.Discrete(2))
    w = policy.actor_body[0].weight  # [64, 4]: orthonormal columns scaled by sqrt(2)
    torch.testing.assert_close(w.T @ w, 2.0 * torch.eye(4), atol=1e-5, rtol=0)
    head = policy.actor_head.logits.weight  # [2, 64]: orthonormal rows scaled by 0.01
    torch.testing.assert_close(head @ head.T, 1e-4 * torch.eye(2), atol=1e-8, rtol=0)
    v = policy.critic_head.weight
    assert v.norm().item() == pytest.approx(1.0, abs=1e-5)
    assert all((m.bias == 0).all() for m in policy.modules() if isinstance(m, torch.nn.Linear))
    assert isinstance(policy.actor_body[1], torch.nn.Tanh)


def test_distributions_match_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, generator=g)
    a = torch.tensor([0, 2, 1, 1, 0])
    ref = torch.distributions.Categorical(logits=logits)
    ours = Categorical(logits)
    torch.testing.assert_close(ours.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(ours.entropy(), ref.entropy())

    mean, log_std = torch.randn(5, 2, generator=g), torch.randn(2, generator=g) * 0.3
    x = torch.randn(5, 2, generator=g)
    ref_n = torch.distributions.Normal(mean, log_std.exp())
    ours_n = DiagGaussian(mean, log_std)
    torch.testing.assert_close(ours_n.log_prob(x), ref_n.log_prob(x).sum(-1))
    torch.testing.assert_close(ours_n.entropy(), ref_n.entropy().sum(-1))

    # Squashed Gaussian against the naive change of variables in float64 (TransformedDistribution
    # would do, but its first use imports torch._refs, which costs seconds).
    loc, scale = torch.tensor([0.0, 0.5], dtype=torch.float64), torch.tensor([2.0, 0.5], dtype=torch.float64)
    mean64, log_std64 = mean.double(), log_std.double()
    base = torch.distributions.Normal(mean64, log_std64.exp())

    def naive_log_prob(u):
        return (base.log_prob(u) - torch.log(scale * (1 - torch.tanh(u) ** 2))).sum(-1)

    sq = SquashedGaussian(mean64, log_std64, loc, scale)
    u = torch.randn(5, 2, generator=g, dtype=torch.float64)
    y = loc + scale * torch.tanh(u)
    torch.testing.assert_close(sq.log_prob(y), naive_log_prob(u), rtol=1e-6, atol=1e-6)
    torch.manual_seed(1)
    action, lp = sq.rsample_with_log_prob()
    u_back = torch.atanh((action - loc) / scale)
    torch.testing.assert_close(lp, naive_log_prob(u_back), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sq.mode(), loc + scale * torch.tanh(mean64))


def test_registry_errors_and_config_validation():
    with pytest.raises(ValueError, match=r"unknown policy 'nope'.*'mlp'"):
        make_policy("nope", CARTPOLE_OBS, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="already registered"):

        @register_policy("mlp")
        class Other(torch.nn.Module):
            pass

    with pytest.raises(ValueError, match="activation"):
        make_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2), activation="swish2")
    with pytest.raises(ValueError, match="log_std_min"):
        ActorCritic(CARTPOLE_OBS, BOX_ACT, MLPPolicyConfig(log_std_min=1.0, log_std_max=0.0))
    with pytest.raises(ValueError, match="Discrete"):
        ActorCritic(CARTPOLE_OBS, BOX_ACT, action_head="categorical")
    policy = make_policy(
        "mlp", CARTPOLE_OBS, gym.spaces.Discrete(2), config=MLPPolicyConfig(hidden_sizes=(8,))
    )
    assert policy.config.hidden_sizes == (8,) and policy.actor_body[0].out_features == 8
    r = random.Random(0)
    sizes = (r.randint(1, 9), r.randint(1, 9))
    policy = make_policy(
        "mlp", CARTPOLE_OBS, gym.spaces.Discrete(2), hidden_sizes=sizes, critic_hidden_sizes=(5,)
    )
    assert policy.critic_body[0].out_features == 5 and policy.actor_body[2].out_features == sizes[1]


def test_sampling_frequencies():
    torch.manual_seed(0)
    probs = torch.tensor([0.6, 0.3, 0.1])
    dist = Categorical(probs.log().expand(20000, 3) + 5.0)  # unnormalised logits are fine
    counts = torch.bincount(dist.sample(), minlength=3).float() / 20000
    torch.testing.assert_close(counts, probs, atol=0.015, rtol=0)
    torch.testing.assert_close(dist.probs[0], probs)
    gauss = DiagGaussian(torch.full((20000, 1), 2.0), torch.tensor([math.log(0.5)]))
    x = gauss.sample()
    assert x.mean().item() == pytest.approx(2.0, abs=0.02) and x.std().item() == pytest.approx(0.5, abs=0.02)
