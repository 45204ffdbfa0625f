"""Pure SAC-family maths (SAC, CrossQ, RLPD): TD targets and the three losses.

Stateless torch functions, tested against slow reference loops in
``tests/test_offpolicy.py``. Shapes: ``B`` = batch of transitions, ``E`` = critics in an
ensemble; Q-values of an ensemble are ``[E, B]``.

Which gradients flow where is part of each contract: :func:`td_target` and
:func:`sac_critic_loss` treat the target as a constant, :func:`sac_actor_loss` treats the
temperature as a constant, and :func:`temperature_loss` treats the log-probs as constants.
The actor loss still depends on the critic's parameters through ``q_pi``: the learner
freezes the critic while it computes it (see ``SACLearner``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ActorLossTerms",
    "CriticLossTerms",
    "TemperatureLossTerms",
    "reduce_ensemble",
    "sac_actor_loss",
    "sac_critic_loss",
    "td_target",
    "temperature_loss",
]


def reduce_ensemble(q: Tensor, mode: str = "min", subset: Tensor | None = None) -> Tensor:
    """Reduce ensemble Q-values ``q[E, B]`` to ``[B]``.

    ``mode="min"``: the elementwise minimum (clipped double Q); ``"mean"``: the average
    (RLPD's actor). ``subset``: int64 indices ``[M]`` of the critics to use (RLPD's random
    subset for the target); ``None`` = all of them.
    """
    if q.dim() != 2:
        raise ValueError(f"reduce_ensemble expects q of shape [E, B], got {tuple(q.shape)}")
    if subset is not None:
        q = q.index_select(0, subset)
    if mode == "min":
        return q.min(dim=0).values
    if mode == "mean":
        return q.mean(dim=0)
    raise ValueError(f"reduce_ensemble: mode {mode!r} is not 'min' or 'mean'")


def td_target(
    rewards: Tensor,
    next_q: Tensor,
    terminated: Tensor,
    gamma: float,
    next_log_prob: Tensor | None = None,
    alpha: float | Tensor = 0.0,
) -> Tensor:
    """Soft one-step TD target ``y = r + gamma * (1 - terminated) * (Q'(s', a') - alpha * log pi(a'|s'))``.

    Shapes:
        rewards, next_q, terminated, next_log_prob: ``[B]`` (``next_q`` already reduced
        over the ensemble, ``a' ~ pi(.|s')``). Returns ``[B]``, detached.

    ``terminated`` must be a true termination only: a time-limit truncation still
    bootstraps (store the real next observation and ``terminated=False``). With
    ``next_log_prob=None`` (or ``alpha=0``) there is no entropy term in the backup.
    """
    for name, t in (("next_q", next_q), ("terminated", terminated)):
        if t.shape != rewards.shape:
            raise ValueError(f"td_target: {name} has shape {tuple(t.shape)}, expected {tuple(rewards.shape)}")
    with torch.no_grad():
        v = next_q
        if next_log_prob is not None:
            if next_log_prob.shape != rewards.shape:
                raise ValueError(
                    f"td_target: next_log_prob has shape {tuple(next_log_prob.shape)}, "
                    f"expected {tuple(rewards.shape)}"
                )
            v = v - alpha * next_log_prob
        cont = 1.0 - terminated.to(v.dtype)
        return (rewards.to(v.dtype) + gamma * cont * v).detach()


class CriticLossTerms(NamedTuple):
    """The critic loss and its (detached) diagnostics.

    Attributes:
        loss: ``0.5 * sum_e mean_b (q[e, b] - y[b])^2``; carries gradients into ``q_pred``.
        q_mean: mean predicted Q over critics and batch; detached.
        td_error: mean absolute TD error ``|q - y|`` over critics and batch; detached.
    """

    loss: Tensor
    q_mean: Tensor
    td_error: Tensor


def sac_critic_loss(q_pred: Tensor, q_target: Tensor) -> CriticLossTerms:
    """Squared TD error of every critic in an ensemble against one shared target.

    Shapes:
        q_pred: ``[E, B]`` (or ``[B]`` for a single critic); q_target: ``[B]``.
        Returns :class:`CriticLossTerms` of scalars.

    ``loss = 0.5 * sum_e mean_b (q_pred[e, b] - q_target[b])^2`` (SB3's scaling: each
    critic gets the gradient of its own half-MSE). ``q_target`` is detached here.
    """
    if q_pred.dim() == 1:
        q_pred = q_pred.unsqueeze(0)
    if q_pred.shape[1:] != q_target.shape:
        raise ValueError(
            f"sac_critic_loss: q_pred {tuple(q_pred.shape)} does not match q_target {tuple(q_target.shape)}"
        )
    err = q_pred - q_target.detach().to(q_pred.dtype).unsqueeze(0)
    loss = 0.5 * err.pow(2).mean(dim=1).sum()
    with torch.no_grad():
        return CriticLossTerms(loss, q_pred.mean().detach(), err.abs().mean().detach())


class ActorLossTerms(NamedTuple):
    """The actor loss and its (detached) diagnostics.

    Attributes:
        loss: ``mean(alpha * log_prob - q_pi)``; carries gradients into ``log_prob`` and ``q_pi``.
        entropy: ``-mean(log_prob)``, a one-sample entropy estimate; detached.
        q_pi: mean of ``q_pi``; detached.
    """

    loss: Tensor
    entropy: Tensor
    q_pi: Tensor


def sac_actor_loss(log_prob: Tensor, q_pi: Tensor, alpha: float | Tensor) -> ActorLossTerms:
    """SAC's policy loss, the KL to the soft-Q Boltzmann policy up to a constant.

    Shapes:
        log_prob: ``[B]``, ``log pi(a|s)`` of reparameterised actions ``a ~ pi(.|s)``;
        q_pi: ``[B]``, ``Q(s, a)`` of those actions (already reduced over the ensemble).
        alpha: the temperature, a float or a scalar tensor (detached here).
        Returns :class:`ActorLossTerms` of scalars.
    """
    if q_pi.shape != log_prob.shape:
        raise ValueError(
            f"sac_actor_loss: q_pi has shape {tuple(q_pi.shape)}, expected {tuple(log_prob.shape)}"
        )
    a = alpha.detach() if isinstance(alpha, Tensor) else alpha
    loss = (a * log_prob - q_pi).mean()
    with torch.no_grad():
        return ActorLossTerms(loss, -log_prob.mean().detach(), q_pi.mean().detach())


class TemperatureLossTerms(NamedTuple):
    """The temperature loss and its (detached) diagnostics.

    Attributes:
        loss: ``-mean(log_alpha * (log_prob + target_entropy))``; gradients into ``log_alpha`` only.
        alpha: ``exp(log_alpha)``; detached.
        entropy_gap: ``target_entropy - entropy`` (negative = the policy is more random than
            the target, so alpha should fall); detached.
    """

    loss: Tensor
    alpha: Tensor
    entropy_gap: Tensor


def temperature_loss(log_alpha: Tensor, log_prob: Tensor, target_entropy: float) -> TemperatureLossTerms:
    """Automatic entropy tuning (Haarnoja et al. 2018, SB3's form on ``log alpha``).

    Shapes:
        log_alpha: scalar (0-dim or ``[1]``) tensor that requires grad; log_prob: ``[B]``
        (detached here). Returns :class:`TemperatureLossTerms` of scalars.

    Minimising ``-log_alpha * mean(log_prob + target_entropy)`` raises alpha when the policy's
    entropy ``-mean(log_prob)`` is below ``target_entropy`` and lowers it when above.
    """
    lp = log_prob.detach()
    la = log_alpha.reshape(())
    loss = -(la * (lp + target_entropy)).mean()
    with torch.no_grad():
        return TemperatureLossTerms(loss, la.exp().detach(), (target_entropy + lp.mean()).detach())
