"""The hyperparameter panel: one input per live field of ``run.hparams``, and an Apply button.

Inputs follow the declared field: a log slider for positive ranges spanning decades, a
number box for other numbers (unclamped, so a bad value reaches the run and its
:class:`~rlinf_nb.config.ConfigError` is shown inline), a checkbox for bools, a dropdown
for choices. Apply sends only the changed fields through ``run.set_hparams``; changes
made elsewhere (``run.set_hparams`` in a cell) flow back into inputs you have not edited.
"""

from __future__ import annotations

import ast
import html
import math
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

_DESC = {"description_width": "110px"}


def make_input(path: str, spec: dict[str, Any]) -> widgets.ValueWidget:
    """The input widget for one live field, from its ``{value, doc, range, choices}``."""
    value, rng, choices = spec.get("value"), spec.get("range"), spec.get("choices")
    # a link's fields keep their stream and part (``obs.latency.ms``): several streams have an ``ms``
    name = (
        path.removeprefix("placement.links.") if path.startswith("placement.links.") else path.split(".")[-1]
    )
    lo, hi = (rng or (None, None))[:2] if rng else (None, None)
    tip = spec.get("doc") or ""
    if rng:
        tip += f" (range [{lo}, {hi}])"
    common = dict(description=name, tooltip=tip, style=_DESC,
                  layout=widgets.Layout(width="330px"))  # fmt: skip
    if choices:
        opts = list(choices)
        if value not in opts:
            opts.append(value)
        return widgets.Dropdown(options=opts, value=value, **common)
    if isinstance(value, bool):
        return widgets.Checkbox(value=value, indent=True, **common)
    if isinstance(value, int):
        return widgets.IntText(value=value, **common)
    if isinstance(value, float):
        if lo is not None and hi is not None and lo > 0 and hi / lo >= 100 and lo <= value <= hi:
            return widgets.FloatLogSlider(value=value, base=10, min=math.log10(lo), max=math.log10(hi), step=0.05,
                                          readout_format=".2e", continuous_update=False, **common)  # fmt: skip
        return widgets.FloatText(value=value, **common)
    return widgets.Text(value=repr(value), placeholder="a Python literal", **common)


def _read(w: widgets.ValueWidget, original: Any) -> Any:
    if isinstance(w, widgets.Text) and not isinstance(original, str):
        try:
            return ast.literal_eval(w.value)
        except (ValueError, SyntaxError):
            return w.value
    return w.value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


class HParamPanel(widgets.VBox):
    """Live hyperparameters of one run."""

    def __init__(self, run: Any, on_applied: Callable[[dict[str, Any]], None] | None = None):
        self.run = run
        self.on_applied = on_applied
        self.current: dict[str, Any] = {}
        self.inputs: dict[str, widgets.ValueWidget] = {}
        self.apply_button = widgets.Button(description="Apply", icon="check", button_style="primary",
                                           tooltip="send changed values to the run (applied at the next stage boundary)")  # fmt: skip
        self.reset_button = widgets.Button(description="Reset", icon="undo", tooltip="discard edits")
        self.message = widgets.HTML("")
        self.apply_button.on_click(lambda _b: self.apply())
        self.reset_button.on_click(lambda _b: self.reset())
        self.grid = widgets.GridBox(
            [], layout=widgets.Layout(grid_template_columns="repeat(auto-fill, 340px)")
        )
        super().__init__([self.grid, widgets.HBox([self.apply_button, self.reset_button]), self.message])
        try:
            specs = run.hparams
        except Exception as exc:  # noqa: BLE001 - a finished run without a controller
            self.message.value = f"<i>no live hyperparameters: {html.escape(str(exc))}</i>"
            specs = {}
        self.build(specs)

    def build(self, specs: dict[str, dict[str, Any]]) -> None:
        for w in self.inputs.values():
            w.close()
        self.inputs, self.current = {}, {}
        self.built_at = time.time()
        for path, spec in specs.items():
            w = make_input(path, spec)
            w.observe(lambda change, p=path: self._edited(p), names="value")
            self.inputs[path] = w
            self.current[path] = spec.get("value")
        self.grid.children = list(self.inputs.values())

    # ------------------------------------------------------------------ editing

    def changes(self) -> dict[str, Any]:
        """Fields whose input differs from the run's value."""
        out = {}
        for path, w in self.inputs.items():
            value = _read(w, self.current[path])
            if not _same(value, self.current[path]):
                out[path] = value
        return out

    def _edited(self, path: str) -> None:
        w = self.inputs[path]
        dirty = not _same(_read(w, self.current[path]), self.current[path])
        w.description = ("● " if dirty else "") + path.split(".")[-1]

    def apply(self) -> dict[str, Any] | None:
        """Send the edited fields to the run; returns what it accepted (None on error)."""
        from rlinf_nb.config import ConfigError

        changes = self.changes()
        if not changes:
            self.message.value = "<i>nothing changed</i>"
            return {}
        try:
            resolved = self.run.set_hparams(**changes)
        except ConfigError as exc:
            self.message.value = (
                f"<span style='color:#d62728'><b>rejected:</b> {html.escape(str(exc))}</span>"
            )
            return None
        except Exception as exc:  # noqa: BLE001 - shown, not raised, in a click handler
            self.message.value = (
                f"<span style='color:#d62728'><b>{type(exc).__name__}:</b> {html.escape(str(exc))}</span>"
            )
            return None
        for path, value in changes.items():
            self.current[path] = value
            self._edited(path)
        shown = ", ".join(f"{p.split('.')[-1]}={v!r}" for p, v in changes.items())
        self.message.value = f"applied at the next stage boundary: {html.escape(shown)}"
        if self.on_applied is not None:
            self.on_applied(resolved)
        return resolved

    def reset(self) -> None:
        for path in self.inputs:
            self._set_input(path, self.current[path])
        self.message.value = ""

    def _set_input(self, path: str, value: Any) -> None:
        w = self.inputs[path]
        try:
            w.value = repr(value) if isinstance(w, widgets.Text) and not isinstance(value, str) else value
        except Exception:  # noqa: BLE001 - out of a slider's range: leave the input alone
            pass
        self._edited(path)

    def sync(self, events: list[dict[str, Any]]) -> None:
        """Apply ``hparams`` events (from the poller) to inputs that have no unapplied edits."""
        for e in events:
            if e.get("kind") != "hparams" or e.get("time", math.inf) < self.built_at:
                continue  # history from before the panel read the run's values
            for path, ch in (e.get("changes") or {}).items():
                if path not in self.inputs:
                    continue
                new = ch.get("new") if isinstance(ch, dict) else ch
                w = self.inputs[path]
                edited = not _same(_read(w, self.current[path]), self.current[path])
                self.current[path] = new
                if not edited:
                    self._set_input(path, new)
                else:
                    self._edited(path)

    def close(self) -> None:
        for w in [*self.inputs.values(), self.apply_button, self.reset_button, self.message, self.grid]:
            w.close()
        super().close()


__all__ = ["HParamPanel", "make_input"]
