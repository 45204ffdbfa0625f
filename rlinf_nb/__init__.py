"""rlinf-nb: notebook-first reinforcement learning on a persistent Ray cluster.

    import rlinf_nb as rl
    rl.attach()
    run = rl.launch("ppo_cartpole")
    rl.dashboard(run)

Heavy modules (ray, torch) load on first use, so ``import rlinf_nb`` is fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "attach": "rlinf_nb.connection",
    "detach": "rlinf_nb.connection",
    "cluster_info": "rlinf_nb.connection",
    "ClusterError": "rlinf_nb.runtime.cluster",
    "ConfigError": "rlinf_nb.config",
    "launch": "rlinf_nb.client",
    "get_run": "rlinf_nb.client",
    "list_runs": "rlinf_nb.client",
    "Run": "rlinf_nb.client",
    "dashboard": "rlinf_nb.widgets",
    "timeline": "rlinf_nb.widgets",
    "make_env": "rlinf_nb.envs",
}
# public name -> module that *is* the export
_MODULES = {"recipes": "rlinf_nb.recipes", "codec": "rlinf_nb.codec"}

__all__ = sorted(_EXPORTS) + sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'rlinf_nb' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
