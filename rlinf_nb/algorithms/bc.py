"""Behaviour cloning (supervised fine-tuning) of a policy on a LeRobot dataset.

The learner loads the dataset once (LeRobot reads it back: :func:`rlinf_nb.data.dataset_to_transitions`)
and keeps it in memory; the run's envs only evaluate. Stages, each iteration:

``update``
    ``updates_per_iter`` minibatch gradient steps of the BC loss on the dataset (``nll``: the
    negative log-likelihood of the expert action under the policy, which also learns the action
    std; ``mse``: squared error of the distribution's mode).
``sync_weights``
    the learner's weights (adapters folded in for LoRA) go to every rollout worker.
``evaluate``
    the envs play ``eval_steps`` steps with the new policy, taking its most likely action
    (``eval_actions: mode``, default) or sampling (``sample``); ``success_rate`` and
    ``episode_return_mean`` come from those episodes, so the curves show how well it imitates.

``finetune: full`` trains every weight; ``finetune: lora`` injects LoRA adapters (``peft``) into
the policy's ``lora_targets()`` and trains only those (plus the action std). ``init_from``
starts from another run's newest complete checkpoint (PPO, SAC-family or BC: the plain policy
weights), so a policy trained with RL can be fine-tuned on demonstrations and vice versa.

``dataset`` is a LeRobot dataset directory, a recording root or a run's ``data/`` directory
(their finalized shards are merged once into ``<path>.merged``) or ``scripted:<n>`` (``n`` episodes of the env's scripted expert,
recorded once into a LeRobot dataset under ``RLINF_NB_HOME/datasets``; ``demo_noise`` records them
DART-style: the env driven with noisy actions, the expert's clean actions as labels).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlinf_nb.config import ConfigError, param

from .init_from import INIT_FROM_DOC, StartsFromRun, load_policy_from_run
from .registry import Algorithm, Stage, register_algorithm
from .stages import sync_weights_stage

__all__ = ["BCConfig", "BCLearner", "bc_loss", "resolve_dataset", "scheduled_lr"]

LOSSES = ("nll", "mse")
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class BCConfig(StartsFromRun):
    """Hyperparameters of behaviour cloning (``live`` ones can change mid-run with ``set_hparams``)."""

    dataset: str = param(
        "scripted:50",
        doc="a LeRobot dataset dir, a recording root (finalized shards merged once), or 'scripted:<n>' "
        "(n episodes of the env's scripted expert, recorded into a LeRobot dataset on first use)",
    )
    obs_key: str = param("observation.state", doc="dataset feature fed to the policy as its observation")
    action_key: str = param("action", doc="dataset feature the policy imitates")
    loss: str = param("nll", doc="nll (log-likelihood, learns the std) or mse (of the mode)", choices=LOSSES)
    lr: float = param(1e-3, doc="Adam learning rate (the peak with a schedule)", live=True, range=(1e-7, 1.0))
    lr_schedule: str = param(
        "constant",
        doc="constant, or cosine (from lr down to 0 over the budget's env steps)",
        choices=LR_SCHEDULES,
    )
    weight_decay: float = param(0.0, doc="AdamW weight decay", range=(0.0, 1.0))
    batch_size: int = param(256, doc="dataset samples per gradient step", live=True, range=(1, 1_000_000))
    updates_per_iter: int = param(200, doc="gradient steps per iteration", live=True, range=(1, 1_000_000))
    max_grad_norm: float = param(1.0, doc="gradient clipping norm (0 = off)", live=True, range=(0.0, 1e6))
    demo_noise: tuple[float, ...] = param(
        (),
        doc="'scripted:<n>' only: Gaussian action noise on the expert's arm dims while recording (DART): each "
        "episode draws one std from this list, the labels stay the expert's clean actions, and failed "
        "episodes are kept; () = noise-free, successful episodes only",
    )
    eval_steps: int = param(50, doc="env steps per env in each evaluate stage", range=(1, 100_000))
    eval_actions: str = param(
        "mode",
        doc="how the evaluate stage acts: mode (the policy's most likely action) or sample (from it)",
        choices=("mode", "sample"),
    )
    finetune: str = param("full", doc="full (every weight) or lora (adapters only)", choices=("full", "lora"))
    lora_rank: int = param(8, doc="LoRA rank r", range=(1, 4096))
    lora_alpha: float = param(
        16.0, doc="LoRA scale numerator (the update is alpha / r * B A)", range=(0.0, None)
    )
    init_from: str | None = param(None, doc=INIT_FROM_DOC)

    def validate(self) -> None:
        kind, _, arg = self.dataset.partition(":")
        if kind == "scripted" and (not arg.isdigit() or int(arg) < 1):
            raise ConfigError(
                "dataset", self.dataset, "expected 'scripted:<n>' with n >= 1 episodes, or a path"
            )
        if any(not 0.0 <= std < float("inf") for std in self.demo_noise):
            raise ConfigError(
                "demo_noise", list(self.demo_noise), "standard deviations must be finite and >= 0"
            )
        if self.demo_noise and kind != "scripted":
            raise ConfigError(
                "demo_noise",
                list(self.demo_noise),
                "only used with a 'scripted:<n>' dataset (it is recorded)",
            )


# ----------------------------------------------------------------------------- maths


def bc_loss(dist: Any, actions: Tensor, kind: str = "nll") -> Tensor:
    """The behaviour-cloning loss of expert ``actions`` [N, A] under the policy's ``dist`` (batch N).

    ``nll``: ``-mean_i log pi(a_i | s_i)``; ``mse``: ``mean_i ||mode_i - a_i||^2 / A``. Scalar.
    """
    if kind == "nll":
        return -dist.log_prob(actions).mean()
    if kind == "mse":
        return (dist.mode() - actions).pow(2).mean()
    raise ValueError(f"bc_loss: kind must be one of {LOSSES}, got {kind!r}")


def scheduled_lr(lr: float, schedule: str, progress: float) -> float:
    """The learning rate at ``progress`` (0..1 of the budget): ``lr``, or ``lr * (1 + cos(pi * p)) / 2``."""
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    raise ValueError(f"lr_schedule: got {schedule!r}; allowed values: {', '.join(LR_SCHEDULES)}")


def gradient_step(
    optimizer: torch.optim.Optimizer, loss: Tensor, params: list[Tensor], max_grad_norm: float
) -> float:
    """One optimiser step on ``loss`` (grad-norm clipped to ``max_grad_norm`` when > 0); the loss value."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return float(loss.detach())


