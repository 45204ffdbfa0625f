"""Critic-free advantages (GRPO, DAPO, Reinforce++) against slow reference loops, and their learner."""

from __future__ import annotations

import math
import statistics

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf_nb.algorithms import advantages as A
from rlinf_nb.algorithms.functional import ppo_policy_loss
from rlinf_nb.algorithms.grpo import (
    DAPOConfig,
    GroupPolicyLearner,
    GRPOConfig,
    ReinforcePPConfig,
    group_advantages,
)
from rlinf_nb.algorithms.registry import get_algorithm
from rlinf_nb.config import build, live_fields

SHAPES = [(1, 1), (1, 4), (5, 1), (7, 3), (16, 8), (33, 6)]


def _dones(T, N, p, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(T, N, generator=g) < p


# ----------------------------------------------------------------------------- references


def segment_reference(dones):
    """Per env, walk time and start a new episode after every done (env-major numbering)."""
    T, N = len(dones), len(dones[0])
    ids = [[0] * N for _ in range(T)]
    env, ordinal, finished, lengths = [], [], [], []
    next_id = 0
    for n in range(N):
        k = 0
        cur = None
        for t in range(T):
            if cur is None:
                cur = next_id
                next_id += 1
                env.append(n)
                ordinal.append(k)
                finished.append(False)
                lengths.append(0)
                k += 1
            ids[t][n] = cur
            lengths[cur] += 1
            if dones[t][n]:
                finished[cur] = True
                cur = None
    return ids, env, ordinal, finished, lengths


def grpo_reference(scores, groups, valid, eps, scale_by_std):
    adv = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i] and valid[j]]
        if not valid[i] or len(members) < 2:
            adv.append(0.0)
            continue
        mean = sum(members) / len(members)
        std = statistics.stdev(members)
        adv.append((s - mean) / (std + eps) if scale_by_std else s - mean)
    return adv


def returns_reference(rewards, dones, gamma):
    """G_t as the explicit discounted sum of the episode's future rewards inside the rollout."""
    T, N = len(rewards), len(rewards[0])
    out = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for t in range(T):
            total, k = 0.0, 0
            while t + k < T:
                total += gamma**k * rewards[t + k][n]
                if dones[t + k][n]:
                    break
                k += 1
            out[t][n] = total
    return out


# ----------------------------------------------------------------------------- episodes


@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_segment_episodes_matches_reference(T, N, p):
    dones = _dones(T, N, p, seed=T * 100 + N)
    lay = A.segment_episodes(dones)
    ids, env, ordinal, finished, lengths = segment_reference(dones.tolist())
    assert lay.episode_ids.tolist() == ids
    assert lay.env.tolist() == env
    assert lay.ordinal.tolist() == ordinal
    assert lay.finished.tolist() == finished
    assert lay.lengths.tolist() == lengths
    assert lay.num_episodes == len(env)


def test_episode_sums_and_group_ids():
    # env 0: episodes [0,1] (done at t=1) and [2]; env 1: one unfinished episode.
    dones = torch.tensor([[False, False], [True, False], [False, False]])
    rewards = torch.tensor([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]])
    lay = A.segment_episodes(dones)
    assert A.episode_sums(rewards, lay.episode_ids, lay.num_episodes).tolist() == [3.0, 4.0, 70.0]
    # both envs in env-group 0: first episodes group together, env 0's second is alone
    gids = A.episode_group_ids(lay, torch.tensor([0, 0]))
    assert gids.tolist() == [0, 1, 0]
    gids = A.episode_group_ids(lay, torch.tensor([0, 1]))
    assert gids.tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------- GRPO


