"""Starting a learner from another run's policy (``algo.init_from``): SFT first, then RL on top of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlinf_nb.config import ConfigError

INIT_FROM_DOC = "start the policy from this run's newest complete checkpoint (a run name or a run directory)"


def newest_checkpoint_of_run(run: str, key: str = "algo.init_from") -> tuple[Any, Any]:
    """``(RunDir, CheckpointInfo)`` of ``run``'s newest complete checkpoint; a config error (on ``key``) if none.

    Config sections call it from ``validate`` (``key="init_from"``, relative to the section) so a launch
    with a wrong ``init_from`` fails in the client, before anything starts on the cluster.
    """
    from rlinf_nb.runtime.rundir import RunDir

    path = Path(run).expanduser()
    run_dir = RunDir(path.name, root=path.parent) if path.is_dir() else RunDir(run)
    info = run_dir.latest_checkpoint()
    if info is None:
        found = "no such run" if not run_dir.path.exists() else "none complete"
        raise ConfigError(
            key, run, f"a run (name or directory) with a complete checkpoint ({found} in {run_dir.path})"
        )
    return run_dir, info


def policy_weights_of_run(run: str) -> dict[str, Tensor]:
    """The plain policy weights in the newest complete checkpoint of ``run`` (a name or a directory).

    Plain: LoRA adapters folded in (a BC run's ``plain_policy``), so any algorithm can load them.
    """
    run_dir, info = newest_checkpoint_of_run(run)
    learner = run_dir.load_checkpoint(info)["learner"]
    return learner["learner"].get("plain_policy") or learner["policy"]


def load_policy_from_run(policy: torch.nn.Module, run: str) -> None:
    """Load ``run``'s policy weights into ``policy``; a different architecture is a config error."""
    try:
        policy.load_state_dict(policy_weights_of_run(run))
    except RuntimeError as exc:  # torch: missing / unexpected keys, size mismatches
        raise ConfigError(
            "algo.init_from", run, f"a run whose policy has this run's architecture ({exc})"
        ) from None
