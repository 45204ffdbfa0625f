"""Policy inference for env workers: one class, used by rollout workers and colocated env workers.

A :class:`PolicyServer` holds a policy with versioned weights and answers observation messages
(``{"obs", "sender", "final_obs", "final_mask", "value_only"}``, see :mod:`.workers`) with actions,
log-probs, values, bootstrap values and the weight version that produced them. A message with
``"random": True`` (off-policy warm-up, ``algo.random_steps``) gets uniform random actions instead.

Rollout workers run one for the env workers they serve. With ``placement.env_to_rollout: colocated``
each env worker runs its own, so a step costs no actor call at all; weights then arrive while a
rollout may be running (async off-policy), so :meth:`PolicyServer.offer_weights` only parks them and
:meth:`PolicyServer.answer` loads the newest parked weights before the next decision.
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_nb import tree

from .compression import ObsDecoder


class PolicyServer:
    """A policy with versioned weights answering observation messages."""

    def __init__(self, policy_cfg: dict[str, Any], obs_space: Any, action_space: Any, torch_seed: int):
        import torch

        from rlinf_nb.policies import make_policy
        from rlinf_nb.run_config import policy_kwargs

        torch.manual_seed(torch_seed)
        self.action_space = action_space
        self.random_actions = np.random.default_rng(torch_seed)  # messages with "random": uniform actions
        self.policy = make_policy(policy_cfg["name"], obs_space, action_space, **policy_kwargs(policy_cfg))
        self.policy.eval()
        self.version = -1
        self.obs_decoder = ObsDecoder()  # compressed observations (compression.obs), per env worker stream
        self._parked: tuple[dict[str, np.ndarray], int] | None = None
        self._lock = threading.Lock()

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> int:
        """Load ``weights`` now (the caller owns the policy's thread)."""
        import torch

        self.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
        self.version = version
        return version

    def offer_weights(self, weights: dict[str, np.ndarray], version: int) -> int:
        """Park ``weights`` for the next decision (safe from another thread); a newer offer replaces them."""
        with self._lock:
            if self._parked is None or version >= self._parked[1]:
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
        import torch

        self.load_parked()
        # obs: an array or a dict of arrays per message, [n_i, ...] per leaf; dtypes kept (uint8 images)
        msgs = [{**m, "obs": self.obs_decoder.decode(m["obs"], m.get("sender"))} for m in msgs]
        sizes = [tree.batch_size(m["obs"]) for m in msgs]
        obs = tree.map(torch.as_tensor, tree.concatenate([m["obs"] for m in msgs]))
        with torch.no_grad():
            if msgs[0]["value_only"]:
                actions = logprobs = None
                values = self.policy.value(obs)
            elif msgs[0].get("random"):  # off-policy warm-up (algo.random_steps): not the policy's actions
                actions = torch.as_tensor(self.uniform_actions(sum(sizes)))
                logprobs = torch.zeros(sum(sizes))
                values = self.policy.value(obs)
            else:
                actions, logprobs, values = self.policy.act(obs)
            boot = [None] * len(msgs)
            for i, m in enumerate(msgs):
                if m["final_obs"] is not None:
                    boot[i] = self.policy.value(tree.map(torch.as_tensor, m["final_obs"])).numpy()
        offsets = np.cumsum([0, *sizes])
        replies = []
        for i in range(len(msgs)):
            sl = slice(offsets[i], offsets[i + 1])
            reply = {
                "values": values[sl].numpy(),
                "bootstrap_values": boot[i],
                "version": np.full(sizes[i], self.version),
            }
            if actions is not None:
                reply["actions"] = actions[sl].numpy()
                reply["logprobs"] = logprobs[sl].numpy()
            replies.append(reply)
        return replies