@pytest.mark.parametrize("E", [1, 2, 5, 16, 40])
@pytest.mark.parametrize("num_groups", [1, 3, 8])
@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("p_invalid", [0.0, 0.3])
def test_grpo_advantages_match_reference(E, num_groups, scale_by_std, p_invalid):
    g = torch.Generator().manual_seed(E * 31 + num_groups)
    scores = torch.randn(E, generator=g, dtype=torch.float64) * 5
    groups = torch.randint(0, num_groups, (E,), generator=g)
    valid = torch.rand(E, generator=g) >= p_invalid
    scores_with_garbage = torch.where(valid, scores, torch.tensor(float("nan"), dtype=torch.float64))
    out = A.grpo_advantages(scores_with_garbage, groups, 1e-6, scale_by_std, valid)
    ref = grpo_reference(scores.tolist(), groups.tolist(), valid.tolist(), 1e-6, scale_by_std)
    torch.testing.assert_close(out.advantages, torch.tensor(ref, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    assert torch.isfinite(out.advantages).all()
    for i in range(E):
        members = [j for j in range(E) if groups[j] == groups[i] and valid[j]]
        assert out.group_size[i] == len(members)


def test_grpo_group_size_one_gives_zero_advantage():
    scores = torch.tensor([3.0, -1.0, 7.0])
    out = A.grpo_advantages(scores, torch.arange(3))
    assert out.advantages.tolist() == [0.0, 0.0, 0.0]
    assert out.group_std.tolist() == [0.0, 0.0, 0.0]


def test_grpo_equal_scores_give_zero_advantage_not_nan():
    out = A.grpo_advantages(torch.full((4,), 2.5), torch.zeros(4, dtype=torch.int64))
    assert out.advantages.tolist() == [0.0] * 4


@pytest.mark.parametrize("E", [1, 4, 12, 30])
@pytest.mark.parametrize("num_groups", [1, 4, 10])
def test_dynamic_sampling_matches_reference(E, num_groups):
    g = torch.Generator().manual_seed(E + 7 * num_groups)
    # integer scores so that equal groups actually happen
    scores = torch.randint(0, 2, (E,), generator=g).double()
    groups = torch.randint(0, num_groups, (E,), generator=g)
    valid = torch.rand(E, generator=g) > 0.2
    keep = A.dynamic_sampling_mask(scores, groups, valid)
    for i in range(E):
        members = [scores[j].item() for j in range(E) if groups[j] == groups[i] and valid[j]]
        expected = bool(valid[i]) and len(members) > 1 and max(members) > min(members)
        assert bool(keep[i]) == expected


# ----------------------------------------------------------------------------- Reinforce++


@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("p", [0.0, 0.2, 1.0])
def test_discounted_returns_match_reference(T, N, gamma, p):
    dones = _dones(T, N, p, seed=T + 13 * N)
    rewards = torch.randn(T, N, generator=torch.Generator().manual_seed(T * N), dtype=torch.float64)
    out = A.discounted_returns(rewards, dones, gamma)
    ref = returns_reference(rewards.tolist(), dones.tolist(), gamma)
    torch.testing.assert_close(out, torch.tensor(ref, dtype=torch.float64), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("T,N", [(4, 1), (7, 3), (33, 6)])
@pytest.mark.parametrize("masked", [False, True])
def test_reinforce_pp_matches_reference(T, N, masked):
    g = torch.Generator().manual_seed(T * N)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    dones = torch.rand(T, N, generator=g) < 0.2
    mask = torch.rand(T, N, generator=g) > 0.3 if masked else None
    adv, ret = A.reinforce_pp_advantages(rewards, dones, 0.95, mask, eps=1e-8)
    ref_ret = returns_reference(rewards.tolist(), dones.tolist(), 0.95)
    flat = [
        ref_ret[t][n] for t in range(T) for n in range(N) if mask is None or mask[t, n]
    ]  # the global baseline
    mean, std = sum(flat) / len(flat), statistics.stdev(flat)
    for t in range(T):
        for n in range(N):
            valid = mask is None or bool(mask[t, n])
            expected = (ref_ret[t][n] - mean) / (std + 1e-8) if valid else 0.0
            assert math.isclose(adv[t, n].item(), expected, rel_tol=1e-9, abs_tol=1e-9)
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64))


def test_reinforce_pp_works_with_group_size_one():
    """One env, one episode: the batch baseline still gives finite, non-zero advantages."""
    rewards = torch.ones(10, 1)
    dones = torch.zeros(10, 1, dtype=torch.bool)
    dones[-1] = True
    adv, _ = A.reinforce_pp_advantages(rewards, dones, 0.99)
    assert torch.isfinite(adv).all() and adv.abs().sum() > 0
    assert adv[0, 0] > 0 > adv[-1, 0]  # early steps have more return ahead


# ----------------------------------------------------------------------------- losses


@pytest.mark.parametrize("B", [1, 6, 50])
@pytest.mark.parametrize("mode", A.AGGREGATIONS)
@pytest.mark.parametrize("masked", [False, True])
def test_aggregate_loss_matches_reference(B, mode, masked):
    g = torch.Generator().manual_seed(B)
    x = torch.randn(B, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 4, (B,), generator=g)
    mask = torch.rand(B, generator=g) > 0.3 if masked else torch.ones(B, dtype=torch.bool)
    x_garbage = torch.where(mask, x, torch.tensor(float("inf"), dtype=torch.float64))
    out = A.aggregate_loss(x_garbage, mask if masked else None, mode, ids)
    valid = [i for i in range(B) if mask[i]]
    if not valid:
        expected = 0.0
    elif mode == "step-mean":
        expected = sum(x[i].item() for i in valid) / len(valid)
    else:
        per_ep = {}
        for i in valid:
            per_ep.setdefault(int(ids[i]), []).append(x[i].item())
        expected = sum(sum(v) / len(v) for v in per_ep.values()) / len(per_ep)
    assert math.isclose(out.item(), expected, rel_tol=1e-10, abs_tol=1e-12)


def test_aggregate_loss_rejects_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        A.aggregate_loss(torch.zeros(3), mode="token-sum")
    with pytest.raises(ValueError, match="episode_ids"):
        A.aggregate_loss(torch.zeros(3), mode="episode-mean")


@pytest.mark.parametrize("B", [1, 8, 64])
@pytest.mark.parametrize("low,high", [(0.2, None), (0.2, 0.28), (0.1, 0.5)])
@pytest.mark.parametrize("mode", A.AGGREGATIONS)
def test_clipped_surrogate_matches_reference(B, low, high, mode):
    g = torch.Generator().manual_seed(B)
    new = (torch.randn(B, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    old = torch.randn(B, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 3, (B,), generator=g)
    mask = torch.rand(B, generator=g) > 0.25
    terms = A.clipped_surrogate_loss(new, old, adv, low, high, mask, ids, mode)
    hi = low if high is None else high
    per = {}
    for i in range(B):
        if not mask[i]:
            continue
        r = math.exp(new[i].item() - old[i].item())
        a = adv[i].item()
        val = -min(r * a, min(max(r, 1 - low), 1 + hi) * a)
        per.setdefault(int(ids[i]) if mode == "episode-mean" else 0, []).append(val)
    if mode == "step-mean":
        vals = per.get(0, [])
        expected = sum(vals) / len(vals) if vals else 0.0
    else:
        expected = sum(sum(v) / len(v) for v in per.values()) / len(per) if per else 0.0
    assert math.isclose(terms.loss.item(), expected, rel_tol=1e-10, abs_tol=1e-12)
    terms.loss.backward()
    assert torch.isfinite(new.grad).all()
    assert (new.grad[~mask] == 0).all()


@pytest.mark.parametrize("high", [None, 0.28])
def test_clipped_surrogate_step_mean_equals_ppo_policy_loss(high):
    g = torch.Generator().manual_seed(0)
    new, old, adv = (torch.randn(40, generator=g) * 0.4 for _ in range(3))
    mask = torch.rand(40, generator=g) > 0.2
    ours = A.clipped_surrogate_loss(new, old, adv, 0.2, high, mask)
    ppo = ppo_policy_loss(new, old, adv, 0.2, mask, clip_eps_high=high)
    for a, b in zip(ours, ppo, strict=True):
        torch.testing.assert_close(a, b)


def test_clip_higher_lets_positive_advantages_push_further():
    """A ratio of 1.25 with A > 0 is clipped at 1.2 (no gradient) but not at 1.28 (gradient)."""
    old = torch.zeros(1)
    new = torch.full((1,), math.log(1.25), requires_grad=True)
    adv = torch.ones(1)
    A.clipped_surrogate_loss(new, old, adv, 0.2).loss.backward()
    assert new.grad.item() == 0.0
    new.grad = None
    A.clipped_surrogate_loss(new, old, adv, 0.2, 0.28).loss.backward()
    assert new.grad.item() < 0.0


# ----------------------------------------------------------------------------- batch level + learner


def _group_batch(T=12, N=8, seed=0):
    rng = np.random.default_rng(seed)
    dones = rng.random((T, N)) < 0.15
    dones[-1] = True  # every env's last episode ends with the rollout
    return {"rewards": rng.normal(size=(T, N)).astype(np.float32), "dones": dones}


def test_group_advantages_grpo_matches_episode_level_maths():
    batch = _group_batch()
    hp = GRPOConfig(group_size=4)
    out = group_advantages(batch, hp)
    lay = A.segment_episodes(torch.as_tensor(batch["dones"]))
    ret = A.episode_sums(
        torch.as_tensor(batch["rewards"], dtype=torch.float64), lay.episode_ids, lay.num_episodes
    )
    gids = A.episode_group_ids(lay, torch.arange(8) // 4)
    ref = grpo_reference(ret.tolist(), gids.tolist(), [True] * lay.num_episodes, hp.std_eps, True)
    expected = np.array(ref, dtype=np.float32)[lay.episode_ids.numpy()]
    np.testing.assert_allclose(batch["advantages"], expected, rtol=1e-5, atol=1e-6)
    assert batch["mask"].all() and batch["episode_ids"].shape == (12, 8)
    assert out["episodes"] == lay.num_episodes


def test_group_advantages_masks_unfinished_and_group_size_one():
    batch = _group_batch()
    batch["dones"][-1] = False
    group_advantages(batch, GRPOConfig(group_size=1))
    assert (batch["advantages"] == 0).all()  # group size 1: nothing to compare with
    lay = A.segment_episodes(torch.as_tensor(batch["dones"]))
    np.testing.assert_array_equal(batch["mask"], lay.finished[lay.episode_ids].numpy())


def test_group_advantages_dapo_drops_equal_groups():
    T, N = 5, 4
    batch = {"rewards": np.ones((T, N), np.float32), "dones": np.zeros((T, N), bool)}
    batch["dones"][-1] = True
    batch["rewards"][:, 2] = 0.0  # group 1 (envs 2, 3) differs, group 0 (envs 0, 1) is all equal
    out = group_advantages(batch, DAPOConfig(group_size=2))
    assert batch["mask"][:, :2].sum() == 0 and batch["mask"][:, 2:].all()
    assert out["dropped_group_fraction"] == 0.5


def test_group_advantages_rejects_group_size_not_dividing_envs():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(_group_batch(N=6), GRPOConfig(group_size=4))


def test_group_advantages_reinforcepp_group_size_one_is_fine():
    batch = _group_batch(N=1)
    group_advantages(batch, ReinforcePPConfig())
    assert np.isfinite(batch["advantages"]).all() and np.abs(batch["advantages"]).sum() > 0


def test_configs_registry_and_live_fields():
    assert DAPOConfig().clip_eps_high == 0.28 and DAPOConfig().dynamic_sampling
    assert DAPOConfig().loss_aggregation == "step-mean" and GRPOConfig().loss_aggregation == "episode-mean"
    for name in ("grpo", "dapo", "reinforcepp"):
        algo = get_algorithm(name)
        assert algo.stage_names() == ["rollout", "advantages", "update", "sync_weights"]
    assert {"lr", "clip_eps", "epochs"} <= set(live_fields(GRPOConfig))
    with pytest.raises(ValueError, match="loss_aggregation"):
        build(GRPOConfig, {"loss_aggregation": "token-sum"})


def test_group_policy_learner_update_and_state_round_trip():
    from rlinf_nb.policies import make_policy

    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    policy = make_policy("mlp", obs_space, gym.spaces.Discrete(2))
    T, N = 16, 4
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T, N, 4)).astype(np.float32)
    with torch.no_grad():
        actions, logp, _ = policy.act(torch.as_tensor(obs).flatten(0, 1))
    batch = _group_batch(T, N)
    batch.update(obs=obs, actions=actions.reshape(T, N).numpy(), logprobs=logp.reshape(T, N).numpy())
    cfg = GRPOConfig(group_size=2, minibatch_size=16, epochs=2)
    group_advantages(batch, cfg)
    learner = GroupPolicyLearner(policy, cfg, seed=0)
    before = {k: v.copy() for k, v in learner.policy_state().items()}
    out = learner.update(batch, cfg)
    assert all(math.isfinite(out[k]) for k in ("policy_loss", "entropy", "approx_kl"))
    after = learner.policy_state()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    other = GroupPolicyLearner(make_policy("mlp", obs_space, gym.spaces.Discrete(2)), cfg, seed=1)
    other.load_state_dict(learner.state_dict())
    assert torch.equal(other.generator.get_state(), learner.generator.get_state())