# ----------------------------------------------------------------------------- data


def resolve_dataset(
    spec: str, env_cfg: dict[str, Any], seed: int = 0, demo_noise: tuple[float, ...] = (),
    progress: bool | Callable[[int, int], None] = True,
) -> Path:  # fmt: skip
    """The LeRobot dataset directory ``spec`` (``algo.dataset``) names for a run's env.

    ``progress``: how a ``scripted:<n>`` dataset that is not cached yet reports its recording (see
    :func:`~rlinf_nb.data.expert.record_scripted_dataset`).
    """
    from rlinf_nb.data.expert import cached_scripted_dataset
    from rlinf_nb.data.merging import merge

    kind, _, arg = spec.partition(":")
    if kind == "scripted":
        return cached_scripted_dataset(
            env_cfg, int(arg), seed=seed + 2_000_003, action_noise=demo_noise, progress=progress
        )
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(
            "algo.dataset", spec, "an existing LeRobot dataset or recording root, or 'scripted:<n>'"
        )
    if (path / "meta" / "info.json").is_file():
        return path
    # a recording root, or a run's data/ of per-worker roots: merged once beside it
    merged = path.with_name(path.name + ".merged")
    return merged if merged.exists() else merge(path, merged)


# ----------------------------------------------------------------------------- learner


