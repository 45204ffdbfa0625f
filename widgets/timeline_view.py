"""A run's timeline in a notebook: ``rl.timeline(run)``, one row per process, one bar per span.

The spans are ``run.trace()``'s (see :mod:`rlinf_nb.runtime.trace`): the controller's stages and every
worker's calls. :func:`timeline_figure` is pure (a trace in, a plotly figure out); :func:`timeline` reads a
run's ``trace_events()`` and shows its last seconds. For the whole run at full detail, open ``run.trace()``'s file in
Perfetto.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from .curves import LiveFigure

MAX_BARS = 2_000
"""Bars drawn at most (the newest); a browser slows down past a few thousand."""


def _spans_by_process(trace: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Process labels in the trace's order, and its complete events with ``row`` (their label) added."""
    labels: dict[int, str] = {}
    order: dict[int, int] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "process_name":
            labels[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "process_sort_index":
            order[e["pid"]] = e["args"]["sort_index"]
    rows = [labels[p] for p in sorted(labels, key=lambda p: order.get(p, p))]
    spans = [
        {**e, "row": labels.get(e["pid"], str(e["pid"]))} for e in trace["traceEvents"] if e.get("ph") == "X"
    ]
    return rows, spans


def timeline_figure(
    trace: dict[str, Any], last_s: float | None = 10.0, max_bars: int = MAX_BARS
) -> go.Figure:
    """A Gantt chart of ``trace``'s spans that end in its last ``last_s`` seconds (None: all of them).

    x is seconds before the newest span's end (so the right edge is "now" for a live run); one colour per span
    name; a failed span has a red outline. The newest ``max_bars`` spans are drawn; the title says how many of
    the window's spans that is.
    """
    rows, spans = _spans_by_process(trace)
    if not spans:
        return go.Figure(layout={"title": {"text": "no spans yet"}})
    end_us = max(s["ts"] + s["dur"] for s in spans)
    if last_s is not None:
        spans = [s for s in spans if s["ts"] + s["dur"] >= end_us - last_s * 1e6]
    spans.sort(key=lambda s: s["ts"])
    shown = spans[-max_bars:]
    names = sorted({s["name"] for s in shown})
    palette = qualitative.Plotly + qualitative.D3
    fig = go.Figure()
    for i, name in enumerate(names):
        mine = [s for s in shown if s["name"] == name]
        fig.add_bar(
            name=name,
            orientation="h",
            y=[s["row"] for s in mine],
            base=[(s["ts"] - end_us) / 1e6 for s in mine],
            x=[max(s["dur"], 1.0) / 1e6 for s in mine],  # a 0-length call still shows as a sliver
            marker={"color": palette[i % len(palette)],
                    "line": {"color": ["#d62728" if not s["args"].get("ok", True) else "rgba(0,0,0,0)" for s in mine],
                             "width": 2}},
            customdata=[[s["dur"] / 1e3, _args_text(s["args"])] for s in mine],
            hovertemplate=f"<b>{name}</b> %{{customdata[0]:.2f}} ms<br>%{{customdata[1]}}<extra>%{{y}}</extra>",
        )  # fmt: skip
    window = "the whole run" if last_s is None else f"the last {last_s:g} s"
    note = f"{len(shown)} of {len(spans)} spans" if len(shown) < len(spans) else f"{len(spans)} spans"
    fig.update_layout(
        title={"text": f"timeline: {window}, {note}", "font": {"size": 13}},
        barmode="overlay",
        xaxis={"title": {"text": "seconds before the newest span's end"}},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(rows)), "type": "category"},
        height=max(220, 60 + 34 * len(rows)),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1},
    )
    return fig


def _args_text(args: dict[str, Any]) -> str:
    return " · ".join(f"{k} {v}" for k, v in args.items() if k != "ok") or (
        "ok" if args.get("ok", True) else "failed"
    )


def timeline(run: Any, last_s: float | None = 10.0, max_bars: int = MAX_BARS) -> LiveFigure:
    """``run``'s timeline (its ``trace_events()``) for the last ``last_s`` seconds, as a figure widget to display."""
    return LiveFigure(timeline_figure(run.trace_events(), last_s=last_s, max_bars=max_bars))


__all__ = ["MAX_BARS", "timeline", "timeline_figure"]
