"""Starting a learner from another run's policy (``algo.init_from``): SFT first, then RL on top of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinf_nb.config import ConfigError

if TYPE_CHECKING:  # the controller imports this module and must not import torch for it
    import torch
    from torch import Tensor

INIT_FROM_DOC = "start the policy from this run's newest complete checkpoint (a run name or a run directory)"


def newest_checkpoint_of_run(run: str) -> tuple[Any, Any]:
    """``(RunDir, CheckpointInfo)`` of ``run``'s newest complete checkpoint; a config error (``algo.init_from``) if none.

    :meth:`StartsFromRun.check_at_launch` calls it in the client when a new run is launched, so a wrong
    ``init_from`` fails before anything starts on the cluster.
    """
    from rlinf_nb.runtime.rundir import RunDir

    path = Path(run).expanduser()
    run_dir = RunDir(path.name, root=path.parent) if path.is_dir() else RunDir(run)
    info = run_dir.latest_checkpoint()
    if info is None:
        found = "no such run" if not run_dir.path.exists() else "none complete"
        raise ConfigError(
            "algo.init_from",
            run,
            f"a run (name or directory) with a complete checkpoint ({found} in {run_dir.path})",
        )
    return run_dir, info


class StartsFromRun:
    """For algorithm config sections with an ``init_from`` field: the check a new run makes at launch.

    Only at launch: a resumed run restores its own checkpoint and a live change (``set_hparams``) keeps its
    policy, so neither needs the source run any more (it may have been deleted since).
    """

    init_from: str | None

    def check_at_launch(self) -> None:
        """A config error (``algo.init_from``) unless the source run has a complete checkpoint."""
        if self.init_from:
            newest_checkpoint_of_run(self.init_from)


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
