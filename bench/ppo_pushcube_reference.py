"""Single-process reference PPO on ManiSkill PushCube-v1 (state), matched to the ``ppo_pushcube`` recipe.

The continuous-action sibling of ``bench/ppo_reference.py``: CleanRL-shaped, one file, one
loop, built only from :mod:`rlinf_nb.algorithms.functional` and
:func:`rlinf_nb.policies.make_policy`. It is the same-machine baseline for the recipe on the
cluster (``bench/bench_ppo_pushcube.py``), so it copies what the runtime does, not just the
numbers:

* **envs**: one ``make_env("maniskill:PushCube-v1", workers * envs_per_worker)`` in this
  process, env ``j`` of "worker" ``r`` reset with ``seed + 10_007 * r + j`` (the seeds the
  recipe's env workers give their envs), so both play the same episode starts.
* **policy**: ``torch.manual_seed(seed)`` then ``make_policy`` (the learner's initial weights);
  Gaussian actions are sampled unclipped, sent as they are (ManiSkill clips them itself) and
  stored unclipped, as the env workers do.
* **truncation**: a time-limit end (truncated and not terminated) bootstraps from
  ``V(final_obs)`` through ``gae(..., bootstrap_values=...)``; terminations from 0.
* **update**: :class:`rlinf_nb.algorithms.ppo.PPOLearner`'s rules -- fused Adam (eps 1e-5),
  minibatch order from ``torch.Generator().manual_seed(seed)``, full minibatches only,
  advantages normalised per minibatch, optional value clipping (``value_clip``), and the
  target-KL early stop after an epoch whose *last* minibatch's approx KL exceeds ``target_kl``.
* **stopping**: the run's ``success_rate`` -- the mean success of the last ``window`` finished
  episodes (``metrics_window``), each rollout's episodes appended worker by worker, checked
  once per iteration after the update (when the runtime writes its metrics row).

Usage::

    .venv/bin/python bench/ppo_pushcube_reference.py --seeds 0 --verbose
    .venv/bin/python bench/ppo_pushcube_reference.py --budget 2048   # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlinf_nb.algorithms.functional import (  # noqa: E402
    entropy_bonus,
    gae,
    normalize_advantages,
    ppo_policy_loss,
    value_loss,
)
from rlinf_nb.policies import make_policy  # noqa: E402

IMPL = "single-process reference"
WORKER_SEED_STRIDE = 10_007  # runtime/workers.py: EnvWorker seeds its envs from seed + 10_007 * rank

# PPOConfig fields the loop below implements, copied by name from a run config's ``algo`` section.
PPO_FIELDS = ("rollout_steps", "lr", "lr_schedule", "gamma", "gae_lambda", "epochs", "minibatch_size",
              "clip_eps", "clip_eps_high", "value_clip", "ent_coef", "vf_coef", "max_grad_norm",
              "normalize_advantages", "target_kl")  # fmt: skip
# PPOConfig fields the loop does not implement: a config must leave them at their defaults.
PPO_FIELDS_AT_DEFAULT = ("init_from", "critic_warmup_updates")


@dataclass
class PushCubeSettings:
    """Hyperparameters of the reference loop; the defaults are the ``ppo_pushcube`` recipe's."""

    env_id: str = "maniskill:PushCube-v1"
    """``make_env`` spec of the task."""
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {
            "obs_mode": "state",
            "control_mode": "pd_ee_delta_pos",
            "reward_mode": "normalized_dense",
            "sim_backend": "physx_cpu",
        }  # fmt: skip
    )
    """Keyword arguments of ``make_env`` (the recipe's ``env.kwargs``)."""
    workers: int = 2
    """Env workers of the recipe (``placement.env.num_workers``): only the env seeds and episode order."""
    envs_per_worker: int = 8
    """Envs per env worker (``env.num_envs``); this loop steps ``workers * envs_per_worker`` envs."""
    rollout_steps: int = 32
    """Env steps per env per iteration (T)."""
    lr: float = 3e-4
    """Adam learning rate."""
    lr_schedule: str = "constant"
    """``constant``, or ``linear`` decay to 0 over ``total_env_steps``."""
    gamma: float = 0.8
    """Discount factor."""
    gae_lambda: float = 0.9
    """GAE lambda."""
    epochs: int = 8
    """Passes over each batch (fewer when the target-KL rule stops early)."""
    minibatch_size: int = 128
    """Samples per gradient step (full minibatches only)."""
    clip_eps: float = 0.2
    """PPO ratio clip."""
    clip_eps_high: float | None = None
    """Upper ratio clip (None = ``clip_eps``)."""
    value_clip: float | None = None
    """Value-function clip around the old values (None = off, PPOConfig's default)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient clipping norm (0 = off)."""
    normalize_advantages: bool = True
    """Normalise advantages per minibatch."""
    target_kl: float | None = 0.1
    """Stop the epochs after one whose last minibatch's approx KL exceeds this (None = never)."""
    policy: str = "mlp"
    """Registered policy name."""
    policy_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"hidden_sizes": [256, 256], "log_std_init": -0.5}
    )
    """Keyword arguments of ``make_policy`` (the recipe's ``policy.kwargs``)."""
    total_env_steps: int = 500_000
    """Env-step budget."""
    target: float = 0.8
    """Stop when the success rate of the last ``window`` episodes reaches this."""
    window: int = 20
    """Finished episodes in the success rate (the run's ``metrics_window``)."""

    @property
    def num_envs(self) -> int:
        return self.workers * self.envs_per_worker

    @classmethod
    def from_run_config(cls, cfg: Any) -> PushCubeSettings:
        """The settings of a resolved PPO :class:`~rlinf_nb.run_config.RunConfig` (e.g. the recipe).

        Raises:
            ValueError: for a config this loop does not implement (another algorithm, action chunks,
                a stop metric other than ``success_rate``).
        """
        if cfg.algorithm != "ppo":
            raise ValueError(f"algorithm: {cfg.algorithm!r}; the reference loop implements 'ppo' only")
        if cfg.policy.chunk != 1:
            raise ValueError(
                f"policy.chunk: {cfg.policy.chunk}; the reference loop needs 1 (no action chunks)"
            )
        for name in PPO_FIELDS_AT_DEFAULT:
            default = type(cfg.algo).__dataclass_fields__[name].default
            if getattr(cfg.algo, name) != default:
                raise ValueError(
                    f"algo.{name}: {getattr(cfg.algo, name)!r}; the reference loop needs {default!r}"
                )
        if cfg.budget.stop_metric not in (None, "success_rate"):
            raise ValueError(
                f"budget.stop_metric: {cfg.budget.stop_metric!r}; allowed values: 'success_rate', None"
            )
        return cls(
            env_id=cfg.env.id,
            env_kwargs=dict(cfg.env.kwargs),
            workers=cfg.placement.env.num_workers,
            envs_per_worker=cfg.env.num_envs,
            **{name: getattr(cfg.algo, name) for name in PPO_FIELDS},
            policy=cfg.policy.name,
            policy_kwargs=dict(cfg.policy.kwargs),
            total_env_steps=cfg.budget.total_env_steps,
            target=cfg.budget.stop_value if cfg.budget.stop_value is not None else cls.target,
            window=cfg.metrics_window,
        )


