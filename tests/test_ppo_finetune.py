"""RL fine-tuning after SFT: PPO starts from another run's policy (``algo.init_from``) and can warm its
critic up first (``algo.critic_warmup_updates``) so an untrained value function does not pull a cloned
policy off what it learned."""

from __future__ import annotations

import shutil
import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlinf_nb.runtime.rundir import RunDir

from rlinf_nb.algorithms.ppo import PPOConfig, PPOLearner
from rlinf_nb.client import resolve_config
from rlinf_nb.config import ConfigError
from rlinf_nb.policies import make_policy

OBS, ACT = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)


def _batch(policy, T=8, N=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T * N, 5, generator=g)
    with torch.no_grad():
        actions, logp, values = policy.act(obs)
    shape = lambda x: x.reshape(T, N, *x.shape[1:]).numpy()  # noqa: E731
    return {
        "obs": shape(obs), "actions": shape(actions), "logprobs": shape(logp), "values": shape(values),
        "advantages": torch.randn(T, N, generator=g).numpy(), "returns": torch.randn(T, N, generator=g).numpy(),
    }  # fmt: skip


def _split(policy):
    critic = {id(p) for p in policy.critic_parameters()}
    actor = [p.detach().clone() for p in policy.parameters() if id(p) not in critic]
    return actor, [p.detach().clone() for p in policy.critic_parameters()]


def _same(xs, ys):
    return all(torch.equal(x, y) for x, y in zip(xs, ys, strict=True))


def test_critic_warmup_trains_only_the_value_function_then_the_policy_too():
    torch.manual_seed(0)
    policy = make_policy("mlp", OBS, ACT, hidden_sizes=(16, 16))
    cfg = PPOConfig(epochs=2, minibatch_size=8, lr=1e-2, critic_warmup_updates=2)
    learner = PPOLearner(policy, cfg)
    for update in range(2):  # warm-up: the actor (body, head and log-std) stays bit for bit
        actor0, critic0 = _split(policy)
        out = learner.update(_batch(policy, seed=update), cfg, 0.0)
        actor1, critic1 = _split(policy)
        assert out["critic_warmup"] == 1.0 and _same(actor0, actor1) and not _same(critic0, critic1)
        assert out["approx_kl"] == 0.0  # the policy did not move, so its ratio is 1 everywhere
    out = learner.update(_batch(policy, seed=2), cfg, 0.0)
    assert out["critic_warmup"] == 0.0 and not _same(actor1, _split(policy)[0])
    # the count survives a checkpoint: a resumed run does not warm up again
    again = PPOLearner(make_policy("mlp", OBS, ACT, hidden_sizes=(16, 16)), cfg)
    again.load_state_dict(learner.state_dict())
    assert again.updates == 3 and again.update(_batch(policy, seed=3), cfg, 0.0)["critic_warmup"] == 0.0


def test_init_from_a_run_without_a_checkpoint_fails_at_launch_only(tmp_path):
    """The check belongs to the launch of a new run: rebuilding the config (a live change, a resume) does not
    need the source run any more, so a deleted source run does not break those."""
    missing = f"no-such-run-{uuid.uuid4().hex[:6]}"
    cfg = resolve_config("ppo_cartpole", algo__init_from=missing)  # what set_hparams and resume rebuild
    with pytest.raises(ConfigError, match=r"algo\.init_from.*no such run"):
        cfg.algo.check_at_launch()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"algo\.init_from.*none complete"):
        resolve_config("bc_pushcube", algo__init_from=str(tmp_path / "empty")).algo.check_at_launch()


def _checkpoint_policy(name):
    run_dir = RunDir(name)
    return run_dir.load_checkpoint(run_dir.latest_checkpoint())["learner"]["policy"]


def test_ppo_fine_tunes_a_bc_run_policy_on_the_cluster(attached):
    """SFT -> RL: a PPO run starts from a BC run's checkpoint; after one warm-up update its actor is still
    exactly the BC actor while its critic trained. A policy of another shape is refused by name."""
    import rlinf_nb as rl

    bc = rl.launch(
        "bc_pushcube", name=f"sft-{uuid.uuid4().hex[:6]}", algo__dataset="scripted:4", algo__updates_per_iter=20,
        budget__total_env_steps=400, env__num_envs=4,
    )  # fmt: skip
    bc.wait(timeout=300)
    assert bc.status()["state"] == "finished", bc.status().get("error")
    ppo = rl.launch(
        "ppo_pushcube", name=f"rl-{uuid.uuid4().hex[:6]}", algo__init_from=bc.name, algo__critic_warmup_updates=1,
        placement__env__num_workers=1, env__num_envs=4, algo__rollout_steps=16, budget__total_env_steps=64,
    )  # fmt: skip
    ppo.wait(timeout=300)
    assert ppo.status()["state"] == "finished", ppo.status().get("error")
    assert ppo.metrics()["critic_warmup"].tolist() == [1.0]
    sft, rl_policy = _checkpoint_policy(bc.name), _checkpoint_policy(ppo.name)
    critic = [k for k in sft if k.startswith("critic")]
    assert critic and len(critic) < len(sft)
    for key, value in sft.items():
        assert torch.equal(value, rl_policy[key]) == (key not in critic), key

    with pytest.raises(
        RuntimeError, match=r"algo\.init_from.*architecture"
    ):  # CartPole's policy is another shape
        rl.launch("ppo_cartpole", name=f"bad-{uuid.uuid4().hex[:6]}", algo__init_from=bc.name)
    with pytest.raises(ConfigError, match=r"algo\.init_from.*no such run"):  # refused in the client
        rl.launch(
            "ppo_cartpole", name=f"bad-{uuid.uuid4().hex[:6]}", algo__init_from=f"gone-{uuid.uuid4().hex[:6]}"
        )
    events = ppo.events()
    start = events[events["kind"] == "init_from"].iloc[0]
    assert start["run"] == bc.name and start["checkpoint"] == RunDir(bc.name).latest_checkpoint().path.name

    # The source run may go once the fine-tune has its own checkpoint: resume and live changes do not read it.
    shutil.rmtree(RunDir(bc.name).path)
    again = rl.launch(None, name=ppo.name, resume=True, paused=True, budget__total_env_steps=128)
    assert again.set_hparams(lr=1e-4) == {"algo.lr": 1e-4}  # validated against the whole config
    again.resume()
    again.wait(timeout=300)
    assert again.status()["state"] == "finished", again.status().get("error")
    kinds = again.events()["kind"].tolist()
    assert kinds.count("init_from") == 1 and "resume" in kinds and "hparams" in kinds  # not started over
    assert again.metrics()["step"].tolist() == [1, 2]
