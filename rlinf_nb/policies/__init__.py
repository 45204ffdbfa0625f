"""Policies: actor-critic networks, action heads and a name registry."""

from rlinf_nb.policies.mlp import ActorCritic, MLPPolicyConfig
from rlinf_nb.policies.registry import make_policy, register_policy, registered_policies

__all__ = ["ActorCritic", "MLPPolicyConfig", "make_policy", "register_policy", "registered_policies"]
