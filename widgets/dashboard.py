"""``rl.dashboard(run)``: curves, controls, hyperparameters, step debugger, frames, cluster view
(and, for robot runs, the intervention panel: take over, keyboard teleop, marks, e-stop).

The dashboard is a composed ipywidgets layout fed by one :class:`~.poller.Poller` (a daemon
thread): metrics and events by cursor (from 0, so a dashboard made after a kernel restart
shows the whole history), the status, the newest camera frames (one tile per env worker and
camera) and the last finished episode's frames (a scrubber), only while the page keeps up and
they are on screen, and the workers' health, only while the cluster tab is open. Nothing
it does blocks the kernel; ``dash.close()`` (or ``dash.stop()``, which keeps the widgets
on screen) ends the thread. The first run is the one the controls act on; further runs
(``dashboard([a, b])`` or ``dashboard(a, compare=[b])``) are overlaid on the curves.
"""

from __future__ import annotations

import html
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets

from .cluster_view import ClusterView
from .controls import FINAL_STATES, Actions, Controls
from .curves import Curves
from .debugger import StepDebugger
from .episode_viewer import EpisodeViewer
from .hparams import HParamPanel
from .intervention import InterventionPanel
from .media import RolloutTile
from .poller import Pacer, Poller, Task
from .visibility import Visibility

CLUSTER_TAB = 2  # index of the cluster view among the dashboard's tabs (health is polled only while open)

# The live dashboard of each (primary) run: a new one for the same run stops the old one's poller,
# so re-running a cell does not leave pollers behind.
_LIVE: weakref.WeakValueDictionary[str, Dashboard] = weakref.WeakValueDictionary()


def _as_run(run: Any) -> Any:
    if isinstance(run, str):
        from rlinf_nb.client import get_run

        return get_run(run)
    return run


