"""Learning curves: a plotly FigureWidget of chosen metrics, events as markers, EMA smoothing.

Data arrives from the poller (:meth:`Curves.add`); the figure is redrawn by
:meth:`Curves.render` (called by the poller at <= 4 Hz, one ``batch_update`` per redraw,
numpy arrays so plotly sends them as binary buffers). UI changes (metric, x axis,
smoothing) only mark the figure dirty; the poller thread is the figure's one writer.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

DEFAULT_METRIC = "episode_return_mean"
X_AXES = (("env steps", "env_steps"), ("update step", "step"), ("wall time (s)", "wall_time"))
# Events drawn on the curves, with their marker symbol and colour.
EVENT_STYLE = {
    "hparams": ("diamond", "#d62728"),
    "pause": ("line-ns-open", "#7f7f7f"),
    "resume": ("triangle-right", "#2ca02c"),
    "override": ("star", "#9467bd"),
    "revert": ("star-open", "#9467bd"),
    "recovery": ("x", "#ff7f0e"),
    "stop_requested": ("square", "#000000"),
    "failed": ("x-thin-open", "#d62728"),
    "estop": ("octagon", "#d62728"),
    "clear_estop": ("octagon-open", "#2ca02c"),
}
_NOT_METRICS = {"wall_time"}
_COUNTERS = {"step", "env_steps", "episodes"}
_DASHES = ("solid", "dot", "dash", "dashdot", "longdash")
# How long after the figure is made (or its traces change) every redraw also resends the full state.
RESYNC_SECONDS = 30.0


def ema(y: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard-style ``weight`` in [0, 1)); NaNs stay NaN."""
    if weight <= 0 or len(y) == 0:
        return y
    s = (
        pd.Series(y)
        .ewm(alpha=1.0 - weight, adjust=True, ignore_na=True)
        .mean()
        .to_numpy(dtype=np.float64, copy=True)
    )
    s[np.isnan(y)] = np.nan
    return s


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def event_text(e: dict[str, Any]) -> str:
    """One event as hover text."""
    kind = e.get("kind", "?")
    lines = [f"<b>{kind}</b>"]
    if kind == "hparams":
        for path, ch in (e.get("changes") or {}).items():
            short = path.split(".")[-1]
            if isinstance(ch, dict):
                lines.append(f"{short}: {_fmt(ch.get('old'))} → {_fmt(ch.get('new'))}")
            else:
                lines.append(f"{short}: {_fmt(ch)}")
    elif kind in ("override", "revert"):
        fn = f" ← {e['fn']}" if e.get("fn") else ""
        lines.append(f"{e.get('stage', '?')}{fn}")
    elif kind == "recovery":
        lines.append(f"{e.get('group', '?')}: {e.get('action', '')}")
        if e.get("from_step") is not None:
            lines.append(f"back to the checkpoint of step {e['from_step']}")
        if e.get("detail"):
            lines.append(str(e["detail"])[:120])
    elif kind == "worker_failed":
        lines.append(str(e.get("detail", ""))[:120])
    elif kind == "failed" and e.get("error"):
        lines.append(str(e["error"]).strip().splitlines()[-1][:120])
    elif kind in ("estop", "clear_estop"):
        envs = ", ".join(str(i) for i in e.get("envs") or [])
        why = f" ({e['reason']})" if e.get("reason") else ""
        lines.append(f"env {envs}{why}")
    elif kind == "resume" and e.get("checkpoint"):
        lines.append(f"from checkpoint {e['checkpoint']}")
    lines.append(f"step {e.get('step', '?')} · env steps {e.get('env_steps', '?')}")
    return "<br>".join(lines)