@dataclass
class Result:
    impl: str
    seed: int
    reached: bool
    steps: int  # env steps when the target was first reached (else: at the end of the budget)
    seconds: float  # wall seconds from the first reset until then (env construction excluded)
    steps_per_s: float
    success_rate: float  # over the last `window` episodes at that moment
    episodes: int  # episodes finished by then
    setup_seconds: float  # env and policy construction, before `seconds` starts
    iterations: int


def worker_order(env_indices: list[int], values: list[float], envs_per_worker: int) -> list[float]:
    """``values`` (one per finished episode, in finishing order) regrouped worker by worker.

    The controller appends each rollout's episodes env worker by env worker (each in its own
    finishing order), so the success window holds the same episodes as the run's.
    """
    order = sorted(range(len(values)), key=lambda k: env_indices[k] // envs_per_worker)  # stable
    return [values[k] for k in order]


def train_ppo(cfg: PushCubeSettings, seed: int, verbose: bool = False) -> Result:
    """Train until the success rate reaches ``cfg.target`` or the budget is spent."""
    from rlinf_nb.envs import make_env
    from rlinf_nb.envs.maniskill import maniskill_env_ids

    maniskill_env_ids()  # imports ManiSkill (5-6 s, once per process) before the setup clock starts
    ts = time.perf_counter()
    envs = make_env(cfg.env_id, cfg.num_envs, seed=seed, **cfg.env_kwargs)
    torch.manual_seed(seed)  # as the learner worker, just before it builds its policy
    np.random.seed(seed)
    policy = make_policy(cfg.policy, envs.observation_space, envs.action_space, **cfg.policy_kwargs)
    params = list(policy.parameters())
    optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5, fused=True)
    generator = torch.Generator().manual_seed(seed)
    setup_seconds = time.perf_counter() - ts

    T, N = cfg.rollout_steps, cfg.num_envs
    batch = T * N
    mb = min(cfg.minibatch_size, batch)
    obs_shape = envs.observation_space.shape
    act_shape = envs.action_space.shape
    obs_buf = torch.zeros((T, N, *obs_shape))
    act_buf = torch.zeros((T, N, *act_shape))
    logp_buf = torch.zeros((T, N))
    val_buf = torch.zeros((T, N))
    rew_buf = torch.zeros((T, N))
    done_buf = torch.zeros((T, N), dtype=torch.bool)
    trunc_buf = torch.zeros((T, N), dtype=torch.bool)
    boot_buf = torch.zeros((T, N))  # V(final obs) of episodes cut by the time limit at that step

    successes: deque[float] = deque(maxlen=cfg.window)
    n_episodes = iterations = global_step = 0
    rate = float("nan")
    reached = False

    t0 = time.perf_counter()
    env_seeds = [
        seed + WORKER_SEED_STRIDE * r + j for r in range(cfg.workers) for j in range(cfg.envs_per_worker)
    ]
    obs = torch.from_numpy(envs.reset(seed=env_seeds))
    while global_step < cfg.total_env_steps:
        # ---------------------------------------------------------------- rollout
        ended_env: list[int] = []
        ended_success: list[float] = []
        for t in range(T):
            action, logp, value = policy.act(obs)  # unclipped Gaussian sample; ManiSkill clips
            obs_buf[t] = obs
            act_buf[t] = action
            logp_buf[t] = logp
            val_buf[t] = value
            res = envs.step(action.numpy())
            global_step += N
            terminated = torch.from_numpy(res.terminated)
            truncated = torch.from_numpy(res.truncated) & ~terminated
            rew_buf[t] = torch.from_numpy(res.reward)
            done_buf[t] = terminated | truncated
            trunc_buf[t] = truncated
            if truncated.any():
                # same-step autoreset: res.obs is already the reset one; the true last obs is here
                final = torch.from_numpy(res.final_obs[truncated.numpy()])
                with torch.no_grad():
                    boot_buf[t, truncated] = policy.value(final)
            if res.successes:
                ended_env += np.flatnonzero(res.terminated | res.truncated).tolist()
                ended_success += res.successes
            obs = torch.from_numpy(res.obs)
        n_episodes += len(ended_success)
        successes.extend(worker_order(ended_env, ended_success, cfg.envs_per_worker))

        # ---------------------------------------------------------------- advantages
        with torch.no_grad():
            last_values = policy.value(obs)
            advantages, returns = gae(
                rew_buf, val_buf, done_buf, trunc_buf, last_values, boot_buf, cfg.gamma, cfg.gae_lambda
            )

        # ---------------------------------------------------------------- update
        lr = cfg.lr
        if cfg.lr_schedule == "linear":  # progress as the controller reports it: after this rollout
            lr = cfg.lr * max(0.0, 1.0 - global_step / cfg.total_env_steps)
        optimizer.param_groups[0]["lr"] = lr
        b_obs = obs_buf.reshape(batch, *obs_shape)
        b_act = act_buf.reshape(batch, *act_shape)
        b_logp = logp_buf.reshape(batch)
        b_adv = advantages.reshape(batch)
        b_ret = returns.reshape(batch)
        b_val = val_buf.reshape(batch)
        epochs_run = 0
        for _epoch in range(cfg.epochs):
            perm = torch.randperm(batch, generator=generator)
            for start in range(0, batch - mb + 1, mb):
                idx = perm[start : start + mb]
                new_logp, entropy, new_val = policy.evaluate(b_obs[idx], b_act[idx])
                adv = b_adv[idx]
                if cfg.normalize_advantages and adv.numel() > 1:
                    adv = normalize_advantages(adv)
                pg = ppo_policy_loss(
                    new_logp, b_logp[idx], adv, cfg.clip_eps, clip_eps_high=cfg.clip_eps_high
                )
                v_loss = value_loss(new_val, b_val[idx], b_ret[idx], clip_eps=cfg.value_clip)
                loss = pg.loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_bonus(entropy)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
            epochs_run += 1
            if cfg.target_kl is not None and float(pg.approx_kl) > cfg.target_kl:
                break
        iterations += 1

        # ---------------------------------------------------------------- metrics row, stop rule
        rate = float(np.mean(successes)) if successes else float("nan")
        if verbose:
            print(f"  step {global_step:7d}  success {rate:5.2f}  episodes {n_episodes:5d}  "
                  f"epochs {epochs_run}  kl {pg.approx_kl.item():.4f}  vloss {v_loss.item():.4f}", flush=True)  # fmt: skip
        if successes and rate >= cfg.target:
            reached = True
            break

    seconds = time.perf_counter() - t0
    envs.close()
    return Result(IMPL, seed, reached, global_step, seconds, global_step / seconds,
                  rate, n_episodes, setup_seconds, iterations)  # fmt: skip


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--budget", type=int, default=None, help="env-step budget (default: the recipe's)")
    parser.add_argument("--verbose", action="store_true", help="print one line per iteration")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = PushCubeSettings()
    if args.budget is not None:
        cfg = dataclasses.replace(cfg, total_env_steps=args.budget)
    print("reference:", json.dumps(dataclasses.asdict(cfg)))
    results = []
    for seed in args.seeds:
        r = train_ppo(cfg, seed, verbose=args.verbose)
        results.append(r)
        print(json.dumps(dataclasses.asdict(r)), flush=True)
    return results


if __name__ == "__main__":
    main()
