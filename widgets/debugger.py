"""The step debugger: the loop's stages (next one highlighted, with timings), the batch, overrides.

Written by the dashboard's poller: :meth:`StepDebugger.update` with each status, and
:meth:`StepDebugger.show_batch` after a step. Its buttons (step to a stage, revert an
override) run on the dashboard's action thread, never in the kernel's click handler.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import pandas as pd

from .controls import FINAL_STATES, Actions

_CSS = """
<style>
.rnb-stages {display:flex; gap:6px; flex-wrap:wrap; align-items:center; font-size:13px}
.rnb-stage {border:1px solid #bbb; border-radius:12px; padding:2px 10px; background:#f7f7f7}
.rnb-stage.rnb-next {background:#ffe9a8; border-color:#e0a800; font-weight:bold}
.rnb-stage.rnb-override {border-style:dashed; border-color:#9467bd}
.rnb-stage small {color:#666; font-weight:normal}
.rnb-batch table {font-size:12px; border-collapse:collapse}
.rnb-batch td, .rnb-batch th {padding:1px 8px; text-align:right}
</style>
"""


def stages_html(st: dict[str, Any]) -> str:
    """The stage list: next stage highlighted (``rnb-next``), per-stage time, overrides marked."""
    stages = st.get("stages") or []
    nxt = st.get("stage")
    times = st.get("stage_times") or {}
    overrides = st.get("overrides") or {}
    pills = []
    for name in stages:
        cls = ["rnb-stage"]
        if name == nxt:
            cls.append("rnb-next")
        if name in overrides:
            cls.append("rnb-override")
        t = times.get(name)
        timing = f" <small>{t * 1000:.0f} ms</small>" if isinstance(t, int | float) else ""
        mark = " ✎" if name in overrides else ""
        pills.append(f"<span class='{' '.join(cls)}' data-stage='{html.escape(name)}'>"
                     f"{html.escape(name)}{mark}{timing}</span>")  # fmt: skip
    state = html.escape(str(st.get("state", "?")))
    return f"{_CSS}<div class='rnb-stages'><b>{state}</b> {'<span>→</span>'.join(pills)}</div>"


def batch_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<div class='rnb-batch'><i>no batch yet (step the rollout stage)</i></div>"
    df = pd.DataFrame(rows)
    return (
        "<div class='rnb-batch'>"
        + df.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
        + "</div>"
    )


class StepDebugger(widgets.VBox):
    """Stages, batch summary and active overrides of one run."""

    def __init__(self, run: Any, actions: Actions, on_done: Callable[[str, Any], None] | None = None,
                 request_batch: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.run = run
        self.actions = actions
        self.on_done = on_done
        self.request_batch = request_batch
        self.next_stage: str | None = None
        self.batch_rows: list[dict[str, Any]] = []
        self._batch_key: tuple | None = None
        self._override_key: tuple | None = None
        self.stages = widgets.HTML(_CSS + "<i>waiting for the run ...</i>")
        self.target = widgets.Dropdown(
            options=[], description="step to", layout=widgets.Layout(width="230px")
        )
        self.step_to_button = widgets.Button(description="Run to stage", icon="forward",
                                             tooltip="run until this stage has run, then pause")  # fmt: skip
        self.refresh_button = widgets.Button(description="Refresh batch", icon="refresh")
        self.step_to_button.on_click(lambda _b: self._step_to())
        self.refresh_button.on_click(lambda _b: self.request_batch and self.request_batch())
        self.batch = widgets.HTML(batch_html([]))
        self.overrides = widgets.VBox([])
        self.message = widgets.HTML("")
        super().__init__([
            self.stages,
            widgets.HBox([self.target, self.step_to_button, self.refresh_button]),
            self.message,
            widgets.HTML("<b>batch</b> (of the last stage that ran)"),
            self.batch,
            widgets.HTML("<b>overrides</b>"),
            self.overrides,
        ])  # fmt: skip

    # ------------------------------------------------------------------ from the poller

    def update(self, st: dict[str, Any]) -> None:
        self.next_stage = st.get("stage")
        self.stages.value = stages_html(st)
        stages = list(st.get("stages") or [])
        if list(self.target.options) != stages:
            self.target.options = stages
        final = st.get("state") in FINAL_STATES
        self.step_to_button.disabled = final
        ov = st.get("overrides") or {}
        key = tuple(sorted(ov.items()))
        if key != self._override_key:
            self._override_key = key
            self._show_overrides(ov)

    def wants_batch(self, st: dict[str, Any]) -> bool:
        """While paused or stepping, the batch is worth refreshing when the loop has moved."""
        if st.get("state") not in ("paused", "stepping"):
            return False
        key = (st.get("update_step"), st.get("stage"), tuple(sorted((st.get("overrides") or {}).keys())))
        if key == self._batch_key:
            return False
        self._batch_key = key
        return True

    def show_batch(self, rows: list[dict[str, Any]]) -> None:
        self.batch_rows = rows
        self.batch.value = batch_html(rows)

    def _show_overrides(self, overrides: dict[str, str]) -> None:
        old = list(self.overrides.children)
        rows = []
        for stage, source in overrides.items():
            button = widgets.Button(description="Revert", icon="undo", tooltip=f"restore the built-in {stage} stage",
                                    layout=widgets.Layout(width="auto"))  # fmt: skip
            button.on_click(lambda _b, s=stage: self.revert(s))
            first = (source or "").strip().splitlines()
            label = first[0] if first else ""
            detail = (
                f"<details><summary><b>{html.escape(stage)}</b> ← <code>{html.escape(label[:80])}</code></summary>"
                f"<pre style='font-size:11px'>{html.escape(source or '')}</pre></details>"
            )
            rows.append(widgets.HBox([button, widgets.HTML(detail)]))
        if not rows:
            rows = [widgets.HTML("<i>none: run.override(stage, fn) replaces a stage</i>")]
        self.overrides.children = rows
        for w in old:
            for child in getattr(w, "children", ()):
                child.close()
            w.close()

    # ------------------------------------------------------------------ actions

    def revert(self, stage: str) -> Any:
        self.message.value = f"<i>reverting {html.escape(stage)} ...</i>"
        return self.actions.submit(lambda: self.run.revert(stage), lambda f: self._done(f"revert {stage}", f))

    def _step_to(self) -> Any:
        stage = self.target.value
        self.message.value = f"<i>running to {html.escape(str(stage))} ...</i>"
        return self.actions.submit(lambda: self.run.step(stage), lambda f: self._done(f"step to {stage}", f))

    def _done(self, name: str, fut: Any) -> None:
        exc = fut.exception()
        if exc is not None:
            self.message.value = (
                f"<span style='color:#d62728'>{html.escape(name)} failed: {html.escape(str(exc))}</span>"
            )
        else:
            self.message.value = f"{html.escape(name)}: done"
        if self.on_done is not None:
            self.on_done(name, None if exc else fut.result())

    def close(self) -> None:
        self._show_overrides({})
        for w in [*self.overrides.children, self.overrides, self.stages, self.target, self.step_to_button,
                  self.refresh_button, self.batch, self.message, *self.children]:  # fmt: skip
            w.close()
        super().close()


__all__ = ["StepDebugger", "batch_html", "stages_html"]
