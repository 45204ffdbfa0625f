"""HG-DAgger: behaviour cloning on the aggregated segments where a human took over.

Human-gated DAgger (Kelly et al., 2019): the policy drives; a human watches and takes over when
it goes wrong (the dashboard, ``run.take_over()``, a teleop device or a scripted human, see
:mod:`rlinf_nb.envs.human`), then hands back. Only the steps the human drove are labels: they are
*aggregated* over every round into one dataset (never dropped but by ``buffer_size``), and the
policy is trained by BC on all of it. Stages, each round:

``collect``
    ``collect_steps`` env steps per env with the current policy (and the human).
``update``
    the round's human-driven steps join the dataset, then ``updates_per_iter`` BC steps on it.
``sync_weights``
    the learner's weights go to every rollout worker.

**Per arm** (multi-arm robots, a human on one arm): a step's label covers only the action dims a
human drove (``human_mask``, from the env's ``info["human_mask"]``): the loss is masked to them,
so the policy's own actions on the other arm are never imitated. Blended hand-back steps are not
labels. Without a per-dim mask (single-arm envs) ``intervened`` labels the whole action.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlinf_nb import tree
from rlinf_nb.config import param

from .bc import gradient_step
from .registry import Algorithm, Stage, register_algorithm
from .replay import ReplayBuffer
from .stages import sync_weights_stage

__all__ = ["HGDAggerConfig", "HGDAggerLearner", "intervention_samples", "masked_bc_loss"]

LOSSES = ("mse", "nll")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class HGDAggerConfig:
    """Hyperparameters of HG-DAgger (``live`` ones can change mid-run with ``set_hparams``)."""

    collect_steps: int = param(50, doc="env steps per env in each round's collect stage", range=(1, 100_000))
    loss: str = param(
        "mse", doc="mse (of the policy's mode) or nll (diagonal Gaussian heads)", choices=LOSSES
    )
    lr: float = param(1e-3, doc="Adam learning rate", live=True, range=(1e-7, 1.0))
    batch_size: int = param(256, doc="labelled samples per gradient step", live=True, range=(1, 1_000_000))
    updates_per_iter: int = param(100, doc="gradient steps per round", live=True, range=(0, 1_000_000))
    max_grad_norm: float = param(1.0, doc="gradient clipping norm (0 = off)", live=True, range=(0.0, 1e6))
    min_samples: int = param(1, doc="labelled samples needed before the first gradient step", range=(1, None))
    buffer_size: int = param(
        1_000_000,
        doc="aggregated dataset capacity in samples (oldest dropped past it)",
        range=(1, 1_000_000_000),
    )


# ----------------------------------------------------------------------------- maths


def masked_bc_loss(dist: Any, actions: Tensor, mask: Tensor, kind: str = "mse") -> Tensor:
    """BC loss of expert ``actions`` [N, A] on the dims where ``mask`` [N, A] is true, per labelled dim.

    ``mse``: ``sum(mask * (mode - a)^2) / sum(mask)``; ``nll``: the same mean of the per-dim
    negative log-density of a diagonal Gaussian (``dist.mean``, ``dist.log_std``). 0 with no label.
    """
    m = mask.to(actions.dtype)
    if kind == "mse":
        per_dim = (dist.mode() - actions).pow(2)
    elif kind == "nll":
        if not (hasattr(dist, "mean") and hasattr(dist, "log_std")):
            raise ValueError(
                f"algo.loss: 'nll' needs a diagonal Gaussian action head; {type(dist).__name__} is not one "
                "(allowed values: mse, nll)"
            )
        z = (actions - dist.mean) * torch.exp(-dist.log_std)
        per_dim = 0.5 * z * z + dist.log_std + _HALF_LOG_2PI
    else:
        raise ValueError(f"algo.loss: {kind!r}; allowed values: {', '.join(LOSSES)}")
    return (per_dim * m).sum() / m.sum().clamp_min(1.0)


def intervention_samples(batch: Mapping[str, Any]) -> dict[str, Any] | None:
    """The human-labelled samples of a ``[T, N]`` rollout batch: ``{"obs", "actions", "mask"}``, ``[n, ...]``.

    The label mask is ``human_mask`` ``[T, N, A]`` (per action dim) when present, else ``intervened``
    ``[T, N]`` over every dim; a sample is kept when any of its dims is labelled. None without any.
    """
    actions = np.asarray(batch["actions"])
    if "human_mask" in batch:
        mask = np.asarray(batch["human_mask"], bool)
    elif "intervened" in batch:
        mask = np.broadcast_to(np.asarray(batch["intervened"], bool)[..., None], actions.shape)
    else:
        return None
    lead = mask.shape[:2]
    mask = mask.reshape(-1, *mask.shape[2:])
    keep = mask.any(axis=-1)
    if not keep.any():
        return None
    obs = tree.map(lambda x: np.asarray(x).reshape(-1, *np.shape(x)[len(lead) :])[keep], batch["obs"])
    return {"obs": obs, "actions": actions.reshape(-1, *actions.shape[2:])[keep], "mask": mask[keep]}


# ----------------------------------------------------------------------------- learner


class HGDAggerLearner:
    """Owns the aggregated dataset of human-labelled samples and the optimizer; runs masked BC steps."""

    def __init__(self, policy: torch.nn.Module, cfg: HGDAggerConfig, seed: int = 0):
        self.policy = policy
        self.optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
        self.rng = np.random.default_rng(seed)
        self.data = ReplayBuffer(cfg.buffer_size)
        self.num_labelled = 0  # samples added over every round
        self.rounds = 0

    def add(self, batch: Mapping[str, Any]) -> int:
        """Aggregate the human-labelled samples of ``batch`` (see :func:`intervention_samples`); how many."""
        samples = intervention_samples(batch)
        if samples is None:
            return 0
        n = self.data.extend(samples)
        self.num_labelled += n
        return n

    def update(self, batch: dict[str, Any], cfg: HGDAggerConfig, progress: float = 0.0) -> dict[str, float]:
        added = self.add(batch)
        self.rounds += 1
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        losses: list[float] = []
        if len(self.data) >= cfg.min_samples:
            params = [p for p in self.policy.parameters() if p.requires_grad]
            for _ in range(cfg.updates_per_iter):
                b = self.data.sample(cfg.batch_size, self.rng)
                obs = tree.map(lambda x: torch.as_tensor(x, dtype=torch.float32), b["obs"])
                loss = masked_bc_loss(
                    self.policy.distribution(obs),
                    torch.as_tensor(b["actions"], dtype=torch.float32),
                    torch.as_tensor(b["mask"]),
                    cfg.loss,
                )
                losses.append(gradient_step(self.optimizer, loss, params, cfg.max_grad_norm))
        return {"bc_loss": float(np.mean(losses)) if losses else None, "updates": float(len(losses)),
                "labelled_added": float(added), "dataset_size": float(len(self.data)),
                "labelled_total": float(self.num_labelled)}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "rng": self.rng.bit_generator.state,
                "data": self.data.state_dict(), "num_labelled": self.num_labelled, "rounds": self.rounds}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.data.load_state_dict(state["data"])
        self.num_labelled, self.rounds = int(state["num_labelled"]), int(state["rounds"])


# ----------------------------------------------------------------------------- stages


def collect_stage(ctx: Any) -> dict[str, Any]:
    """``collect_steps`` env steps per env with the current policy; a human takes over where needed."""
    return ctx.collect_rollout(ctx.hp.collect_steps)


def update_stage(ctx: Any) -> dict[str, Any]:
    """The round's human-driven steps join the dataset (per-dim labels), then masked BC steps."""
    return ctx.learner_update(["obs", "actions", "intervened", "human_mask"])


HGDAGGER = register_algorithm(
    Algorithm(
        name="hgdagger",
        config_cls=HGDAggerConfig,
        stages=(
            Stage("collect", collect_stage, "the policy drives; a human takes over when it goes wrong"),
            Stage(
                "update", update_stage, "aggregate the human-labelled steps; masked BC steps on all of them"
            ),
            Stage("sync_weights", sync_weights_stage, "push the learner's weights to the rollout workers"),
        ),
        make_learner=HGDAggerLearner,
        doc=__doc__ or "",
    )
)