class LiveFigure(go.FigureWidget):
    """A FigureWidget whose comm opens only once its data and layout are in its state.

    plotly's FigureWidget opens its comm (``comm_open`` with the model's state) before it fills
    ``_widget_data``/``_widget_layout``, then sends them as updates. The page drops updates for a
    model it is still creating (anywidget loads plotly's 5 MB bundle first), and a view rendered
    then starts without traces and never gets them: an empty plot for good. Deferring ``open()``
    to the end of ``__init__`` puts the traces into ``comm_open`` itself.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._defer_open = True
        super().__init__(*args, **kwargs)
        self._defer_open = False
        self.open()

    def open(self) -> None:
        if getattr(self, "_defer_open", False):
            return
        super().open()


class RunSeries:
    """The metric rows and events of one run, in arrival order."""

    def __init__(self, name: str):
        self.name = name
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.numeric: set[str] = set()
        self._cache: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        self.rows, self.events, self.numeric, self._cache = [], [], set(), {}

    def add_rows(self, rows: Iterable[dict[str, Any]]) -> bool:
        rows = list(rows)
        if not rows:
            return False
        self.rows.extend(rows)
        self._cache.clear()
        for row in rows:
            for k, v in row.items():
                if k not in self.numeric and _is_number(v):
                    self.numeric.add(k)
        return True

    def add_events(self, events: Iterable[dict[str, Any]]) -> bool:
        events = list(events)
        self.events.extend(events)
        return bool(events)

    @property
    def origin(self) -> float:
        times = [e["time"] for e in self.events[:1] if "time" in e]
        if self.rows and self.rows[0].get("wall_time") is not None:
            times.append(self.rows[0]["wall_time"])
        return min(times) if times else 0.0

    def column(self, key: str) -> np.ndarray:
        if key not in self._cache:
            vals = [r.get(key) for r in self.rows]
            arr = np.array([v if _is_number(v) else np.nan for v in vals], dtype=np.float64)
            if key == "wall_time":
                arr = arr - self.origin
            self._cache[key] = arr
        return self._cache[key]

    def event_x(self, e: dict[str, Any], x_key: str) -> float:
        if x_key == "wall_time":
            return float(e.get("time", math.nan)) - self.origin
        v = e.get(x_key)
        return float(v) if _is_number(v) else math.nan


class Curves(widgets.VBox):
    """Metric curves of one or more runs, overlaid."""

    def __init__(self, run_names: list[str], metrics: list[str] | tuple[str, ...] | None = None,
                 x: str = "env_steps", smoothing: float = 0.0, max_points: int = 4000,
                 height: int = 360, event_kinds: Iterable[str] = tuple(EVENT_STYLE)) -> None:  # fmt: skip
        self.series = {name: RunSeries(name) for name in run_names}
        self.max_points = max_points
        self.event_kinds = set(event_kinds)
        metrics = tuple(metrics or (DEFAULT_METRIC,))
        self._lock = threading.Lock()
        self._dirty = True
        self._keys: list[tuple[str, str]] = []
        self.renders = 0

        self.metric_select = widgets.SelectMultiple(
            options=list(metrics), value=metrics, rows=5, description="metrics",
            layout=widgets.Layout(width="320px"),
        )  # fmt: skip
        self.x_select = widgets.Dropdown(options=list(X_AXES), value=x, description="x axis",
                                         layout=widgets.Layout(width="220px"))  # fmt: skip
        self.smoothing = widgets.FloatSlider(value=smoothing, min=0.0, max=0.99, step=0.01, description="smoothing",
                                             readout_format=".2f", layout=widgets.Layout(width="300px"))  # fmt: skip
        self.show_events = widgets.Checkbox(value=True, description="events", indent=False,
                                            layout=widgets.Layout(width="90px"))  # fmt: skip
        # The figure starts with its traces (empty), so a page that loads plotly late still gets them.
        keys, traces = self._traces()
        self._keys = keys
        self.fig = LiveFigure(
            data=[go.Scatter(**t) for t in traces],
            layout=go.Layout(
                height=height,
                margin=dict(l=55, r=10, t=30, b=40),
                template="plotly_white",
                legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0),
                uirevision="keep",  # zoom and legend clicks survive redraws
                xaxis=dict(title=dict(text={v: k for k, v in X_AXES}[x])),
            ),
        )
        self._resync_until = time.monotonic() + RESYNC_SECONDS
        for w in (self.metric_select, self.x_select, self.smoothing, self.show_events):
            w.observe(self._mark_dirty, names="value")
        ui = widgets.HBox(
            [self.metric_select, widgets.VBox([self.x_select, self.smoothing, self.show_events])],
            layout=widgets.Layout(align_items="flex-start"),
        )
        super().__init__([self.fig, ui], layout=widgets.Layout(flex="3 1 0%", min_width="420px"))

    # ------------------------------------------------------------------ data in

    def _mark_dirty(self, _change: Any = None) -> None:
        self._dirty = True

    def add(
        self, name: str, rows: Iterable[dict[str, Any]] = (), events: Iterable[dict[str, Any]] = ()
    ) -> None:
        """New metric rows / events of run ``name`` (from the poller)."""
        series = self.series.setdefault(name, RunSeries(name))
        before = set(series.numeric)
        changed = series.add_rows(rows)
        changed = series.add_events(events) or changed
        if changed:
            self._dirty = True
        if series.numeric - before:
            self._update_options()

    def reset(self, name: str) -> None:
        """Forget run ``name``'s data (its history was rewritten, e.g. resumed from a checkpoint)."""
        if name in self.series:
            self.series[name].reset()
            self._dirty = True

    def _update_options(self) -> None:
        numeric = set().union(*(s.numeric for s in self.series.values())) - _NOT_METRICS
        first = [DEFAULT_METRIC] if DEFAULT_METRIC in numeric else []
        rest = sorted(numeric - set(first), key=_option_order)
        options = first + rest
        current = tuple(self.metric_select.value)
        options += [m for m in current if m not in options]
        if list(self.metric_select.options) != options:
            # Not under hold_trait_notifications: the options' observer would clear the value after it is set.
            self.metric_select.options = options
            self.metric_select.value = tuple(m for m in current if m in options)

    # ------------------------------------------------------------------ drawing

    def _style(self, run_i: int, metric_i: int, n_runs: int) -> dict[str, Any]:
        palette = qualitative.Plotly
        if n_runs == 1:
            return dict(color=palette[metric_i % len(palette)], width=2)
        return dict(color=palette[run_i % len(palette)], dash=_DASHES[metric_i % len(_DASHES)], width=2)

    def _decimate(self, n: int) -> np.ndarray | None:
        if n <= self.max_points:
            return None
        return np.unique(np.linspace(0, n - 1, self.max_points).round().astype(int))

    def _traces(self) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
        metrics = list(self.metric_select.value) or [DEFAULT_METRIC]
        x_key = self.x_select.value
        weight = float(self.smoothing.value)
        names = list(self.series)
        keys, traces = [], []
        for ri, name in enumerate(names):
            s = self.series[name]
            x = s.column(x_key)
            first_y = None
            for mi, metric in enumerate(metrics):
                y = ema(s.column(metric), weight)
                if first_y is None:
                    first_y = y
                idx = self._decimate(len(x))
                label = metric if len(names) == 1 else f"{name}: {metric}"
                keys.append((name, metric))
                traces.append(dict(
                    type="scatter", mode="lines", name=label, legendgroup=name,
                    x=x if idx is None else x[idx], y=y if idx is None else y[idx],
                    line=self._style(ri, mi, len(names)),
                    hovertemplate=f"{label}<br>%{{x}}: %{{y:.4g}}<extra></extra>",
                ))  # fmt: skip
            if self.show_events.value:
                ev = [e for e in s.events if e.get("kind") in self.event_kinds]
                ex = np.array([s.event_x(e, x_key) for e in ev], dtype=np.float64)
                ey = _y_at(ex, x, first_y if first_y is not None else np.array([]))
                keys.append((name, "__events__"))
                traces.append(dict(
                    type="scatter", mode="markers", name=f"{name} events" if len(names) > 1 else "events",
                    legendgroup=name, x=ex, y=ey, text=[event_text(e) for e in ev],
                    hovertemplate="%{text}<extra></extra>",
                    marker=dict(size=11, symbol=[EVENT_STYLE[e["kind"]][0] for e in ev],
                                color=[EVENT_STYLE[e["kind"]][1] for e in ev], line=dict(width=1.5)),
                ))  # fmt: skip
        return keys, traces

    def render(self, force: bool = False) -> bool:
        """Redraw if anything changed; True when a message went to the page."""
        with self._lock:
            if not (self._dirty or force):
                return False
            self._dirty = False
            keys, traces = self._traces()
            x_title = {v: k for k, v in X_AXES}[self.x_select.value]
            if keys != self._keys:
                # Structural changes (traces added or removed) cannot be batched.
                self.fig.data = ()
                self.fig.add_traces([go.Scatter(**t) for t in traces])
                self.fig.layout.xaxis.title.text = x_title
                self._keys = keys
                self._resync_until = time.monotonic() + RESYNC_SECONDS
            else:
                with self.fig.batch_update():
                    for trace, t in zip(self.fig.data, traces, strict=True):
                        trace.x, trace.y = t["x"], t["y"]
                        if "text" in t:
                            trace.text = t["text"]
                            trace.marker.symbol = t["marker"]["symbol"]
                            trace.marker.color = t["marker"]["color"]
                    self.fig.layout.xaxis.title.text = x_title
            if time.monotonic() < self._resync_until:
                self._resync()
            self.renders += 1
            return True

    def request_resync(self) -> None:
        """A page (re)appeared: send the full state with the next redraws (thread-safe)."""
        self._resync_until = time.monotonic() + RESYNC_SECONDS
        self._dirty = True

    def _resync(self) -> None:
        """Send the figure's whole state too, not only the latest edit.

        Edits that reach the page while it is still creating the figure's model are dropped, and
        a page that reloads gets the full-state traits (``_widget_data``), which plotly itself only
        sets at construction; for a while after the figure (or its traces) changed, and after a
        page says hello, those traits are kept current.
        """
        self.fig._widget_data = copy.deepcopy(self.fig._data)
        self.fig._widget_layout = copy.deepcopy(self.fig._layout)

    def trace(self, run_name: str, metric: str = DEFAULT_METRIC) -> Any:
        """The plotted trace of ``metric`` for run ``run_name`` (for tests and notebooks)."""
        return self.fig.data[self._keys.index((run_name, metric))]

    def events_trace(self, run_name: str) -> Any:
        return self.fig.data[self._keys.index((run_name, "__events__"))]

    def close(self) -> None:
        for w in (self.fig, self.metric_select, self.x_select, self.smoothing, self.show_events):
            w.close()
        super().close()


def _option_order(key: str) -> tuple[int, str]:
    """Metrics first, then losses, stage times, hyperparameters, counters."""
    if key in _COUNTERS:
        return (4, key)
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return ({"": 0, "time": 2, "hp": 3}.get(prefix, 1), key)


def _y_at(ex: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where to draw event markers: on the first metric's curve at the event's x (else 0)."""
    if len(ex) == 0:
        return np.zeros(0)
    ok = np.isfinite(x) & np.isfinite(y) if len(y) == len(x) else np.zeros(len(x), bool)
    if not ok.any():
        return np.zeros(len(ex))
    xs, ys = x[ok], y[ok]
    order = np.argsort(xs, kind="stable")
    return np.interp(ex, xs[order], ys[order])


__all__ = ["Curves", "LiveFigure", "RunSeries", "ema", "event_text"]
