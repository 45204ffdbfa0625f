"""The cluster view: a run's worker groups (rank, alive, pid, node) and channel depths."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

_STYLE = (
    "<style>.rnb-cluster table{font-size:12px;border-collapse:collapse;margin-right:16px}"
    ".rnb-cluster td,.rnb-cluster th{padding:1px 8px;text-align:left;border-bottom:1px solid #eee}"
    ".rnb-cluster .dead{color:#d62728;font-weight:bold}.rnb-cluster .ok{color:#2ca02c}</style>"
)


def _mb(n: Any) -> str:
    return f"{n / 1e6:.1f} MB" if isinstance(n, int | float) else "–"


def health_html(health: dict[str, Any]) -> str:
    """Two tables from ``run.health()``: workers by group, and channels."""
    rows = []
    for group, workers in (health.get("groups") or {}).items():
        for w in workers:
            alive = w.get("alive")
            cls, mark = ("ok", "✓") if alive else ("dead", "✗ " + html.escape(str(w.get("error", ""))))
            node = str(w.get("node_id") or "")[:10]
            rows.append(
                f"<tr><td>{html.escape(group)}</td><td>{w.get('rank', '')}</td><td class='{cls}'>{mark}</td>"
                f"<td>{w.get('pid', '')}</td><td title='{html.escape(str(w.get('node_id', '')))}'>{html.escape(node)}</td>"
                f"<td>{html.escape(str(w.get('host', '')))}</td></tr>"
            )
    workers = (
        "<table><tr><th>group</th><th>rank</th><th>alive</th><th>pid</th><th>node</th><th>host</th></tr>"
        + ("".join(rows) or "<tr><td colspan=6><i>no workers</i></td></tr>")
        + "</table>"
    )
    crow = []
    for name, m in (health.get("channels") or {}).items():
        if "error" in m:
            crow.append(
                f"<tr><td>{html.escape(name)}</td><td colspan=5 class='dead'>{html.escape(m['error'])}</td></tr>"
            )
            continue
        crow.append(
            f"<tr><td>{html.escape(name)}</td><td>{m.get('depth', '')}</td><td>{m.get('puts', '')}</td>"
            f"<td>{m.get('gets', '')}</td><td>{m.get('dropped', '')}</td><td>{_mb(m.get('bytes_in'))}</td></tr>"
        )
    channels = (
        "<table><tr><th>channel</th><th>depth</th><th>puts</th><th>gets</th><th>dropped</th><th>in</th></tr>"
        + ("".join(crow) or "<tr><td colspan=6><i>no channels</i></td></tr>")
        + "</table>"
    )
    return f"{_STYLE}<div class='rnb-cluster' style='display:flex;flex-wrap:wrap'>{workers}{channels}</div>"


class ClusterView(widgets.VBox):
    """Refreshed by the poller every few seconds (:meth:`update`)."""

    def __init__(self) -> None:
        self.table = widgets.HTML("<i>waiting for the run's health ...</i>")
        self.health: dict[str, Any] = {}
        super().__init__([self.table])

    def update(self, health: dict[str, Any]) -> None:
        self.health = health
        self.table.value = health_html(health)

    def show_error(self, text: str) -> None:
        self.table.value = f"<span style='color:#d62728'>{html.escape(text)}</span>"

    def close(self) -> None:
        self.table.close()
        super().close()


__all__ = ["ClusterView", "health_html"]
