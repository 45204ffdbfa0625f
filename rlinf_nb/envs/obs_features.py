"""Observation features: named numpy functions of a task's state vector, computed inside the env.

``make_env("maniskill:PegInsertionSide-v1", obs_features="peg_insertion")`` gives observations
``[features, state]``: the registered features of each state, then the state itself. Computing them in
the env (numpy, per step) means every consumer sees the same observation: rollout workers and the
numpy policy copy need nothing new, recorded datasets hold what the policy reads, and the observation
space grows by the features' width.

Scripted experts still need the plain state: the env's ``raw_state(obs)`` cuts it back out of a
featured observation (its last ``state_dim`` values).

Register a new set with::

    @register_obs_features("my_task", state_dim=35)
    def my_task_features(state: np.ndarray) -> np.ndarray:  # [N, 35] -> float32 [N, F]
        ...

in a notebook cell too: ``rl.launch`` ships the named set to the run's workers
(:func:`shippable_obs_features`, cloudpickled as algorithms are), which install it before they
build their envs (:func:`install_obs_features`). Recorded ``scripted:<n>`` datasets are cached under
the set's name, not its code: a changed function needs a new name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ObsFeatures",
    "get_obs_features",
    "install_obs_features",
    "obs_feature_names",
    "register_obs_features",
    "shippable_obs_features",
]


@dataclass(frozen=True)
class ObsFeatures:
    """One registered feature set."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]  # state [N, state_dim] -> features float32 [N, F]
    state_dim: int  # the state width it reads (a task's flat state vector)
    doc: str

    def __call__(self, state: np.ndarray) -> np.ndarray:
        """``[features, state]`` ``float32 [N, F + state_dim]`` for ``state [N, state_dim]``."""
        state = np.asarray(state, np.float32)
        if state.ndim != 2 or state.shape[1] != self.state_dim:
            raise ValueError(
                f"obs_features {self.name!r} reads a state of {self.state_dim} values per env, got an "
                f"observation of shape {state.shape}"
            )
        return np.concatenate([self.fn(state), state], axis=1)


_REGISTRY: dict[str, ObsFeatures] = {}
# feature sets shipped with the package register when their module is imported (on first use)
_BUILTIN_MODULES = ("rlinf_nb.envs.peg_insertion",)


def register_obs_features(name: str, state_dim: int) -> Callable:
    """Decorator: register ``fn(state [N, state_dim]) -> float32 [N, F]`` as the feature set ``name``."""

    def decorator(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        _REGISTRY[name] = ObsFeatures(name, fn, state_dim, (fn.__doc__ or "").strip())
        return fn

    return decorator


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def obs_feature_names() -> list[str]:
    """The registered feature sets."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_obs_features(name: str) -> ObsFeatures:
    """The feature set ``name``; ``ValueError`` listing the registered ones for an unknown name."""
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"obs_features: got {name!r}; allowed values: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def shippable_obs_features(name: str) -> bytes:
    """The registered feature set ``name``, cloudpickled for a run's workers (a set defined in a notebook
    cell is pickled by value); ``ValueError`` names the registered ones for an unknown name."""
    from rlinf_nb.shipping import ship

    return ship(get_obs_features(name), f"obs_features {name!r}", "its function and what it refers to")


def install_obs_features(shipped: bytes | None) -> None:
    """Register a feature set shipped by :func:`shippable_obs_features` in this process (None: nothing)."""
    if shipped is None:
        return
    import cloudpickle

    _load_builtins()
    features: ObsFeatures = cloudpickle.loads(shipped)
    _REGISTRY[features.name] = features
