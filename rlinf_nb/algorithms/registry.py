"""Algorithms register their config class, their stages and their learner update.

An algorithm is data: an ordered list of named :class:`Stage` functions run by the
run controller (``rollout -> advantages -> update -> sync_weights`` for PPO), a typed
config class for its ``algo:`` section, and an ``update`` function the learner
worker calls. Register with :func:`register_algorithm`; look up with :func:`get_algorithm`.

An algorithm registered in a notebook cell runs on the cluster too: ``launch`` ships the
:class:`Algorithm` to the run's controller (cloudpickle pickles what a cell defines by value:
its config class, stage functions and learner class), which installs it in its own process
with :func:`install_algorithm` and hands it to the learner worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_REGISTRY: dict[str, Algorithm] = {}


@dataclass(frozen=True)
class Stage:
    """One named step of an algorithm's loop: ``fn(ctx) -> summary dict | None``."""

    name: str
    fn: Callable[[Any], dict[str, Any] | None]
    doc: str = ""


@dataclass(frozen=True)
class Algorithm:
    """What the runtime needs to run an algorithm."""

    name: str
    config_cls: type
    stages: tuple[Stage, ...]
    make_learner: Callable[..., Any]  # (policy, cfg) -> learner with .update(batch, cfg) and .state_dict()
    doc: str = ""
    # Runs policies with action chunks (policy.chunk > 1): its batches hold one transition per decision
    # (rlinf_nb.algorithms.chunks). Off: the run config refuses policy.chunk > 1.
    action_chunks: bool = False
    # Modules the learner imports on its first update: the learner worker imports them while the env
    # workers start. torch.optim's optimizers import torch._dynamo (a second or more on a small CPU);
    # a learner on rlinf_nb.algorithms.adam.FusedAdam does not, and leaves this empty.
    learner_imports: tuple[str, ...] = ("torch._dynamo",)

    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]


def register_algorithm(algo: Algorithm) -> Algorithm:
    _REGISTRY[algo.name] = algo
    return algo


def install_algorithm(algo: Algorithm) -> Algorithm:
    """Make ``algo`` the one registered under its name here, after the built-in ones (so a shipped
    algorithm that reuses a built-in name is not replaced when the built-ins load)."""
    _load_builtin()
    _REGISTRY[algo.name] = algo
    return algo


def registered_algorithms() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; ``KeyError`` lists the known ones."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def _load_builtin() -> None:
    from rlinf_nb.algorithms import bc, grpo, hgdagger, ppo, sac  # noqa: F401 - each registers itself
