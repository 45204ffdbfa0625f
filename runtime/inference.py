"""Policy inference for env workers: one class, used by rollout workers and colocated env workers.

A :class:`PolicyServer` holds a policy with versioned weights and answers observation messages
(``{"obs", "sender", "final_obs", "final_mask", "value_only"}``, see :mod:`.workers`) with actions,
log-probs, values, bootstrap values and the weight version that produced them. A message with
``"with_values": False`` (off-policy collection: its learner has critics of its own) gets no
``values``, and the policy's critic is not run. A message's ``"acting"``
(:data:`ACTING_MODES`) says how actions are picked: ``sample`` (default) draws from the policy,
``mode`` takes its most likely action (evaluation: BC's ``eval_actions``), ``random`` draws uniform
random actions instead (off-policy warm-up, ``algo.random_steps``).

Rollout workers run one for the env workers they serve. With ``placement.env_to_rollout: colocated``
each env worker runs its own, so a step costs no actor call at all; weights then arrive while a
rollout may be running (async off-policy), so :meth:`PolicyServer.offer_weights` only parks them and
:meth:`PolicyServer.answer` loads the newest parked weights before the next decision.

``policy.inference`` picks how it acts: ``numpy`` runs the policy's numpy copy
(:mod:`rlinf_nb.policies.numpy_mlp`, the ``mlp`` policy: no torch in this process), ``torch`` the
torch module, ``auto`` (default) numpy where the policy has a numpy copy.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_nb import tree

from .compression import ObsDecoder

INFERENCE_BACKENDS = ("auto", "torch", "numpy")
ACTING_MODES = ("sample", "mode", "random")


class TorchActing:
    """The torch policy, acting without gradients (for policies without a numpy copy)."""

    def __init__(self, policy_cfg: dict[str, Any], obs_space: Any, action_space: Any, seed: int):
        import torch

        from rlinf_nb.policies import make_policy
        from rlinf_nb.run_config import policy_kwargs

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        torch.manual_seed(seed)
        self.policy = make_policy(policy_cfg["name"], obs_space, action_space, **policy_kwargs(policy_cfg))
        self.policy.eval()

    def load(self, weights: dict[str, np.ndarray]) -> None:
        import torch

        self.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})

    def act(self, obs: Any, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            actions, logprobs, values = self.policy.act(tree.map(torch.as_tensor, obs), deterministic)
        return actions.numpy(), logprobs.numpy(), values.numpy()

    def act_without_value(self, obs: Any, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``act`` without the critic, where the policy offers it (:class:`~rlinf_nb.policies.base.ActorCriticAPI`
        does; a policy of its own may only have ``act``, whose value is then dropped)."""
        import torch

        act = getattr(self.policy, "act_without_value", None)
        if act is None:
            return self.act(obs, deterministic)[:2]
        with torch.no_grad():
            actions, logprobs = act(tree.map(torch.as_tensor, obs), deterministic)
        return actions.numpy(), logprobs.numpy()

    def value(self, obs: Any) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.policy.value(tree.map(torch.as_tensor, obs)).numpy()


def make_acting(policy_cfg: dict[str, Any], obs_space: Any, action_space: Any, seed: int) -> Any:
    """The acting backend that ``policy.inference`` asks for (see the module docstring).

    Raises:
        ValueError: ``inference: numpy`` for a policy without a numpy copy (the message says why).
    """
    from rlinf_nb.policies.numpy_mlp import numpy_policy, numpy_support

    backend = policy_cfg.get("inference", "auto")
    if backend not in INFERENCE_BACKENDS:
        raise ValueError(
            f"policy.inference: got {backend!r}; allowed values: {', '.join(INFERENCE_BACKENDS)}"
        )
    if backend != "torch":
        acting = numpy_policy(policy_cfg, obs_space, action_space, seed)
        if acting is not None:
            return acting
        if backend == "numpy":
            why = numpy_support(policy_cfg, obs_space, action_space)
            raise ValueError(
                f"policy.inference: numpy is not available for this policy: {why}; use auto or torch"
            )
    return TorchActing(policy_cfg, obs_space, action_space, seed)


