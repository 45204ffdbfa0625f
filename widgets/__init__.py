"""Notebook UI for rlinf-nb runs: ``dashboard(run)`` and its parts.

    import rlinf_nb as rl
    run = rl.launch("ppo_cartpole")
    dash = rl.dashboard(run)   # curves, controls, hyperparameters, step debugger, frames, cluster
    dash                       # display it; dash.close() stops its poller

Parts live in their own modules (curves, controls, intervention, hparams, debugger, media (camera
tiles), episode_viewer (the rollout scrubber), timeline_view (a run's spans: rl.timeline), visibility, cluster_view, poller, dashboard). Imports are lazy, so ``import rlinf_nb.widgets`` is cheap;
``CARTPOLE_WITH_FRAMES`` (the pygame-free CartPole, an env) lives in :mod:`rlinf_nb.envs.cartpole_sketch`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "dashboard": ".dashboard",
    "Dashboard": ".dashboard",
    "Curves": ".curves",
    "Controls": ".controls",
    "InterventionPanel": ".intervention",
    "HParamPanel": ".hparams",
    "StepDebugger": ".debugger",
    "RolloutTile": ".media",
    "EpisodeViewer": ".episode_viewer",
    "Visibility": ".visibility",
    "ClusterView": ".cluster_view",
    "timeline": ".timeline_view",
    "Poller": ".poller",
    "Pacer": ".poller",
    "CARTPOLE_WITH_FRAMES": "rlinf_nb.envs.cartpole_sketch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
