"""GRPO, DAPO and Reinforce++: critic-free on-policy algorithms. The maths is in :mod:`.advantages`.

All three share the PPO loop and a learner without a value loss:

``rollout``
    env workers step their envs for ``rollout_steps`` steps. For GRPO/DAPO every env is
    reset at the start of the rollout, the ``group_size`` envs of one group (global envs
    ``g * group_size .. (g + 1) * group_size - 1``, counted over all env workers in rank
    order) with one shared seed, so the ``k``-th episodes of a group's envs start from the
    same state (for envs whose resets draw only from their seeded RNG). The seeds are fresh
    every rollout and reproducible: :func:`group_reset_seeds` of the run seed and the
    update step. Reinforce++ keeps its envs running across rollouts.
``advantages``
    GRPO: each episode's undiscounted return is normalised within its group
    (:func:`.advantages.grpo_advantages`) and given to every step of the episode; episodes
    unfinished at the rollout's end are masked out. DAPO additionally drops groups whose
    returns are all equal (dynamic sampling). Reinforce++: discounted returns-to-go
    normalised over the whole batch (:func:`.advantages.reinforce_pp_advantages`).
    Adds ``advantages``, ``mask`` and ``episode_ids`` (all ``[T, N]``) to the batch.
``update``
    ``epochs`` passes of clipped-surrogate minibatch updates over the valid steps.
``sync_weights``
    the learner's new weights go to every rollout worker.

DAPO is GRPO with other defaults: clip-higher (``clip_eps_high=0.28``), dynamic sampling,
and the step-mean ("token-mean") loss. No KL-to-reference term: embodied policies have no
reference model here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf_nb import tree
from rlinf_nb.config import ConfigError, param

from . import advantages as A
from . import functional as F
from .registry import Algorithm, Stage, register_algorithm
from .stages import rollout_stage, sync_weights_stage

__all__ = ["DAPOConfig", "GRPOConfig", "GroupPolicyLearner", "ReinforcePPConfig", "group_reset_seeds"]


@dataclass
class _CriticFreeConfig:
    """Fields shared by GRPO, DAPO and Reinforce++."""

    rollout_steps: int = param(500, doc="env steps per env per iteration (T)", range=(1, 100_000))
    lr: float = param(1e-3, doc="Adam learning rate", live=True, range=(1e-7, 1.0))
    epochs: int = param(4, doc="passes over each batch", live=True, range=(1, 1000))
    minibatch_size: int = param(1024, doc="steps per gradient step", live=True, range=(1, 10_000_000))
    clip_eps: float = param(0.2, doc="lower ratio clip (1 - clip_eps)", live=True, range=(0.0, 10.0))
    clip_eps_high: float | None = param(
        None, doc="upper ratio clip (1 + clip_eps_high; DAPO clip-higher); None = clip_eps", range=(0.0, 10.0)
    )
    loss_aggregation: str = param(
        "episode-mean",
        doc="step-mean (every valid step weighs the same) or episode-mean (every episode does)",
        choices=A.AGGREGATIONS,
    )
    ent_coef: float = param(0.0, doc="entropy bonus coefficient", live=True, range=(0.0, 1.0))
    max_grad_norm: float = param(0.5, doc="gradient clipping norm (0 = off)", live=True, range=(0.0, 1e6))
    mask_unfinished: bool = param(
        True, doc="drop steps of episodes still running at the rollout's end (their return is partial)"
    )

    def validate(self) -> None:
        if self.minibatch_size < 1:
            raise ConfigError("minibatch_size", self.minibatch_size, "must be >= 1")


@dataclass
class GRPOConfig(_CriticFreeConfig):
    """Hyperparameters of GRPO (``live`` ones can change mid-run with ``set_hparams``)."""

    group_size: int = param(
        8, doc="envs per group sharing a reset seed; num_envs must be a multiple", range=(1, 100_000)
    )
    std_eps: float = param(1e-6, doc="added to the group std before dividing", range=(0.0, 1.0))
    scale_by_std: bool = param(True, doc="divide by the group std (False = Dr. GRPO, centre only)")
    dynamic_sampling: bool = param(False, doc="drop groups whose returns are all equal (DAPO)")

    def validate_run(self, run: Any) -> None:
        """Groups are consecutive envs over all env workers: their count must be a multiple of group_size."""
        total = run.env.num_envs * run.placement.env.num_workers
        if total % self.group_size:
            raise ConfigError(
                "algo.group_size", self.group_size,
                f"must divide the number of envs over all env workers (env.num_envs {run.env.num_envs} x "
                f"placement.env.num_workers {run.placement.env.num_workers} = {total})",
            )  # fmt: skip


@dataclass
class DAPOConfig(GRPOConfig):
    """DAPO: GRPO with clip-higher, dynamic sampling and the step-mean loss."""

    clip_eps_high: float | None = param(
        0.28, doc="upper ratio clip (1 + clip_eps_high; DAPO clip-higher); None = clip_eps", range=(0.0, 10.0)
    )
    loss_aggregation: str = param(
        "step-mean",
        doc="step-mean (every valid step weighs the same) or episode-mean (every episode does)",
        choices=A.AGGREGATIONS,
    )
    dynamic_sampling: bool = param(True, doc="drop groups whose returns are all equal (DAPO)")


@dataclass
class ReinforcePPConfig(_CriticFreeConfig):
    """Hyperparameters of Reinforce++ (global batch-normalised baseline; any group size works)."""

    gamma: float = param(0.99, doc="discount factor of the returns-to-go", live=True, range=(0.0, 1.0))
    loss_aggregation: str = param(
        "step-mean",
        doc="step-mean (every valid step weighs the same) or episode-mean (every episode does)",
        choices=A.AGGREGATIONS,
    )
    mask_unfinished: bool = param(
        False, doc="drop steps of episodes still running at the rollout's end (their return is partial)"
    )


# ----------------------------------------------------------------------------- rollout


def group_reset_seeds(run_seed: int, update_step: int, num_envs: int, group_size: int) -> list[int]:
    """One reset seed per env, shared by the ``group_size`` consecutive envs of each group.

    Fresh for every ``update_step`` and a pure function of ``(run_seed, update_step)``, so a
    resumed run replays the same seeds. ``num_envs`` counts the envs of all env workers.
    """
    if group_size < 1 or num_envs % group_size:
        raise ConfigError(
            "algo.group_size", group_size, f"must divide the number of envs over all env workers ({num_envs})"
        )
    seq = np.random.SeedSequence([run_seed % 2**32, update_step, 0x9E0])  # 0x9E0 tags "GRPO reset seeds"
    # < 2**31: every env's reset takes it
    group_seeds = seq.generate_state(num_envs // group_size, dtype=np.uint32) >> 1
    return [int(s) for s in np.repeat(group_seeds, group_size)]


def group_rollout_stage(ctx: Any) -> dict[str, Any]:
    """Reset every env (one seed per group, fresh each update), then step ``rollout_steps`` times."""
    cfg = ctx.cfg
    num_envs = cfg.env.num_envs * cfg.placement.env.num_workers
    seeds = group_reset_seeds(cfg.seed, ctx.update_step, num_envs, ctx.hp.group_size)
    return ctx.collect_rollout(ctx.hp.rollout_steps, reset_seeds=seeds)


# ----------------------------------------------------------------------------- advantages


def group_advantages(batch: dict[str, Any], hp: Any) -> dict[str, float]:
    """Add ``advantages``, ``mask`` and ``episode_ids`` ([T, N]) to ``batch`` in place.

    Reads ``rewards`` and ``dones`` ([T, N]; a done is a termination or a truncation).
    Works for :class:`GRPOConfig`/:class:`DAPOConfig` (group-relative) and
    :class:`ReinforcePPConfig` (batch-normalised returns). Returns summary metrics.
    """
    rewards = torch.as_tensor(np.asarray(batch["rewards"]), dtype=torch.float64)
    dones = torch.as_tensor(np.asarray(batch["dones"])).bool()
    layout = A.segment_episodes(dones)
    valid_ep = layout.finished if hp.mask_unfinished else torch.ones_like(layout.finished)
    ep_returns = A.episode_sums(rewards, layout.episode_ids, layout.num_episodes)
    out: dict[str, float] = {"episodes": float(layout.num_episodes)}
    if isinstance(hp, GRPOConfig):
        N = rewards.shape[1]
        if N % hp.group_size:
            raise ConfigError("group_size", hp.group_size, f"must divide the number of envs ({N})")
        gids = A.episode_group_ids(layout, torch.arange(N) // hp.group_size)
        if hp.dynamic_sampling:
            keep = A.dynamic_sampling_mask(ep_returns, gids, valid_ep)
            out["dropped_group_fraction"] = _dropped_groups(gids, valid_ep, keep)
            valid_ep = keep
        ga = A.grpo_advantages(ep_returns, gids, hp.std_eps, hp.scale_by_std, valid_ep)
        adv = ga.advantages[layout.episode_ids]
        mask = valid_ep[layout.episode_ids]
    else:
        mask = valid_ep[layout.episode_ids]
        adv, _ = A.reinforce_pp_advantages(rewards, dones, hp.gamma, mask)
    batch["advantages"] = adv.to(torch.float32).numpy()
    batch["mask"] = mask.numpy()
    batch["episode_ids"] = layout.episode_ids.numpy()
    valid_returns = ep_returns[valid_ep]
    out.update(
        valid_step_fraction=float(mask.float().mean()),
        advantage_std=float(adv[mask].std()) if int(mask.sum()) > 1 else 0.0,
        episode_return_mean=float(valid_returns.mean()) if valid_returns.numel() else float("nan"),
    )
    return out


def _dropped_groups(gids: torch.Tensor, valid: torch.Tensor, keep: torch.Tensor) -> float:
    groups = torch.unique(gids[valid])
    if groups.numel() == 0:
        return 0.0
    kept = torch.unique(gids[keep])
    return 1.0 - kept.numel() / groups.numel()


def advantages_stage(ctx: Any) -> dict[str, Any]:
    """Group-relative (GRPO/DAPO) or batch-normalised (Reinforce++) advantages for ``ctx.batch``."""
    return group_advantages(ctx.batch, ctx.hp)


def update_stage(ctx: Any) -> dict[str, Any]:
    """Send the batch to the learner for ``epochs`` of minibatch updates over the valid steps."""
    return ctx.learner_update(["obs", "actions", "logprobs", "advantages", "mask", "episode_ids"])


# ----------------------------------------------------------------------------- learner


class GroupPolicyLearner:
    """Clipped-surrogate updates without a critic (GRPO, DAPO, Reinforce++).

    ``policy`` needs ``evaluate(obs, actions) -> (logprob, entropy, value)`` (the value is
    ignored) and optionally ``actor_parameters()``; only those are optimised.
    """

    def __init__(self, policy: torch.nn.Module, cfg: _CriticFreeConfig, seed: int = 0):
        self.policy = policy
        params = list(policy.actor_parameters()) if hasattr(policy, "actor_parameters") else None
        self.params = params if params is not None else list(policy.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)

    def update(
        self, batch: dict[str, np.ndarray], cfg: _CriticFreeConfig, progress: float = 0.0
    ) -> dict[str, float]:
        """Run ``cfg.epochs`` of minibatch updates on a ``[T, N]`` batch; returns mean metrics."""
        mask = torch.as_tensor(np.asarray(batch["mask"])).bool().reshape(-1)
        idx_valid = mask.nonzero().squeeze(-1)

        def flat(key: str) -> Any:  # [T, N, ...] -> the valid steps [n, ...]; dict obs leaf by leaf
            return tree.map(lambda a: torch.as_tensor(np.asarray(a)).flatten(0, 1)[idx_valid], batch[key])

        obs, actions, old_logp, adv = flat("obs"), flat("actions"), flat("logprobs"), flat("advantages")
        episode_ids = flat("episode_ids")
        n = int(idx_valid.numel())
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        stats: dict[str, list[float]] = {
            k: [] for k in ("policy_loss", "entropy", "approx_kl", "clip_fraction")
        }
        if n == 0:
            out = {k: float("nan") for k in stats}
            out.update(lr=cfg.lr, valid_steps=0.0)
            return out
        mb = min(cfg.minibatch_size, n)
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n - mb + 1, mb):
                i = perm[start : start + mb]
                logp, entropy, _ = self.policy.evaluate(tree.index(obs, i), actions[i])
                pl = A.clipped_surrogate_loss(
                    logp, old_logp[i], adv[i].to(logp.dtype), cfg.clip_eps, cfg.clip_eps_high,
                    episode_ids=episode_ids[i], aggregation=cfg.loss_aggregation,
                )  # fmt: skip
                ent = F.entropy_bonus(entropy)
                loss = pl.loss - cfg.ent_coef * ent
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                for key, val in (("policy_loss", pl.loss), ("entropy", ent), ("approx_kl", pl.approx_kl),
                                 ("clip_fraction", pl.clip_fraction)):  # fmt: skip
                    stats[key].append(float(val))
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out.update(lr=cfg.lr, valid_steps=float(n))
        return out

    def policy_state(self) -> dict[str, np.ndarray]:
        """The policy's weights as numpy arrays (what the rollout workers load)."""
        return {k: v.detach().cpu().numpy() for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def _stages(adv_doc: str, grouped: bool) -> tuple[Stage, ...]:
    rollout = (
        Stage("rollout", group_rollout_stage, "reset the envs (one seed per group), then step them")
        if grouped
        else Stage("rollout", rollout_stage, "step the envs, acting with the rollout workers")
    )
    return (
        rollout,
        Stage("advantages", advantages_stage, adv_doc),
        Stage("update", update_stage, "clipped-surrogate minibatch epochs on the learner, no critic"),
        Stage("sync_weights", sync_weights_stage, "push the learner's weights to the rollout workers"),
    )


GRPO = register_algorithm(
    Algorithm(
        "grpo",
        GRPOConfig,
        _stages("episode returns normalised within each reset-seed group", True),
        GroupPolicyLearner,
        doc=__doc__ or "",
        action_chunks=True,
    )  # fmt: skip
)
DAPO = register_algorithm(
    Algorithm(
        "dapo",
        DAPOConfig,
        _stages("group-relative advantages; groups with equal returns dropped", True),
        GroupPolicyLearner,
        doc=__doc__ or "",
        action_chunks=True,
    )  # fmt: skip
)
REINFORCE_PP = register_algorithm(
    Algorithm(
        "reinforcepp",
        ReinforcePPConfig,
        _stages("discounted returns-to-go, batch-normalised", False),
        GroupPolicyLearner,
        doc=__doc__ or "",
        action_chunks=True,
    )  # fmt: skip
)
