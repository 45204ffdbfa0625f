"""One background poller per dashboard, and the ping/pong pacer that paces it.

The poller is a daemon thread with a stop event. It runs named *tasks* at their own
periods (metrics and status a few times a second, frames at most ~10 Hz, cluster health
every few seconds); a task marked ``paced`` sends heavy comm messages (plot data, frames)
and runs only while the :class:`Pacer` says the page keeps up. Every task can also be
run synchronously (:meth:`Poller.poll_once`), which is what the tests do.

Pacing (see shared RECIPES.md): after a tick that sent updates the kernel sends a ping;
the page's JS answers with a pong. While more than ``max_outstanding`` pings are
unanswered, heavy updates are skipped, except one every ``idle_interval`` seconds, so a
slow or missing page (closed tab, nothing displayed) never makes messages pile up. Pongs
are read only while the kernel is idle: while a cell blocks (``run.wait()``) the pacer
cannot hear the page and falls back to a modest time-based rate (``blind_interval``),
for at most ``blind_limit`` seconds since it last heard from the page.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anywidget


class _CellTracker:
    """Whether a cell is executing in this kernel (IPython ``pre/post_run_cell`` events)."""

    running = False
    started = 0.0
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - IPython ships with ipykernel
            return
        ip = get_ipython()
        if ip is None:
            return
        ip.events.register("pre_run_cell", cls._pre)
        ip.events.register("post_run_cell", cls._post)
        cls.installed = True
        cls.running = True  # installed from inside a cell
        cls.started = time.monotonic()

    @classmethod
    def _pre(cls, info: Any = None) -> None:
        cls.running = True
        cls.started = time.monotonic()

    @classmethod
    def _post(cls, result: Any = None) -> None:
        cls.running = False


class Pacer(anywidget.AnyWidget):
    """Ping/pong backpressure between this kernel and the page (an invisible widget)."""

    _esm = (Path(__file__).parent / "pacer.js").read_text()

    def __init__(self, max_outstanding: int = 2, idle_interval: float = 3.0, blind_interval: float = 0.5,
                 blind_limit: float = 600.0, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.max_outstanding = max_outstanding
        self.idle_interval = idle_interval
        self.blind_interval = blind_interval
        self.blind_limit = blind_limit
        self._lock = threading.Lock()
        self.sent = 0
        self.acked = 0
        self.last_ping = 0.0
        self.last_pong: float | None = None
        self.views = 0  # views that said hello (a page rendered this widget)
        self._hello_callbacks: list[Callable[[], None]] = []
        self.on_msg(self._on_msg)
        _CellTracker.install()

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and "pong" in content:
            with self._lock:
                self.acked = max(self.acked, min(int(content["pong"]), self.sent))
                self.last_pong = time.monotonic()
            if content.get("hello"):
                self.views += 1
                for callback in list(self._hello_callbacks):
                    callback()

    def on_hello(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever a page renders the dashboard (a new view, or a reload)."""
        self._hello_callbacks.append(callback)

    @property
    def outstanding(self) -> int:
        return self.sent - self.acked

    def ping(self) -> None:
        """Call after a tick that sent updates."""
        with self._lock:
            self.sent += 1
            n = self.sent
            self.last_ping = time.monotonic()
        self.send({"ping": n})

    def ready(self) -> bool:
        """May heavy updates go out now?"""
        now = time.monotonic()
        with self._lock:
            if self.sent - self.acked <= self.max_outstanding:
                return True
            since = now - self.last_ping
            if _CellTracker.running:
                heard = max(self.last_pong or 0.0, _CellTracker.started)
                if now - heard < self.blind_limit:
                    return since >= self.blind_interval
            return since >= self.idle_interval

    def mode(self) -> str:
        """``live`` (page keeps up), ``blind`` (a cell blocks) or ``throttled``: for the header."""
        if self.sent - self.acked <= self.max_outstanding:
            return "live"
        return "blind" if _CellTracker.running else "throttled"


@dataclass
class Task:
    """A named job of the poller: ``fn()`` every ``period`` seconds (``paced``: only when the page keeps up).

    ``fn`` returns True when it sent something to the page (so the pacer pings).
    """

    name: str
    fn: Callable[[], bool | None]
    period: float
    paced: bool = False
    due: float = 0.0
    runs: int = 0
    errors: int = 0
    last_error: str | None = None
    seconds: float = 0.0  # wall time spent in fn (waits on the controller included), for accounting
    cpu_seconds: float = 0.0  # CPU time of the poller thread spent in fn (what competes with the run)
    requested: bool = field(default=False)


class Poller:
    """Runs :class:`Task` s in one daemon thread until :meth:`stop`."""

    def __init__(self, tasks: list[Task], pacer: Pacer | None = None, tick: float = 0.05,
                 name: str = "rlinf-nb-dashboard", on_error: Callable[[Task, str], None] | None = None) -> None:  # fmt: skip
        self.tasks = {t.name: t for t in tasks}
        self.pacer = pacer
        self.tick = tick
        self.name = name
        self.on_error = on_error
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one task runner at a time (thread or poll_once)
        self._thread: threading.Thread | None = None
        self.skipped = 0  # paced runs skipped because the page lagged

    # ------------------------------------------------------------------ control

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def request(self, *names: str) -> None:
        """Run these tasks at the next tick, whatever their period (thread-safe)."""
        for name in names:
            if name in self.tasks:
                self.tasks[name].requested = True
        self._wake.set()

    def poll_once(self, names: list[str] | None = None) -> None:
        """Run every task (or ``names``) now, in this thread, ignoring periods and pacing."""
        with self._lock:
            for task in list(self.tasks.values()):
                if names is None or task.name in names:
                    self._run(task)

    # ------------------------------------------------------------------ the loop

    def _run(self, task: Task) -> bool:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            sent = bool(task.fn())
            task.last_error = None
        except Exception:  # noqa: BLE001 - the poller must survive anything a task does
            sent = False
            task.errors += 1
            task.last_error = traceback.format_exc(limit=4)
            if self.on_error is not None:
                try:
                    self.on_error(task, task.last_error)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            task.seconds += time.perf_counter() - t0
            task.cpu_seconds += time.thread_time() - c0
            task.runs += 1
        return sent

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            sent = False
            with self._lock:
                page_ok = self.pacer is None or self.pacer.ready()
                for task in list(self.tasks.values()):
                    if self._stop.is_set():
                        break
                    if not (task.requested or now >= task.due):
                        continue
                    if task.paced and not page_ok and not task.requested:
                        self.skipped += 1
                        continue
                    task.requested = False
                    # A task that keeps failing (say, the controller is gone) backs off.
                    task.due = now + task.period * (1 + min(task.errors, 20))
                    sent = self._run(task) or sent
                    if task.last_error is None:
                        task.errors = 0
            if sent and self.pacer is not None:
                try:
                    self.pacer.ping()
                except Exception:  # noqa: BLE001 - a closed widget: the dashboard is going away
                    pass
            self._wake.wait(self.tick)
            self._wake.clear()

    def overhead(self) -> dict[str, float]:
        """Wall seconds spent per task so far (kernel-side cost of the dashboard, waits included)."""
        return {name: round(t.seconds, 4) for name, t in self.tasks.items()}

    def cpu_overhead(self) -> dict[str, float]:
        """CPU seconds of the poller thread per task so far (``time.thread_time``: no waits)."""
        return {name: round(t.cpu_seconds, 4) for name, t in self.tasks.items()}


__all__ = ["Pacer", "Poller", "Task"]
