"""Policies: actor-critic networks, action heads and a name registry.

Registered: ``"mlp"`` (:class:`ActorCritic`, flat observations) and ``"cnn"``
(:class:`CNNActorCritic`, images + state dict observations). Both take ``action_head``
(``auto``, ``categorical``, ``gaussian``, ``squashed_gaussian``) and ``chunk``.

The names below load on first use, so ``import rlinf_nb.policies.spec`` (configs) and
``rlinf_nb.policies.numpy_mlp`` (acting without torch) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ActorCritic",
    "ActorCriticAPI",
    "CNNActorCritic",
    "CNNPolicyConfig",
    "MLPPolicyConfig",
    "make_policy",
    "register_policy",
    "registered_policies",
]

_HOME = {
    "ActorCritic": "mlp",
    "ActorCriticAPI": "base",
    "CNNActorCritic": "cnn",
    "CNNPolicyConfig": "cnn",
    "MLPPolicyConfig": "spec",
    "make_policy": "registry",
    "register_policy": "registry",
    "registered_policies": "registry",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
