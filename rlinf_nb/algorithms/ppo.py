"""PPO: config, stages and learner. The maths lives in :mod:`.functional`.

Stages, run by the controller in order each iteration:

``rollout``
    env workers step their envs for ``rollout_steps`` steps, asking the rollout
    workers for actions through channels; the trajectories land in ``ctx.batch``.
``advantages``
    GAE with time-limit bootstrapping (:func:`.functional.gae`) adds ``advantages``
    and ``returns`` to the batch.
``update``
    the learner runs ``epochs`` passes of clipped-surrogate minibatch updates.
``sync_weights``
    the learner's new weights go to every rollout worker, with a version number.

RL after SFT: ``init_from`` starts the policy from another run's checkpoint (a BC run, say), and
``critic_warmup_updates`` trains only the value function for the first updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf_nb import tree
from rlinf_nb.config import ConfigError, param

from . import functional as F
from .adam import FusedAdam
from .init_from import INIT_FROM_DOC, StartsFromRun, load_policy_from_run
from .registry import Algorithm, Stage, register_algorithm
from .stages import rollout_stage, sync_weights_stage


@dataclass
class PPOConfig(StartsFromRun):
    """Hyperparameters of PPO (``live`` ones can change mid-run with ``set_hparams``)."""

    rollout_steps: int = param(32, doc="env steps per env per iteration (T)", range=(1, 100_000))
    lr: float = param(
        1e-3, doc="Adam learning rate (start value when annealed)", live=True, range=(1e-7, 1.0)
    )
    lr_schedule: str = param(
        "linear", doc="constant, or linear decay to 0 over the budget", choices=("constant", "linear")
    )
    gamma: float = param(0.98, doc="discount factor", live=True, range=(0.0, 1.0))
    gae_lambda: float = param(0.8, doc="GAE lambda", live=True, range=(0.0, 1.0))
    epochs: int = param(20, doc="passes over each batch", live=True, range=(1, 1000))
    minibatch_size: int = param(256, doc="samples per gradient step", live=True, range=(1, 10_000_000))
    clip_eps: float = param(0.2, doc="PPO ratio clip", live=True, range=(0.0, 10.0))
    clip_eps_high: float | None = param(
        None, doc="upper ratio clip (DAPO clip-higher); None = clip_eps", range=(0.0, 10.0)
    )
    value_clip: float | None = param(
        None, doc="value-function clip around the old values (None = off)", range=(0.0, None)
    )
    ent_coef: float = param(0.0, doc="entropy bonus coefficient", live=True, range=(0.0, 1.0))
    vf_coef: float = param(0.5, doc="value loss coefficient", live=True, range=(0.0, 100.0))
    max_grad_norm: float = param(0.5, doc="gradient clipping norm", live=True, range=(0.0, 1e6))
    normalize_advantages: bool = param(True, doc="normalise advantages per minibatch", live=True)
    target_kl: float | None = param(
        None, doc="stop the epochs early when approx KL exceeds this", range=(0.0, None)
    )
    init_from: str | None = param(None, doc=INIT_FROM_DOC + ", e.g. a BC run: RL fine-tuning after SFT")
    critic_warmup_updates: int = param(
        0,
        doc="first updates that train only the value function, the policy held as it is (fine-tuning "
        "a cloned policy: advantages from an untrained critic would pull it off what it learned)",
        range=(0, None),
    )

    def validate(self) -> None:
        if self.minibatch_size < 1:
            raise ConfigError("minibatch_size", self.minibatch_size, "must be >= 1")


# ----------------------------------------------------------------------------- stages


def advantages_stage(ctx: Any) -> dict[str, Any]:
    """GAE over the batch: adds ``advantages`` and ``returns`` (shape [T, N])."""
    b = ctx.batch
    t = {k: torch.as_tensor(b[k]) for k in ("rewards", "values", "dones", "truncated", "bootstrap_values")}
    adv, ret = F.gae(
        t["rewards"], t["values"], t["dones"], t["truncated"], torch.as_tensor(b["last_values"]),
        t["bootstrap_values"], gamma=ctx.hp.gamma, lam=ctx.hp.gae_lambda,
    )  # fmt: skip
    b["advantages"] = adv.numpy()
    b["returns"] = ret.numpy()
    return {
        "advantage_mean": float(adv.mean()),
        "advantage_std": float(adv.std()),
        "return_mean": float(ret.mean()),
    }


def update_stage(ctx: Any) -> dict[str, Any]:
    """Send the batch to the learner for ``epochs`` of minibatch updates."""
    return ctx.learner_update(["obs", "actions", "logprobs", "values", "advantages", "returns"])


# ----------------------------------------------------------------------------- learner


class PPOLearner:
    """Owns the policy's optimizer and runs PPO updates on batches of [T, N] arrays."""

    def __init__(self, policy: torch.nn.Module, cfg: PPOConfig, seed: int = 0):
        self.policy = policy
        if cfg.init_from:
            load_policy_from_run(policy, cfg.init_from)
        # fused Adam: the same maths, about half the cost per step for small nets (bench/ppo_reference.py);
        # FusedAdam runs torch.optim.Adam(fused=True)'s kernel without importing torch._dynamo (start-up)
        self.optimizer = FusedAdam(policy.parameters(), lr=cfg.lr, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0  # update calls so far (the critic warm-up counts them)

    def current_lr(self, cfg: PPOConfig, progress: float) -> float:
        if cfg.lr_schedule == "linear":
            return cfg.lr * max(0.0, 1.0 - progress)
        return cfg.lr

    def update(self, batch: dict[str, np.ndarray], cfg: PPOConfig, progress: float) -> dict[str, float]:
        # obs: [T, N, ...], or a dict of such arrays (images + state), kept in their dtypes (uint8)
        obs = tree.map(lambda a: torch.as_tensor(a).flatten(0, 1), batch["obs"])
        actions = torch.as_tensor(batch["actions"]).flatten(0, 1)
        old_logp = torch.as_tensor(batch["logprobs"]).flatten(0, 1)
        old_values = torch.as_tensor(batch["values"]).flatten(0, 1)
        advantages = torch.as_tensor(batch["advantages"]).flatten(0, 1)
        returns = torch.as_tensor(batch["returns"]).flatten(0, 1)
        n = tree.batch_size(obs)
        lr = self.current_lr(cfg, progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mb = min(cfg.minibatch_size, n)
        stats: dict[str, list[float]] = {
            k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
        }
        epochs_run = 0
        warmup = self.updates < cfg.critic_warmup_updates  # value loss only: no gradient reaches the actor
        self.updates += 1
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n - mb + 1, mb):
                idx = perm[start : start + mb]
                logp, entropy, values = self.policy.evaluate(tree.index(obs, idx), actions[idx])
                adv = advantages[idx]
                if cfg.normalize_advantages and adv.numel() > 1:
                    adv = F.normalize_advantages(adv)
                pl = F.ppo_policy_loss(
                    logp, old_logp[idx], adv, cfg.clip_eps, clip_eps_high=cfg.clip_eps_high
                )
                vl = F.value_loss(values, old_values[idx], returns[idx], clip_eps=cfg.value_clip)
                ent = F.entropy_bonus(entropy)
                loss = cfg.vf_coef * vl if warmup else pl.loss + cfg.vf_coef * vl - cfg.ent_coef * ent
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                for key, val in (("policy_loss", pl.loss), ("value_loss", vl), ("entropy", ent),
                                 ("approx_kl", pl.approx_kl), ("clip_fraction", pl.clip_fraction)):  # fmt: skip
                    stats[key].append(float(val.detach()))
            epochs_run += 1
            if cfg.target_kl is not None and stats["approx_kl"] and stats["approx_kl"][-1] > cfg.target_kl:
                break
        var_ret = float(returns.var())
        explained = float("nan") if var_ret == 0 else 1.0 - float((returns - old_values).var()) / var_ret
        out = {k: float(np.mean(v)) if v else float("nan") for k, v in stats.items()}
        out.update(lr=lr, epochs_run=epochs_run, explained_variance=explained, critic_warmup=float(warmup))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.updates = state.get("updates", 0)  # checkpoints written before the counter existed


PPO = register_algorithm(
    Algorithm(
        name="ppo",
        config_cls=PPOConfig,
        stages=(
            Stage("rollout", rollout_stage, "step the envs, acting with the rollout workers"),
            Stage("advantages", advantages_stage, "GAE with time-limit bootstrapping"),
            Stage("update", update_stage, "clipped-surrogate minibatch epochs on the learner"),
            Stage("sync_weights", sync_weights_stage, "push the learner's weights to the rollout workers"),
        ),
        make_learner=PPOLearner,
        doc=__doc__ or "",
        action_chunks=True,
        learner_imports=(),  # FusedAdam: no torch._dynamo
    )
)
