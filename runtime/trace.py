"""A run's timeline: what each of its processes did and when, as a Chrome trace.

Every worker keeps its newest calls (a rollout, an update, a weight sync) in a bounded in-memory
:class:`SpanLog`; the controller keeps its stages and its setup. ``run.trace()`` gathers them and
:func:`chrome_trace` lays them out in the Trace Event Format that Perfetto (https://ui.perfetto.dev)
and ``chrome://tracing`` open: one row per process, one box per span. It shows, for example, that an
async off-policy run collects while its learner updates, and that an on-policy run does not.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

MAX_SPANS = 20_000
"""Spans a log keeps (the newest); ~100 bytes each."""


class SpanLog:
    """The newest ``maxlen`` spans of one process: ``{"name", "start_ns", "dur_ns", "ok", **args}``.

    Times are wall-clock nanoseconds (``time.time_ns``), so the spans of processes on one machine (or on
    clock-synchronised nodes) line up. Safe to record from one thread while another reads.
    """

    def __init__(self, maxlen: int = MAX_SPANS):
        self._spans: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def record(self, name: str, start_ns: int, dur_ns: int, ok: bool = True, **args: Any) -> None:
        span = {"name": name, "start_ns": int(start_ns), "dur_ns": max(0, int(dur_ns)), "ok": ok, **args}
        with self._lock:
            self._spans.append(span)

    @contextlib.contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        """Record the ``with`` block as a span (``ok=False`` when it raised)."""
        start = time.time_ns()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.record(name, start, time.time_ns() - start, ok, **args)

    def since(self, start_ns: int = 0) -> list[dict[str, Any]]:
        """The kept spans that started at or after ``start_ns``, oldest first."""
        with self._lock:
            return [s for s in self._spans if s["start_ns"] >= start_ns]


def chrome_trace(processes: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Trace Event Format for ``[(process label, its spans), ...]``: one process row per entry.

    A span becomes a complete event (``"ph": "X"``, microseconds) named after it, whose ``args`` carry the
    span's extra fields; a failed span is marked ``"ok": false`` and coloured red.
    """
    events: list[dict[str, Any]] = []
    for pid, (label, spans) in enumerate(processes, start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        )
        for span in spans:
            args = {k: v for k, v in span.items() if k not in ("name", "start_ns", "dur_ns")}
            event = {"name": span["name"], "cat": label.split(" ")[0], "ph": "X", "pid": pid, "tid": 0,
                     "ts": span["start_ns"] / 1000.0, "dur": span["dur_ns"] / 1000.0, "args": args}  # fmt: skip
            if not span.get("ok", True):
                event["cname"] = "terrible"  # the trace viewers' red
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


__all__ = ["MAX_SPANS", "SpanLog", "chrome_trace"]
