"""Packaged recipes: named, runnable run configs (``rl.launch("ppo_cartpole")``)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from rlinf_nb.config import ConfigError


def names() -> list[str]:
    """The packaged recipe names."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".yaml"))  # fmt: skip


def load(name: str) -> dict[str, Any]:
    """The recipe ``name`` as a plain dict (a fresh copy each call)."""
    if name not in names():
        raise ConfigError("recipe", name, f"allowed values: {', '.join(names())}")
    return yaml.safe_load(resources.files(__name__).joinpath(f"{name}.yaml").read_text())
