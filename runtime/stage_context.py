"""What a stage function sees: :class:`StageContext` (see :mod:`rlinf_nb.algorithms.stages`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_nb import tree

if TYPE_CHECKING:
    from rlinf_nb.run_config import RunConfig

    from .controller import RunControllerImpl


def summarize_batch(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """Key, shape, dtype and simple statistics of every array in a batch (dict obs: ``obs/<key>`` rows)."""
    rows = []
    for key, arr in tree.items(batch):
        arr = np.asarray(arr)
        row: dict[str, Any] = {"key": key, "shape": tuple(arr.shape), "dtype": str(arr.dtype)}
        if arr.size and np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
            a = arr.astype(np.float64)
            row.update(mean=float(a.mean()), std=float(a.std()), min=float(a.min()), max=float(a.max()))
        rows.append(row)
    return rows


class StageContext:
    """What a stage function sees (see :mod:`rlinf_nb.algorithms.stages`)."""

    def __init__(self, controller: RunControllerImpl):
        self._c = controller
        self.batch: dict[str, Any] = {}
        self.state: dict[str, Any] = {}  # what stages keep between calls (counters, schedules)

    @property
    def cfg(self) -> RunConfig:
        return self._c.cfg

    @property
    def hp(self) -> Any:
        return self._c.cfg.algo

    @property
    def progress(self) -> float:
        return min(1.0, self._c.env_steps / max(1, self._c.cfg.budget.total_env_steps))

    def collect_rollout(
        self, steps: int, reset_seeds: list[int] | None = None, acting: str = "sample"
    ) -> dict[str, Any]:
        """``steps`` env steps per env; ``reset_seeds`` (one per env over all env workers, in rank
        order) first resets every env with its seed (GRPO's groups); ``acting``: ``sample`` from the
        policy, or its ``mode`` (evaluation)."""
        return self._c.collect_rollout(steps, reset_seeds, acting)

    @property
    def env_steps(self) -> int:
        return self._c.env_steps

    @property
    def update_step(self) -> int:
        return self._c.update_step

    def collect_async(self, steps: int, block: bool = False) -> dict[str, Any]:
        return self._c.collect_async(steps, block)

    def learner_update(self, keys: list[str]) -> dict[str, Any]:
        return self._c.learner_update(keys)

    def sync_weights(self) -> dict[str, Any]:
        return self._c.sync_weights()
