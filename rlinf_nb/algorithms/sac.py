"""SAC, CrossQ and RLPD: configs, stages and learners. The maths is in :mod:`.offpolicy_functional`.

The three share one learner (:class:`SACLearner`) that owns the critics, the temperature,
their optimizers and the replay buffer(s); the actor is the run's policy, anything with
``sample(obs) -> (action, log_prob)`` (reparameterised, e.g. ``ActorCritic`` with
``action_head="squashed_gaussian"``). Per gradient step:

1. critic: ``y = r + gamma (1 - term) (min_e Q'_e(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi(s')``,
   then ``0.5 sum_e mean (Q_e(s, a) - y)^2``;
2. every ``policy_delay`` steps, the actor (``mean(alpha log pi(a|s) - Q(s, a))`` with the
   critics frozen) and the temperature (``-log alpha * mean(log pi + target_entropy)``);
3. Polyak-average the target critics with ``tau``.

Variants:

* **SAC** (Haarnoja et al. 2018): twin Q, target networks, auto-tuned temperature with
  ``target_entropy = -act_dim``.
* **CrossQ** (Bhatt et al. 2024): batch-norm critics and *no* target network; ``(s, a)`` and
  ``(s', a')`` go through the critic as one batch so the batch-norm statistics cover
  both, and the target is the (detached) second half. The actor reads the critic in eval
  mode (running statistics). Adam with ``beta1 = 0.5`` and ``policy_delay = 3``.
* **RLPD** (Ball et al. 2023): SAC with an ensemble of ``num_critics`` layer-norm critics, the
  target's min over a random subset of ``critic_subset`` of them, the actor on their mean,
  a high update-to-data ratio and batches drawn ``demo_fraction`` from a demo buffer.

Camera images + state (dict observations, the ``cnn`` policy with ``action_head:
squashed_gaussian``, which the run config fills in when unset): the critic gets its own
copy of the policy's image encoders in front of the ensemble
(:class:`~.offpolicy_nets.EncodedEnsembleQ`), trained by the critic loss. With
``actor_encoder: critic`` (default, as DrQ, RLPD and SERL do) the actor reads the critic's
encoder through a copy inside the policy, refreshed after every critic step and never
trained by the actor loss: the TD error shapes the features, the actor's gradient through
``Q`` does not (it is noisier and was found to hurt in DrQ / SAC-AE). The copy keeps the
policy self-contained, so the rollout workers still get one state dict. ``actor_encoder:
own`` trains the policy's encoder with the actor loss instead (the critic keeps a separate
one). The replay keeps images ``uint8`` (``obs`` and ``next_obs``: see
:mod:`.replay` for the memory per transition) and batches stay ``uint8`` tensors up to the
encoders. ``random_shift: k`` applies DrQ's augmentation to every training batch (each image
shifted by up to ``k`` pixels, :mod:`.augment`).

Stages, run each iteration by the controller (the fully async runtime overlaps them):

``collect``
    env workers step ``collect_steps`` times per env (uniform random actions for the first
    ``random_steps``) and the transitions land in ``ctx.batch``: ``obs``, ``actions``,
    ``rewards``, ``next_obs`` (the real next observation, also at truncations) and
    ``terminated`` (true terminations only), all ``[T, N, ...]``.
``update``
    the learner appends them to its replay buffer and runs ``utd`` gradient steps per
    transition once the buffer holds ``learning_starts``.
``sync_weights``
    the actor's weights go to the rollout workers (every ``sync_every`` learner updates).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlinf_nb import tree
from rlinf_nb.config import ConfigError, param

from . import offpolicy_functional as OF
from .augment import random_shift
from .offpolicy_nets import EncodedEnsembleQ, EnsembleQ, ObsEncoder, copy_params, polyak_update
from .registry import Algorithm, Stage, register_algorithm
from .replay import MixedReplay, ReplayBuffer, segment_successors
from .stages import sync_weights_stage

__all__ = [
    "TRANSITION_KEYS",
    "CrossQConfig",
    "CrossQLearner",
    "OffPolicyConfig",
    "RLPDConfig",
    "RLPDLearner",
    "SACConfig",
    "SACLearner",
    "sac_policy_kwargs",
]

TRANSITION_KEYS = ("obs", "actions", "rewards", "next_obs", "terminated")


@dataclass
class OffPolicyConfig:
    """Fields shared by SAC, CrossQ and RLPD (``live`` ones can change mid-run with ``set_hparams``)."""

    buffer_size: int = param(300_000, doc="replay buffer capacity in transitions", range=(1, 1_000_000_000))
    batch_size: int = param(256, doc="transitions per gradient step", range=(1, 1_000_000))
    learning_starts: int = param(
        1000, doc="transitions in the buffer before gradient steps start", range=(0, 1_000_000_000)
    )
    random_steps: int = param(
        1000,
        doc="env steps (over all envs) with uniform random actions at the start",
        range=(0, 1_000_000_000),
    )
    collect_steps: int = param(8, doc="env steps per env per collect stage", range=(1, 1_000_000))
    gamma: float = param(0.99, doc="discount factor", live=True, range=(0.0, 1.0))
    lr: float = param(1e-3, doc="Adam learning rate of the critics", live=True, range=(1e-7, 1.0))
    actor_lr: float | None = param(
        None,
        doc="Adam learning rate of the actor and the temperature; None = lr",
        live=True,
        range=(1e-7, 1.0),
    )
    adam_beta1: float = param(0.9, doc="Adam beta1 of every optimizer", range=(0.0, 0.999))
    utd: float = param(1.0, doc="gradient steps per collected transition (update-to-data ratio)", live=True,
                       range=(0.0, 1000.0))  # fmt: skip
    policy_delay: int = param(
        1, doc="critic steps per actor and temperature step", live=True, range=(1, 1000)
    )
    critic_hidden_sizes: tuple[int, ...] = param((256, 256), doc="widths of each critic's hidden layers")
    num_critics: int = param(2, doc="critics in the ensemble (2 = twin Q)", range=(1, 100))
    init_alpha: float = param(1.0, doc="initial entropy temperature", range=(1e-8, 1e4))
    autotune_alpha: bool = param(True, doc="learn the temperature to hold the policy at target_entropy")
    target_entropy: float | None = param(None, doc="entropy the temperature aims for; None = -act_dim")
    backup_entropy: bool = param(True, doc="include -alpha * log pi(a'|s') in the TD target")
    max_grad_norm: float = param(0.0, doc="gradient clipping norm of every network (0 = off)", live=True,
                                 range=(0.0, 1e6))  # fmt: skip
    sync_every: int = param(
        1, doc="learner updates between weight syncs to the rollout workers", live=True, range=(1, 1_000_000)
    )
    actor_encoder: str = param(
        "critic",
        doc="image observations only: the actor's image encoder. 'critic' = a copy of the critic's encoder "
        "(same architecture as the policy's, trained by the critic loss), refreshed after every critic step "
        "and not trained by the actor loss (DrQ, RLPD, SERL); 'own' = the policy's own encoder, trained by "
        "the actor loss (the critic trains a separate one)",
        choices=("critic", "own"),
    )
    random_shift: int = param(
        0,
        doc="image observations only: DrQ's augmentation, in pixels. Every image of a training batch (obs "
        "and next_obs, drawn independently) is shifted by up to this many pixels each way, edges repeated "
        "(pad and random crop; DrQ uses 4 for 84x84 images). Acting is untouched. 0 = off",
        live=True,
        range=(0, 64),
    )

    def validate(self) -> None:
        if any(s < 1 for s in self.critic_hidden_sizes):
            raise ConfigError(
                "critic_hidden_sizes", self.critic_hidden_sizes, "every layer width must be >= 1"
            )

    def validate_run(self, run: Any) -> None:
        """An ``mlp`` or ``cnn`` policy without ``action_head`` gets ``squashed_gaussian``: the actor
        samples bounded, reparameterised actions (not the on-policy default, an unbounded Gaussian)."""
        if run.policy.name in ("mlp", "cnn") and "action_head" not in run.policy.kwargs:
            run.policy.kwargs = {**run.policy.kwargs, "action_head": "squashed_gaussian"}
        if self.random_shift and run.policy.name == "mlp":
            raise ConfigError("algo.random_shift", self.random_shift, _RANDOM_SHIFT_NEEDS_IMAGES)


_RANDOM_SHIFT_NEEDS_IMAGES = (
    "shifts images: image observations with the 'cnn' policy only; 0 for state observations"
)


@dataclass
class SACConfig(OffPolicyConfig):
    """Hyperparameters of SAC (Pendulum-v1 defaults)."""

    tau: float = param(0.005, doc="Polyak rate of the target critics", live=True, range=(0.0, 1.0))
    target_update_every: int = param(1, doc="critic steps per target update", range=(1, 1000))
    critic_norm: str = param("none", doc="per-layer critic normalisation", choices=("none", "layer"))


@dataclass
class CrossQConfig(OffPolicyConfig):
    """Hyperparameters of CrossQ: batch-norm critics, no target network (Pendulum-v1 defaults)."""

    adam_beta1: float = param(0.5, doc="Adam beta1 of every optimizer", range=(0.0, 0.999))
    policy_delay: int = param(
        3, doc="critic steps per actor and temperature step", live=True, range=(1, 1000)
    )
    bn_momentum: float = param(
        0.01,
        doc="running-statistics momentum of the critics' batch norms (PyTorch convention)",
        range=(0.0, 1.0),
    )


@dataclass
class RLPDConfig(SACConfig):
    """Hyperparameters of RLPD: SAC + demo buffer + layer-norm critic ensemble + high UTD."""

    utd: float = param(10.0, doc="gradient steps per collected transition (update-to-data ratio)", live=True,
                       range=(0.0, 1000.0))  # fmt: skip
    num_critics: int = param(10, doc="critics in the ensemble", range=(1, 100))
    critic_subset: int = param(2, doc="random critics whose min forms the TD target", range=(1, 100))
    critic_norm: str = param("layer", doc="per-layer critic normalisation", choices=("none", "layer"))
    demo_fraction: float = param(0.5, doc="share of each batch drawn from the demo buffer", live=True,
                                 range=(0.0, 1.0))  # fmt: skip
    demo_buffer_size: int = param(
        1_000_000, doc="demo buffer capacity in transitions", range=(1, 1_000_000_000)
    )
    demos: str | None = param(
        None,
        doc="demo episodes loaded into the demo buffer at the start: 'scripted:<n>' = n successful episodes "
        "of the env's scripted policy (rlinf_nb.envs.scripted); None = none (human interventions still join)",
    )

    def validate(self) -> None:
        super().validate()
        if self.demos is not None:
            kind, _, arg = self.demos.partition(":")
            if kind != "scripted" or not arg.isdigit() or int(arg) < 1:
                raise ConfigError(
                    "demos", self.demos, "expected 'scripted:<n>' with n >= 1 episodes, or None"
                )
        if self.critic_subset > self.num_critics:
            raise ConfigError(
                "critic_subset", self.critic_subset, f"must be <= num_critics ({self.num_critics})"
            )


def sac_policy_kwargs(hidden_sizes: tuple[int, ...] = (256, 256)) -> dict[str, Any]:
    """``make_policy("mlp", ...)`` keyword arguments for a SAC actor (CleanRL-style MLP)."""
    return {
        "action_head": "squashed_gaussian",
        "hidden_sizes": hidden_sizes,
        "activation": "relu",
        "ortho_init": False,
    }


# ----------------------------------------------------------------------------- learner


@contextmanager
def _frozen(module: nn.Module) -> Iterator[None]:
    """Parameters of ``module`` do not require grad inside the block (nothing flows into them)."""
    flags = [p.requires_grad for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(module.parameters(), flags, strict=True):
            p.requires_grad_(f)


def _adam(params: Any, lr: float, beta1: float) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=lr, betas=(beta1, 0.999), fused=True)


def as_transitions(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The five replay fields of a batch, flattened to ``[n, ...]``.

    ``batch`` holds :data:`TRANSITION_KEYS` with leading ``[T, N]`` (``rewards`` 2-D) or
    ``[n]`` dims. Without ``terminated``, it is derived as ``dones & ~truncated``.
    """
    out: dict[str, Any] = {}
    rewards = np.asarray(batch["rewards"])
    lead = rewards.ndim
    if lead not in (1, 2):
        raise ValueError(f"transitions: rewards must be [n] or [T, N], got shape {rewards.shape}")
    if "terminated" in batch:
        term = np.asarray(batch["terminated"])
    elif "dones" in batch:
        trunc = np.asarray(batch.get("truncated", np.zeros_like(batch["dones"])), dtype=bool)
        term = np.asarray(batch["dones"], dtype=bool) & ~trunc
    else:
        raise ValueError("transitions: need 'terminated' (or 'dones' and 'truncated')")
    src = {**{k: batch[k] for k in ("obs", "actions", "next_obs")}, "rewards": rewards, "terminated": term}
    for key, value in src.items():
        for path, leaf in tree.items(value, key):  # dict observations: every leaf
            shape = np.shape(leaf)
            if shape[:lead] != rewards.shape:
                raise ValueError(
                    f"transitions: {path} has shape {shape}, expected leading dims {rewards.shape}"
                )
        arrays = tree.map(np.asarray, value)
        out[key] = tree.flatten_lead(arrays, 2) if lead == 2 else arrays
    out["rewards"] = out["rewards"].astype(np.float32)
    out["terminated"] = out["terminated"].astype(np.float32)
    out["actions"] = out["actions"].astype(np.float32)
    return out