class BCLearner:
    """Owns the dataset (in memory, as tensors) and the optimizer; runs BC gradient steps."""

    def __init__(self, policy: torch.nn.Module, cfg: BCConfig, seed: int = 0):
        from rlinf_nb.policies.lora import add_lora

        self.policy = policy
        if cfg.init_from:
            load_policy_from_run(policy, cfg.init_from)
        if cfg.finetune == "lora":
            add_lora(policy, rank=cfg.lora_rank, alpha=cfg.lora_alpha)
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(seed)
        self.obs: Tensor | None = None
        self.actions: Tensor | None = None
        self.dataset_path: str | None = None

    def load_dataset(
        self, spec: str, env_cfg: dict[str, Any], seed: int, cfg: BCConfig,
        progress: bool | Callable[[int, int], None] = True,
    ) -> dict[str, Any]:  # fmt: skip
        """Resolve ``spec`` and load its (obs, action) pairs, checking them against the policy."""
        from rlinf_nb.data.transitions import dataset_to_transitions

        path = resolve_dataset(spec, env_cfg, seed, cfg.demo_noise, progress)
        data = dataset_to_transitions(path, obs_keys=cfg.obs_key, action_key=cfg.action_key)
        obs, actions = np.asarray(data["obs"]), np.asarray(data["actions"])
        want_obs = getattr(self.policy, "obs_dim", None)
        if want_obs is not None and int(np.prod(obs.shape[1:])) != want_obs:
            raise ValueError(
                f"BC: dataset feature {cfg.obs_key!r} of {path} has shape {obs.shape[1:]}, "
                f"the run's env observations have {want_obs} values"
            )
        self.obs = torch.as_tensor(obs, dtype=torch.float32)
        self.actions = torch.as_tensor(actions, dtype=torch.float32)
        self.dataset_path = str(path)
        episodes = len(np.unique(data["episode_index"]))
        return {"dataset": str(path), "frames": len(obs), "episodes": episodes}

    def update(self, batch: dict[str, Any], cfg: BCConfig, progress: float = 0.0) -> dict[str, float]:
        if self.obs is None or self.actions is None:
            raise RuntimeError("BC: no dataset loaded (the controller calls load_dataset at setup)")
        lr = scheduled_lr(cfg.lr, cfg.lr_schedule, progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.policy.parameters() if p.requires_grad]
        n = len(self.obs)
        losses = []
        for _ in range(cfg.updates_per_iter):
            idx = torch.randint(n, (min(cfg.batch_size, n),), generator=self.generator)
            loss = bc_loss(self.policy.distribution(self.obs[idx]), self.actions[idx], cfg.loss)
            losses.append(gradient_step(self.optimizer, loss, params, cfg.max_grad_norm))
        with torch.no_grad():
            sample = torch.randint(n, (min(4096, n),), generator=self.generator)
            mode = self.policy.distribution(self.obs[sample]).mode()
            mse = float((mode - self.actions[sample]).pow(2).mean())
        return {"bc_loss": float(np.mean(losses)), "action_mse": mse, "lr": lr,
                "trainable_params": float(sum(p.numel() for p in params))}  # fmt: skip

    def export_weights(self) -> dict[str, Tensor]:
        """Plain policy weights (LoRA adapters folded in): what rollout workers load."""
        from rlinf_nb.policies.lora import merged_state_dict

        return merged_state_dict(self.policy)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "plain_policy": self.export_weights(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


# ----------------------------------------------------------------------------- stages


def update_stage(ctx: Any) -> dict[str, Any]:
    """``updates_per_iter`` BC gradient steps on the learner's dataset (no env data needed)."""
    return ctx.learner_update([])


def evaluate_stage(ctx: Any) -> dict[str, Any]:
    """Play ``eval_steps`` steps per env with the synced policy (its mode, or samples: ``eval_actions``);
    episodes feed success and return."""
    return ctx.collect_rollout(ctx.hp.eval_steps, acting=ctx.hp.eval_actions)


BC = register_algorithm(
    Algorithm(
        name="bc",
        config_cls=BCConfig,
        stages=(
            Stage("update", update_stage, "BC gradient steps on the dataset, on the learner"),
            Stage("sync_weights", sync_weights_stage, "push the learner's weights to the rollout workers"),
            Stage("evaluate", evaluate_stage, "play the envs with the new policy (success, return)"),
        ),
        make_learner=BCLearner,
        doc=__doc__ or "",
    )
)
