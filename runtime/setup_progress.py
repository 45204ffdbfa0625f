"""Progress of a run's long setup work (recording demos), reported to its controller.

A learner worker that records ``scripted:<n>`` demos before the first iteration can take minutes (200
PegInsertionSide episodes: ~3 min on two cores). A :class:`SetupReporter` is the callback it gets:
``reporter(done, total)`` sends the count to the run's controller (at most ``min_interval_s`` apart,
and always the last one), whose ``status()["setup"]`` then reads ``{"task", "done", "total"}`` until
setup ends; ``Run.wait`` and the dashboard's status line show it.
"""

from __future__ import annotations

import time
from typing import Any


class SetupReporter:
    """``reporter(done, total)``: a picklable, throttled, fire-and-forget progress callback."""

    def __init__(self, controller: Any, task: str, min_interval_s: float = 0.5):
        self.controller = controller  # the RunController actor handle (anything with report_setup.remote)
        self.task = task
        self.min_interval_s = min_interval_s
        self._last_sent = float("-inf")

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last_sent < self.min_interval_s:
            return
        self._last_sent = now
        self.controller.report_setup.remote(self.task, int(done), int(total))

    def __reduce__(self):
        return (SetupReporter, (self.controller, self.task, self.min_interval_s))


def setup_text(status: dict[str, Any]) -> str | None:
    """``"recording dataset (scripted:200) 37/200"`` while a run's setup reports progress, else None."""
    setup = status.get("setup")
    if not setup:
        return None
    return f"{setup['task']} {setup['done']}/{setup['total']}"