class RunFeed:
    """Cursors into one run's metrics and events."""

    def __init__(self, run: Any):
        self.run = run
        self.metrics_cursor = 0
        self.events_cursor = 0
        self.offline = False  # read once from the run directory (no live controller)

    def pull(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """New (rows, events, reset): ``reset`` means the history was rewritten; start over."""
        if self.offline:
            return [], [], False
        if not self.run.live:
            self.offline = True
            rows = self.run.metrics().to_dict("records")
            events = self.run.events().to_dict("records")
            return rows, events, True
        rows, mcur = self.run.metrics_since(self.metrics_cursor)
        events, ecur = self.run.events_since(self.events_cursor)
        # a resumed controller (its logs are shorter than what we saw), or a learner restored from a
        # checkpoint in place: the rows after it were dropped, and the re-run may have outgrown our cursor
        reset = (mcur < self.metrics_cursor or ecur < self.events_cursor
                 or any(e.get("kind") == "recovery" and e.get("action") == "restored" for e in events))  # fmt: skip
        if reset:
            rows, mcur = self.run.metrics_since(0)
            events, ecur = self.run.events_since(0)
        self.metrics_cursor, self.events_cursor = mcur, ecur
        return rows, events, reset


class Dashboard(widgets.VBox):
    """The live view of one run (plus runs to compare). Make it with :func:`dashboard`."""

    def __init__(self, runs: Iterable[Any], *, metrics: list[str] | None = None, x: str = "env_steps",
                 smoothing: float = 0.0, plot_hz: float = 4.0, frame_hz: float = 10.0, status_hz: float = 2.0,
                 health_every: float = 5.0, episode_every: float = 3.0, frames: bool | None = None,
                 start: bool = True,
                 replace: bool = True) -> None:  # fmt: skip
        runs = [_as_run(r) for r in runs]
        if not runs:
            raise ValueError("dashboard() needs at least one run")
        self.runs = runs
        self.run = runs[0]
        self.feeds = {r.name: RunFeed(r) for r in runs}
        self.events: dict[str, list[dict[str, Any]]] = {r.name: [] for r in runs}
        self.last_status: dict[str, Any] | None = None
        self.errors: dict[str, str] = {}
        self._batch_wanted = threading.Event()
        self.actions = Actions()

        self.header = widgets.HTML(self._header_html())
        self.curves = Curves([r.name for r in runs], metrics=metrics, x=x, smoothing=smoothing)
        self.controls = Controls(self.run, self.actions, on_done=self._action_done)
        # take over, keyboard teleop, marks, e-stop: shown for robot runs only
        self.intervention = InterventionPanel.for_run(self.run, on_done=self._intervention_done)
        self.hparams = HParamPanel(self.run)
        self.debugger = StepDebugger(
            self.run, self.actions, on_done=self._action_done, request_batch=self.request_batch
        )
        if frames is None:
            frames = self._renders_frames()
        self.media = RolloutTile(enabled=frames)
        self.viewer = EpisodeViewer()
        self.visibility = Visibility()  # is the media column on screen? (frames are skipped while not)
        self.visibility.on_change(self._media_visibility)
        self.cluster = ClusterView()
        self.pacer = Pacer()
        self.pacer.on_hello(self._page_appeared)
        self.tabs = widgets.Tab(children=[self.hparams, self.debugger, self.cluster],
                                titles=("hyperparameters", "step debugger", "cluster"))  # fmt: skip
        self.tabs.observe(self._tab_selected, "selected_index")
        # column-reverse: the live tiles show on top, the episode viewer below them, while the live
        # tiles' images stay the last images of the dashboard in page order
        side = widgets.VBox([self.viewer, self.media, self.visibility],
                            layout=widgets.Layout(flex="1 1 0%", min_width="260px", flex_flow="column-reverse"))  # fmt: skip
        body = widgets.HBox([self.curves, side], layout=widgets.Layout(width="100%"))
        super().__init__([self.header, self.controls, self.intervention, body, self.tabs, self.pacer],
                         layout=widgets.Layout(width="100%"))  # fmt: skip

        tasks = [
            Task("data", self._pull_data, 1.0 / plot_hz),
            Task("plot", self.curves.render, 1.0 / plot_hz, paced=True),
            Task("status", self._pull_status, 1.0 / status_hz),
            Task("batch", self._pull_batch, 1.0 / status_hz),
            Task("health", self._pull_health, health_every),
        ]
        if frames:
            tasks.append(Task("frames", self._pull_frames, 1.0 / frame_hz, paced=True))
            tasks.append(Task("episode", self._pull_episode, episode_every, paced=True))
        self.poller = Poller(tasks, pacer=self.pacer, name=f"rlinf-nb-dashboard-{self.run.name}",
                             on_error=self._task_failed)  # fmt: skip
        if self.comm is not None:
            self.comm.on_close(lambda _msg: self.stop())  # the page closed the widget
        if replace:
            old = _LIVE.get(self.run.name)
            if old is not None and old is not self:
                old.stop(note="superseded by a newer dashboard of this run")
            _LIVE[self.run.name] = self
        if start:
            self.poller.start()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """(Re)start the poller."""
        self.poller.start()

    def stop(self, note: str | None = None) -> None:
        """Stop updating (the widgets stay on screen, frozen)."""
        self.poller.stop()
        if note:
            self.header.value = self._header_html(note)
        if _LIVE.get(self.run.name) is self:
            del _LIVE[self.run.name]

    def close(self) -> None:
        """Stop the poller and close every widget of the dashboard."""
        self.stop()
        self.actions.close()
        for part in (self.header, self.controls, self.intervention, self.curves, self.hparams, self.debugger, self.media,
                     self.viewer, self.visibility, self.cluster, self.pacer, *self.children, self.tabs):  # fmt: skip
            part.close()
        super().close()

    def poll_once(self, names: list[str] | None = None) -> None:
        """Run the poller's tasks once in this thread (tests, or a dashboard made with ``start=False``)."""
        self.poller.poll_once(names)

    def request_batch(self) -> None:
        self._batch_wanted.set()
        self.poller.request("batch")

    def overhead(self) -> dict[str, float]:
        """Seconds this dashboard's poller spent per task so far."""
        return self.poller.overhead()

    # ------------------------------------------------------------------ tasks

    def _renders_frames(self) -> bool:
        try:
            return bool(self.run.config()["env"].get("render_every"))
        except Exception:  # noqa: BLE001 - no config: no frames
            return False

    def _pull_data(self) -> bool:
        for name, feed in self.feeds.items():
            rows, events, reset = feed.pull()
            if reset:
                self.curves.reset(name)
                self.events[name] = []
            self.events[name].extend(events)
            self.curves.add(name, rows, events)
            if name == self.run.name and events:
                self.hparams.sync(events)
        return False

    def _pull_status(self) -> bool:
        try:
            st = self.run.status()
        except Exception as exc:  # noqa: BLE001 - the controller is gone or restarting
            self.controls.update(self.last_status, error=f"{type(exc).__name__}: {exc}")
            raise
        if st.get("state") in FINAL_STATES and (self.last_status or {}).get("state") in FINAL_STATES:
            self._go_quiet()
        self.last_status = st
        self.controls.update(st)
        self.intervention.update(st)
        self.debugger.update(st)
        if self.debugger.wants_batch(st):
            self._batch_wanted.set()
        self.header.value = self._header_html()
        return False

    def _go_quiet(self) -> None:
        """The run has ended: pull its last rows, then stop asking its controller (so it can exit)."""
        if self.poller.tasks.get("status") is not None and self.poller.tasks["status"].period == float("inf"):
            return
        self._pull_data()
        for name in ("data", "status", "batch", "health", "frames", "episode"):
            task = self.poller.tasks.get(name)
            if task is not None:
                task.period = float("inf")
                task.due = float("inf")

    def _pull_batch(self) -> bool:
        if not self._batch_wanted.is_set():
            return False
        self._batch_wanted.clear()
        if self.last_status and self.last_status.get("state") in FINAL_STATES:
            return False
        self.debugger.show_batch(self.run.batch().rows)
        return True

    def _pull_frames(self) -> bool:
        if not self.visibility.visible or self._ended():
            return False
        return self.media.update(self.run.latest_frames(self.media.since()))

    def _pull_episode(self) -> bool:
        if not self.visibility.visible or self._ended():
            return False
        return self.viewer.show(self.run.latest_episode(self.viewer.episode_id))

    def _ended(self) -> bool:
        return bool(self.last_status and self.last_status.get("state") in FINAL_STATES)

    def _media_visibility(self, visible: bool) -> None:
        if visible:  # back on screen: fresh frames now, not at the next period
            self.poller.request("frames", "episode")

    def _tab_selected(self, change: dict[str, Any]) -> None:
        if change["new"] == CLUSTER_TAB:
            self.poller.request("health")

    def _pull_health(self) -> bool:
        if self.tabs.selected_index != CLUSTER_TAB:
            return False  # nobody looks at the cluster view: do not ask every worker
        if self.last_status and self.last_status.get("state") in FINAL_STATES:
            self.cluster.show_error(f"run {self.last_status['state']}: its workers are released")
            return False
        self.cluster.update(self.run.health())
        return False

    def _page_appeared(self) -> None:
        self.curves.request_resync()
        self.poller.request("plot", "status")

    def _action_done(self, name: str, result: Any) -> None:
        if name.startswith("step"):
            self._batch_wanted.set()
        self.poller.request("status", "data", "batch")

    def _intervention_done(self, name: str, result: Any) -> None:
        if name != "human action":  # key actions are many; their effect shows at the next status
            self.poller.request("status", "data")

    def _task_failed(self, task: Task, text: str) -> None:
        self.errors[task.name] = text.strip().splitlines()[-1]
        self.header.value = self._header_html()

    def _header_html(self, note: str | None = None) -> str:
        names = [r.name for r in self.runs]
        title = f"<b>{html.escape(names[0])}</b>"
        if len(names) > 1:
            title += (
                " vs "
                + ", ".join(html.escape(n) for n in names[1:])
                + " <small>(controls act on the first)</small>"
            )
        bits = [title]
        pacer = getattr(self, "pacer", None)
        if pacer is not None and pacer.mode() == "throttled":
            bits.append("<small style='color:#7f7f7f'>the page lags behind: updates throttled</small>")
        if self.errors:
            err = "; ".join(f"{k}: {v}" for k, v in self.errors.items())
            bits.append(f"<small style='color:#d62728'>{html.escape(err[:300])}</small>")
        if note:
            bits.append(f"<small><i>{html.escape(note)}</i></small>")
        return " · ".join(bits)


def dashboard(run: Any, compare: Iterable[Any] | None = None, **kwargs: Any) -> Dashboard:
    """The live dashboard of ``run`` (a Run, a run name, or a list of runs to overlay).

    Args:
        run: the run the controls act on; a list overlays several runs (the first is controlled).
        compare: more runs whose curves are overlaid.
        metrics: metric columns to plot first (default ``["episode_return_mean"]``).
        x: ``"env_steps"`` (default), ``"step"`` or ``"wall_time"``.
        smoothing: EMA weight in [0, 1).
        plot_hz, frame_hz: update rates (at most; the page's pace decides below them).
        health_every: seconds between cluster health polls (only while the cluster tab is open).
        episode_every: seconds between looks for a newly finished episode (the rollout viewer).
        frames: show the camera tiles and the rollout viewer (default: when the run has ``env.render_every``).
        start: start the poller now (False: call ``poll_once()`` yourself).

    Returns:
        a :class:`Dashboard` widget; ``dash.close()`` stops it.
    """
    runs = list(run) if isinstance(run, list | tuple) else [run]
    runs += list(compare or [])
    return Dashboard(runs, **kwargs)


__all__ = ["Dashboard", "RunFeed", "dashboard"]
