"""A name -> policy-factory registry, so configs can say ``policy: mlp``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import gymnasium as gym

if TYPE_CHECKING:  # torch loads with the built-in policies, on first use (see _load_builtins)
    from torch import nn

__all__ = ["make_policy", "register_policy", "registered_policies"]

F = TypeVar("F", bound=Callable[..., "nn.Module"])

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}
_BUILTIN_MODULES = ("rlinf_nb.policies.mlp", "rlinf_nb.policies.cnn")  # they register on import


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def register_policy(name: str) -> Callable[[F], F]:
    """Decorator: register a policy class (or factory) under ``name``.

    The factory is called as ``factory(obs_space, action_space, **kwargs)``. Registering a
    different object under a taken name raises ``ValueError``; re-registering the same
    object (a module reload) is allowed.
    """

    def decorator(factory: F) -> F:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not factory and _qualname(existing) != _qualname(factory):
            raise ValueError(f"policy {name!r} is already registered to {_qualname(existing)}")
        _REGISTRY[name] = factory
        return factory

    return decorator


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def registered_policies() -> list[str]:
    """The registered policy names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def make_policy(name: str, obs_space: gym.Space, action_space: gym.Space, **kwargs: Any) -> nn.Module:
    """Build the policy registered as ``name`` for these spaces.

    ``kwargs`` go to the factory (for ``"mlp"``: a ``config=MLPPolicyConfig(...)`` and/or
    field overrides such as ``hidden_sizes=(256, 256)``).

    Raises:
        ValueError: ``name`` is not registered; the message lists the registered names.
    """
    _load_builtins()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(repr(n) for n in registered_policies()) or "(none)"
        raise ValueError(f"unknown policy {name!r}; registered policies: {known}") from None
    return factory(obs_space, action_space, **kwargs)
