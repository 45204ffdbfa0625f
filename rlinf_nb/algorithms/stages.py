"""Stages shared by several algorithms; they call the controller's context API.

The context (``ctx``) the controller hands every stage offers: ``ctx.cfg`` (the run
config with live values applied), ``ctx.hp`` (its ``algo`` section), ``ctx.batch``
(a dict of numpy arrays, [T, N, ...]), ``ctx.progress`` (fraction of the budget
used), ``ctx.collect_rollout(steps)``, ``ctx.learner_update(keys)`` and
``ctx.sync_weights()``. Stages never touch Ray directly.
"""

from __future__ import annotations

from typing import Any


def rollout_stage(ctx: Any) -> dict[str, Any]:
    """Step every env worker ``rollout_steps`` times; the trajectories become ``ctx.batch``."""
    return ctx.collect_rollout(ctx.hp.rollout_steps)


def sync_weights_stage(ctx: Any) -> dict[str, Any]:
    """Push the learner's weights (versioned) to every rollout worker."""
    return ctx.sync_weights()
