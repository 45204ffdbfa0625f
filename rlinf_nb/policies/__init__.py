"""Policies: actor-critic networks, action heads and a name registry.

Registered: ``"mlp"`` (:class:`ActorCritic`, flat observations) and ``"cnn"``
(:class:`CNNActorCritic`, images + state dict observations). Both take ``action_head``
(``auto``, ``categorical``, ``gaussian``, ``squashed_gaussian``) and ``chunk``.
"""

from rlinf_nb.policies.base import ActorCriticAPI
from rlinf_nb.policies.cnn import CNNActorCritic, CNNPolicyConfig
from rlinf_nb.policies.mlp import ActorCritic, MLPPolicyConfig
from rlinf_nb.policies.registry import make_policy, register_policy, registered_policies

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