class SACLearner:
    """Off-policy learner for SAC (and, through subclasses, CrossQ and RLPD).

    Args:
        policy: the actor: ``sample(obs) -> (action[B, A], log_prob[B])`` with gradients;
            ``actor_parameters()`` if only part of it is the actor (``ActorCritic``);
            ``obs_dim`` and ``action_space`` unless ``obs_dim``/``action_dim`` are given.
            For image observations, a policy with image encoders (the ``cnn`` policy:
            ``actor_encoders``, ``image_keys``, ``state_keys``): the critic copies them.
        cfg: the algorithm config.
        seed: seeds replay sampling and the critic subsets.

    Entry points for the runtime: :meth:`update` (append a batch, then ``utd`` steps per
    transition), or :meth:`add` and :meth:`train` separately (async: the actor worker adds
    as data arrives and trains in its own loop); :meth:`policy_state` for weight sync;
    :meth:`state_dict` / :meth:`load_state_dict` for checkpoints (replay buffer included).
    """

    critic_norm = "none"
    uses_target = True

    def __init__(
        self,
        policy: nn.Module,
        cfg: OffPolicyConfig,
        seed: int = 0,
        obs_dim: int | None = None,
        action_dim: int | None = None,
    ):
        self.policy = policy
        space = getattr(policy, "obs_space", None)
        # Image observations (the cnn policy): the critic gets image encoders of its own.
        self.image_obs = obs_dim is None and hasattr(policy, "actor_encoders")
        flat = obs_dim is not None or (not isinstance(space, Mapping) and hasattr(policy, "obs_dim"))
        if not flat and not self.image_obs:
            keys = ", ".join(map(str, space)) if isinstance(space, Mapping) else type(policy).__name__
            raise ValueError(
                f"{type(self).__name__}: dict observations ({keys}) need a policy with image encoders "
                "(actor_encoders, image_keys, state_keys): use policy name 'cnn' with "
                "action_head 'squashed_gaussian', or a state obs_mode with the 'mlp' policy"
            )
        self.obs_dim = 0 if self.image_obs else int(obs_dim if obs_dim is not None else policy.obs_dim)
        self.action_dim = int(action_dim if action_dim is not None else np.prod(policy.action_space.shape))
        self.actor_encoder = cfg.actor_encoder if self.image_obs else "none"
        self._check_random_shift(cfg)
        self.critic = self._make_critic(cfg)
        self.critic_target = None
        if self.uses_target:
            self.critic_target = copy.deepcopy(self.critic)
            self.critic_target.requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), requires_grad=True)
        self.target_entropy = float(
            cfg.target_entropy if cfg.target_entropy is not None else -self.action_dim
        )
        actor_params = (
            policy.actor_parameters() if hasattr(policy, "actor_parameters") else policy.parameters()
        )
        self.actor_params = list(actor_params)
        if self.actor_encoder == "critic":
            # The policy's encoders are the critic's, copied in; the actor loss never trains them.
            frozen = {id(p) for p in policy.actor_encoders.parameters()}
            self.actor_params = [p for p in self.actor_params if id(p) not in frozen]
            policy.actor_encoders.requires_grad_(False)
        actor_lr = cfg.actor_lr if cfg.actor_lr is not None else cfg.lr
        self.actor_optimizer = _adam(self.actor_params, actor_lr, cfg.adam_beta1)
        self.critic_optimizer = _adam(self.critic.parameters(), cfg.lr, cfg.adam_beta1)
        self.alpha_optimizer = _adam([self.log_alpha], actor_lr, cfg.adam_beta1)
        self.replay = ReplayBuffer(cfg.buffer_size)
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.num_updates = 0
        self.num_added = 0
        self._credit = 0.0

    # ------------------------------------------------------------------ building blocks

    def _make_critic(self, cfg: OffPolicyConfig) -> nn.Module:
        return self._ensemble(cfg, getattr(cfg, "critic_norm", self.critic_norm))

    def _ensemble(self, cfg: OffPolicyConfig, norm: str, bn_momentum: float = 0.01) -> nn.Module:
        """``EnsembleQ`` on flat observations, or ``EncodedEnsembleQ`` with the critic's own image encoders."""
        sizes, E = cfg.critic_hidden_sizes, cfg.num_critics
        if not self.image_obs:
            return EnsembleQ(self.obs_dim, self.action_dim, sizes, E, norm, bn_momentum)
        return EncodedEnsembleQ(self._critic_encoder(), self.action_dim, sizes, E, norm, bn_momentum)

    def _critic_encoder(self) -> ObsEncoder:
        """The policy's image encoders: copied for ``actor_encoder: critic``, freshly built for ``own``."""
        p = self.policy
        enc = {k: p.actor_encoders[k.replace(".", "_")] for k in p.image_keys}
        if self.actor_encoder == "critic":
            enc = {k: copy.deepcopy(e) for k, e in enc.items()}
        else:
            from rlinf_nb.policies.cnn import ImageEncoder

            spaces = {"image": p.obs_space} if getattr(p, "_single_image", False) else p.obs_space
            enc = {k: ImageEncoder(spaces[k], p.config) for k in enc}
        return ObsEncoder(enc, p.state_keys, p.state_dim)

    def _sync_actor_encoder(self) -> None:
        """``actor_encoder: critic``: the policy's encoders <- the critic's (after each critic step)."""
        if self.actor_encoder != "critic":
            return
        enc = self.critic.encoder
        for key, module in zip(enc.image_keys, enc.images, strict=True):
            copy_params(self.policy.actor_encoders[key.replace(".", "_")], module)

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def _tensors(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """float32 tensors; with image observations ``uint8`` leaves stay ``uint8`` (the encoders scale them)."""

        def leaf(v: Any) -> torch.Tensor:
            v = np.asarray(v)
            keep = self.image_obs and v.dtype == np.uint8
            return torch.as_tensor(v) if keep else torch.as_tensor(v, dtype=torch.float32)

        return {k: tree.map(leaf, v) for k, v in sample.items()}

    def sample_batch(self, cfg: OffPolicyConfig) -> dict[str, torch.Tensor]:
        """A training batch of ``cfg.batch_size`` transitions as float32 tensors (``uint8`` images stay ``uint8``)."""
        return self._tensors(self.replay.sample(cfg.batch_size, self.rng))

    def _check_random_shift(self, cfg: OffPolicyConfig) -> None:
        if cfg.random_shift and not self.image_obs:
            raise ConfigError("algo.random_shift", cfg.random_shift, _RANDOM_SHIFT_NEEDS_IMAGES)

    def augment(self, b: dict[str, Any], cfg: OffPolicyConfig) -> dict[str, Any]:
        """``algo.random_shift``: the batch's images (``obs`` and ``next_obs``) shifted, each image its own
        shift (:func:`.augment.random_shift`, drawn from this learner's generator); state leaves untouched."""
        if not cfg.random_shift:
            return b
        self._check_random_shift(cfg)  # a live change
        p = self.policy
        last = p.config.channels_last

        def shifted(obs: Any) -> Any:
            if not isinstance(obs, Mapping):  # a single image Box observation
                return random_shift(obs, cfg.random_shift, self.rng, last)
            return {k: random_shift(v, cfg.random_shift, self.rng, last) if k in p.image_keys else v
                    for k, v in obs.items()}  # fmt: skip

        return {**b, "obs": shifted(b["obs"]), "next_obs": shifted(b["next_obs"])}

    def _target_q(
        self, b: Mapping[str, torch.Tensor], next_obs_q: torch.Tensor, cfg: OffPolicyConfig
    ) -> torch.Tensor:
        return OF.reduce_ensemble(next_obs_q, "min")

    def critic_loss(self, b: Mapping[str, torch.Tensor], cfg: OffPolicyConfig) -> OF.CriticLossTerms:
        """The critic loss on batch ``b`` (the TD target is a constant)."""
        assert self.critic_target is not None
        with torch.no_grad():
            next_a, next_logp = self.policy.sample(b["next_obs"])
            next_q = self._target_q(b, self.critic_target(b["next_obs"], next_a), cfg)
            y = OF.td_target(
                b["rewards"], next_q, b["terminated"], cfg.gamma,
                next_logp if cfg.backup_entropy else None, self.alpha,
            )  # fmt: skip
        return OF.sac_critic_loss(self.critic(b["obs"], b["actions"]), y)

    def _q_for_actor(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return OF.reduce_ensemble(self.critic(obs, actions), "min")

    def actor_loss(
        self, b: Mapping[str, torch.Tensor], cfg: OffPolicyConfig
    ) -> tuple[OF.ActorLossTerms, OF.TemperatureLossTerms]:
        """The actor loss (critics frozen: no gradient reaches them) and the temperature loss."""
        a, logp = self.policy.sample(b["obs"])
        with _frozen(self.critic):
            q_pi = self._q_for_actor(b["obs"], a)
        actor = OF.sac_actor_loss(logp, q_pi, self.alpha)
        temp = OF.temperature_loss(self.log_alpha, logp, self.target_entropy)
        return actor, temp

    def _step(
        self, opt: torch.optim.Optimizer, loss: torch.Tensor, params: Any, cfg: OffPolicyConfig
    ) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()

    def train_step(self, cfg: OffPolicyConfig) -> dict[str, float]:
        """One gradient step (critic; actor and temperature every ``policy_delay``; target)."""
        b = self.augment(self.sample_batch(cfg), cfg)
        c = self.critic_loss(b, cfg)
        self._step(self.critic_optimizer, c.loss, list(self.critic.parameters()), cfg)
        self._sync_actor_encoder()
        self.num_updates += 1
        out = {
            "critic_loss": float(c.loss.detach()),
            "q_mean": float(c.q_mean),
            "td_error": float(c.td_error),
        }
        if self.num_updates % cfg.policy_delay == 0:
            actor, temp = self.actor_loss(b, cfg)
            self._step(self.actor_optimizer, actor.loss, self.actor_params, cfg)
            if cfg.autotune_alpha:
                self._step(self.alpha_optimizer, temp.loss, [self.log_alpha], cfg)
            out.update(actor_loss=float(actor.loss.detach()), entropy=float(actor.entropy), q_pi=float(actor.q_pi),
                       temperature_loss=float(temp.loss.detach()))  # fmt: skip
        self._after_step(cfg)
        return out

    def _after_step(self, cfg: Any) -> None:
        if self.critic_target is not None and self.num_updates % cfg.target_update_every == 0:
            polyak_update(self.critic_target, self.critic, cfg.tau)

    def _apply_live(self, cfg: OffPolicyConfig) -> None:
        actor_lr = cfg.actor_lr if cfg.actor_lr is not None else cfg.lr
        for opt, lr in ((self.critic_optimizer, cfg.lr), (self.actor_optimizer, actor_lr),
                        (self.alpha_optimizer, actor_lr)):  # fmt: skip
            for group in opt.param_groups:
                group["lr"] = lr

    def ready(self, cfg: OffPolicyConfig) -> bool:
        """Enough data for gradient steps (``learning_starts`` and one batch)."""
        return len(self.replay) >= max(cfg.learning_starts, 1) and len(self.replay) >= min(
            cfg.batch_size, self.replay.capacity
        )

    # ------------------------------------------------------------------ runtime API

    def add(self, batch: Mapping[str, Any]) -> int:
        """Append a batch of transitions (see :func:`as_transitions`); returns how many."""
        n = self.replay.extend(as_transitions(batch), next_of=segment_successors(np.shape(batch["rewards"])))
        self.num_added += n
        return n

    def train(self, num_updates: int, cfg: OffPolicyConfig) -> dict[str, float]:
        """Run ``num_updates`` gradient steps (none before :meth:`ready`); returns mean metrics."""
        self._apply_live(cfg)
        rows: list[dict[str, float]] = []
        if self.ready(cfg):
            for _ in range(int(num_updates)):
                rows.append(self.train_step(cfg))
        out: dict[str, float] = {}
        for key in {k for r in rows for k in r}:
            vals = [r[key] for r in rows if key in r]
            out[key] = float(np.mean(vals))
        out.update(alpha=float(self.alpha), updates=float(len(rows)), total_updates=float(self.num_updates),
                   replay_size=float(len(self.replay)), replay_mb=self.replay.stored_bytes() / 1e6)  # fmt: skip
        return out

    def update(
        self, batch: Mapping[str, Any], cfg: OffPolicyConfig, progress: float = 0.0
    ) -> dict[str, float]:
        """Append ``batch``, then ``cfg.utd`` gradient steps per new transition (fractions carry over)."""
        n = self.add(batch)
        if not self.ready(cfg):
            self._credit = 0.0
            return self.train(0, cfg)
        self._credit += cfg.utd * n
        k = int(self._credit)
        self._credit -= k
        return self.train(k, cfg)

    def policy_state(self) -> dict[str, np.ndarray]:
        """The actor's weights as numpy arrays (what the rollout workers load)."""
        return {k: v.detach().cpu().numpy() for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """A deep copy of everything a resumed run needs (networks, optimizers, replay, RNGs)."""
        return copy.deepcopy(self._state())

    def _state(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": None if self.critic_target is None else self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "rng": self.rng.bit_generator.state,
            "generator": self.generator.get_state(),
            "counters": {
                "num_updates": self.num_updates,
                "num_added": self.num_added,
                "credit": self._credit,
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        if self.critic_target is not None and state.get("critic_target") is not None:
            self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.rng.bit_generator.state = state["rng"]
        self.generator.set_state(state["generator"])
        self._sync_actor_encoder()
        c = state["counters"]
        self.num_updates, self.num_added, self._credit = (
            int(c["num_updates"]),
            int(c["num_added"]),
            float(c["credit"]),
        )


class CrossQLearner(SACLearner):
    """CrossQ: batch-norm critics, no target network, joint ``(s, a) + (s', a')`` critic pass."""

    critic_norm = "batch"
    uses_target = False

    def _make_critic(self, cfg: OffPolicyConfig) -> nn.Module:
        return self._ensemble(cfg, "batch", getattr(cfg, "bn_momentum", 0.01))

    def critic_loss(self, b: Mapping[str, torch.Tensor], cfg: OffPolicyConfig) -> OF.CriticLossTerms:
        """One train-mode critic pass over ``cat(s, s')``, ``cat(a, a')``; the ``s'`` half is the target."""
        with torch.no_grad():
            next_a, next_logp = self.policy.sample(b["next_obs"])
        B = tree.batch_size(b["obs"])
        self.critic.train()
        q_all = self.critic(tree.concatenate([b["obs"], b["next_obs"]]), torch.cat([b["actions"], next_a]))
        q, q_next = q_all[:, :B], q_all[:, B:].detach()
        y = OF.td_target(
            b["rewards"], OF.reduce_ensemble(q_next, "min"), b["terminated"], cfg.gamma,
            next_logp if cfg.backup_entropy else None, self.alpha,
        )  # fmt: skip
        return OF.sac_critic_loss(q, y)

    def _q_for_actor(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        self.critic.eval()
        try:
            return OF.reduce_ensemble(self.critic(obs, actions), "min")
        finally:
            self.critic.train()

    def _after_step(self, cfg: Any) -> None:
        pass


class RLPDLearner(SACLearner):
    """RLPD: SAC with a layer-norm critic ensemble, random-subset target min, demos sampled 50/50."""

    critic_norm = "layer"

    def __init__(self, policy: nn.Module, cfg: RLPDConfig, seed: int = 0, **kwargs: Any):
        super().__init__(policy, cfg, seed=seed, **kwargs)
        self.demos = ReplayBuffer(cfg.demo_buffer_size)
        self.num_intervention_demos = 0

    def add_demos(self, batch: Mapping[str, Any]) -> int:
        """Append demonstration transitions (same fields as :meth:`add`) to the demo buffer."""
        return self.demos.extend(as_transitions(batch))

    def add(self, batch: Mapping[str, Any]) -> int:
        """Append to the online replay; transitions a human drove (``intervened``) also join the demos."""
        n = super().add(batch)
        if "intervened" in batch:
            human = np.asarray(batch["intervened"], bool).reshape(-1)
            if human.any():
                self.demos.extend({k: tree.index(v, human) for k, v in as_transitions(batch).items()})
                self.num_intervention_demos += int(human.sum())
        return n

    def train(self, num_updates: int, cfg: OffPolicyConfig) -> dict[str, float]:
        out = super().train(num_updates, cfg)
        out.update(demo_size=float(len(self.demos)), intervention_demos=float(self.num_intervention_demos))
        return out

    def sample_batch(self, cfg: RLPDConfig) -> dict[str, torch.Tensor]:  # type: ignore[override]
        mixed = MixedReplay([self.replay, self.demos], [1.0 - cfg.demo_fraction, cfg.demo_fraction])
        return self._tensors(mixed.sample(cfg.batch_size, self.rng))

    def _target_q(
        self, b: Mapping[str, torch.Tensor], next_obs_q: torch.Tensor, cfg: RLPDConfig
    ) -> torch.Tensor:  # type: ignore[override]
        subset = torch.randperm(next_obs_q.shape[0], generator=self.generator)[: cfg.critic_subset]
        return OF.reduce_ensemble(next_obs_q, "min", subset)

    def _q_for_actor(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return OF.reduce_ensemble(self.critic(obs, actions), "mean")

    def _state(self) -> dict[str, Any]:
        demos = {"demos": self.demos.state_dict(), "intervention_demos": self.num_intervention_demos}
        return {**super()._state(), **demos}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.demos.load_state_dict(state["demos"])
        self.num_intervention_demos = int(state.get("intervention_demos", 0))


# ----------------------------------------------------------------------------- stages


def collect_stage(ctx: Any) -> dict[str, Any]:
    """Take the finished collection segment (``collect_steps`` per env) as ``ctx.batch``.

    The runtime keeps one segment in flight: the next one starts as soon as this one is taken,
    so the envs collect while the learner trains on this one (fully async, one segment stale).
    """
    return ctx.collect_async(ctx.hp.collect_steps, block=True)


def update_stage(ctx: Any) -> dict[str, Any]:
    """Send the new transitions to the learner: replay append, then ``utd`` gradient steps each.

    ``intervened`` (robot envs with a human in the loop) travels along: RLPD puts those into its demos.
    """
    return ctx.learner_update([*TRANSITION_KEYS, "intervened"])


def _offpolicy_stages(update_doc: str) -> tuple[Stage, ...]:
    return (
        Stage("collect", collect_stage, "step the envs with the current actor (random at first)"),
        Stage("update", update_stage, update_doc),
        Stage("sync_weights", sync_weights_stage, "push the actor's weights to the rollout workers"),
    )


SAC = register_algorithm(
    Algorithm(
        "sac",
        SACConfig,
        _offpolicy_stages("replay append; twin-Q, actor and temperature steps"),
        SACLearner,
        doc=__doc__ or "",
    )  # fmt: skip
)
CROSSQ = register_algorithm(
    Algorithm(
        "crossq",
        CrossQConfig,
        _offpolicy_stages("replay append; batch-norm critic steps, no target"),
        CrossQLearner,
        doc=__doc__ or "",
    )  # fmt: skip
)
RLPD = register_algorithm(
    Algorithm(
        "rlpd",
        RLPDConfig,
        _offpolicy_stages("replay append; 50/50 demo batches, critic ensemble steps"),
        RLPDLearner,
        doc=__doc__ or "",
    )  # fmt: skip
)