class PolicyServer:
    """A policy with versioned weights answering observation messages."""

    def __init__(self, policy_cfg: dict[str, Any], obs_space: Any, action_space: Any, torch_seed: int):
        self.action_space = action_space
        self.random_actions = np.random.default_rng(torch_seed)  # messages acting "random": uniform actions
        self.acting = make_acting(policy_cfg, obs_space, action_space, torch_seed)
        # the torch module (TorchActing) or the numpy copy (NumpyMLPPolicy)
        self.policy = getattr(self.acting, "policy", self.acting)
        self.version = -1
        self.obs_decoder = ObsDecoder()  # compressed observations (compression.obs), per env worker stream
        self._parked: tuple[dict[str, np.ndarray], int] | None = None
        self._lock = threading.Lock()

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> int:
        """Load ``weights`` now (the caller owns the policy's thread)."""
        self.acting.load(weights)
        self.version = version
        return version

    def offer_weights(self, weights: dict[str, np.ndarray], version: int, replace: bool = False) -> int:
        """Park ``weights`` for the next decision (safe from another thread); a newer offer replaces them.

        ``replace``: park them whatever is parked (a learner restored from a checkpoint goes back to an
        older version, which must win over the lost timeline's newer one)."""
        with self._lock:
            if replace or self._parked is None or version >= self._parked[1]:
                self._parked = (weights, version)
        return version

    @property
    def newest_version(self) -> int:
        """The version this server answers with from its next decision on (parked weights included)."""
        with self._lock:
            return self.version if self._parked is None else max(self.version, self._parked[1])

    def load_parked(self) -> None:
        """Load the weights parked by :meth:`offer_weights`, if any."""
        with self._lock:
            parked, self._parked = self._parked, None
        if parked is not None:
            self.set_weights(*parked)

    def uniform_actions(self, n: int) -> np.ndarray:
        """``n`` actions drawn uniformly from the action space (this server's own seeded generator)."""
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return self.random_actions.integers(space.start, space.start + space.n, size=n)
        if isinstance(space, gym.spaces.Box):
            if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
                raise ValueError(
                    f"algo.random_steps: the action space {space} is unbounded, so it has no uniform "
                    "distribution; set algo.random_steps: 0"
                )
            return self.random_actions.uniform(space.low, space.high, size=(n, *space.shape)).astype(
                space.dtype
            )
        raise ValueError(
            f"algo.random_steps: cannot draw uniform actions from {space}; set algo.random_steps: 0"
        )

    def answer(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Actions, log-probs, values (and bootstrap values of time-limited episodes) for each message."""
        self.load_parked()
        # obs: an array or a dict of arrays per message, [n_i, ...] per leaf; dtypes kept (uint8 images)
        msgs = [{**m, "obs": self.obs_decoder.decode(m["obs"], m.get("sender"))} for m in msgs]
        sizes = [tree.batch_size(m["obs"]) for m in msgs]
        obs = msgs[0]["obs"] if len(msgs) == 1 else tree.concatenate([m["obs"] for m in msgs])
        acting = msgs[0].get("acting", "sample")
        if acting not in ACTING_MODES:
            raise ValueError(f"acting: got {acting!r}; allowed values: {', '.join(ACTING_MODES)}")
        with_values = msgs[0].get("with_values", True)
        values = None
        if msgs[0]["value_only"]:
            actions = logprobs = None
            values = self.acting.value(obs)
        elif acting == "random":  # off-policy warm-up (algo.random_steps): not the policy's actions
            actions = self.uniform_actions(sum(sizes))
            logprobs = np.zeros(sum(sizes), np.float32)
            values = self.acting.value(obs) if with_values else None
        elif with_values:
            actions, logprobs, values = self.acting.act(obs, deterministic=acting == "mode")
        else:
            actions, logprobs = self.acting.act_without_value(obs, deterministic=acting == "mode")
        boot = [None if m["final_obs"] is None else self.acting.value(m["final_obs"]) for m in msgs]
        if len(msgs) == 1:  # one sender (colocated and direct inference): no slicing
            return [self._reply(values, boot[0], sizes[0], actions, logprobs)]
        offsets = np.cumsum([0, *sizes])
        replies = []
        for i in range(len(msgs)):
            sl = slice(offsets[i], offsets[i + 1])
            replies.append(self._reply(None if values is None else values[sl], boot[i], sizes[i],
                                       None if actions is None else actions[sl],
                                       None if logprobs is None else logprobs[sl]))  # fmt: skip
        return replies

    def _reply(self, values: np.ndarray | None, bootstrap: np.ndarray | None, size: int,
               actions: np.ndarray | None, logprobs: np.ndarray | None) -> dict[str, Any]:  # fmt: skip
        reply = {"bootstrap_values": bootstrap, "version": np.full(size, self.version)}
        if values is not None:
            reply["values"] = values
        if actions is not None:
            reply["actions"] = actions
            reply["logprobs"] = logprobs
        return reply
