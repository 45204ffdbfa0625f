"""Run controls: pause / resume / step / stop / checkpoint buttons and a status line.

Button handlers never block the kernel: each action runs on one small daemon thread
(:class:`Actions`, in order), and its result or error lands in the message line. The status
line is written by the dashboard's poller (:meth:`Controls.update`).
"""

from __future__ import annotations

import html
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets
from rlinf_nb.runtime.setup_progress import setup_text

from rlinf_nb.client import FINAL_STATES

_STATE_COLOURS = {
    "running": "#2ca02c",
    "stepping": "#1f77b4",
    "paused": "#ff7f0e",
    "starting": "#7f7f7f",
    "finished": "#1f77b4",
    "stopped": "#7f7f7f",
    "failed": "#d62728",
}


class Actions:
    """A daemon thread that runs submitted calls in order; ``submit`` returns a Future."""

    def __init__(self, name: str = "rlinf-nb-actions"):
        self.name = name
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.last: Future | None = None

    def submit(self, fn: Callable[[], Any], done: Callable[[Future], None] | None = None) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self.last = fut
        if done is not None:
            fut.add_done_callback(done)
        self._q.put((fn, fut))
        return fut

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the Future
                fut.set_exception(exc)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the last submitted action; returns its result (raises its error)."""
        return self.last.result(timeout) if self.last is not None else None

    def close(self) -> None:
        self._q.put(None)


def status_html(st: dict[str, Any] | None, error: str | None = None) -> str:
    """The one-line run status: state (and setup progress), next stage, step, env steps, steps/s, return."""
    if error:
        return f"<span style='color:#d62728'>{html.escape(error)}</span>"
    if not st:
        return "<i>waiting for the run's status ...</i>"
    state = st.get("state", "?")
    colour = _STATE_COLOURS.get(state, "#333")
    sps = st.get("steps_per_s")
    ret = st.get("episode_return_mean")
    parts = [
        f"<b style='color:{colour}'>{html.escape(state)}</b>",
        f"next stage <b>{html.escape(str(st.get('stage') or '–'))}</b>",
        f"step <b>{st.get('update_step', 0)}</b>",
        f"env steps <b>{st.get('env_steps', 0):,}</b>",
        f"<b>{sps:,.0f}</b> steps/s" if isinstance(sps, int | float) else "– steps/s",
        f"return <b>{ret:.1f}</b>" if isinstance(ret, int | float) else "return –",
    ]
    if st.get("overrides"):
        parts.append("overrides: " + ", ".join(html.escape(k) for k in st["overrides"]))
    if st.get("failing"):  # a failed rollout waiting for an e-stopped env: the run recovers or fails after
        parts.append(
            "<span style='color:#d62728'>rollout failed, ends at the e-stop's clear: "
            f"{html.escape(str(st['failing']))}</span>"
        )
    setup = setup_text(st)
    if setup:  # recording demos before the first iteration (minutes for some tasks)
        parts.insert(1, html.escape(setup))
    return " · ".join(parts)


class Controls(widgets.VBox):
    """Buttons acting on one run, its status line and a message line."""

    def __init__(self, run: Any, actions: Actions, on_done: Callable[[str, Any], None] | None = None):
        self.run = run
        self.actions = actions
        self.on_done = on_done
        self.state: str | None = None

        def button(label: str, icon: str, tip: str, style: str = "") -> widgets.Button:
            return widgets.Button(description=label, icon=icon, tooltip=tip, button_style=style,
                                  layout=widgets.Layout(width="auto"))  # fmt: skip

        self.pause_button = button("Pause", "pause", "pause before the next stage")
        self.resume_button = button("Resume", "play", "run freely again", "success")
        self.step_button = button("Step", "step-forward", "run the next stage, then stay paused")
        self.stop_button = button("Stop", "stop", "stop the run (saves a final checkpoint)", "danger")
        self.checkpoint_button = button("Checkpoint", "save", "save a checkpoint now")
        self.pause_button.on_click(lambda _b: self._act("pause", self.run.pause))
        self.resume_button.on_click(lambda _b: self._act("resume", self.run.resume))
        self.step_button.on_click(lambda _b: self._act("step", self.run.step))
        self.stop_button.on_click(lambda _b: self._act("stop", lambda: self.run.stop(wait=False)))
        self.checkpoint_button.on_click(lambda _b: self._act("checkpoint", self.run.checkpoint))
        self.buttons = [self.pause_button, self.resume_button, self.step_button, self.stop_button,
                        self.checkpoint_button]  # fmt: skip
        self.status = widgets.HTML(status_html(None))
        self.message = widgets.HTML("")
        super().__init__([widgets.HBox(self.buttons), self.status, self.message])

    def _act(self, name: str, fn: Callable[[], Any]) -> Future:
        self.message.value = f"<i>{name} ...</i>"

        def done(fut: Future) -> None:
            exc = fut.exception()
            if exc is not None:
                self.message.value = (
                    f"<span style='color:#d62728'>{name} failed: {html.escape(str(exc))}</span>"
                )
            else:
                self.message.value = f"{name}: {_describe(name, fut.result())}"
            if self.on_done is not None:
                self.on_done(name, None if exc else fut.result())

        return self.actions.submit(fn, done)

    def update(self, st: dict[str, Any] | None, error: str | None = None) -> None:
        """Show a status dict (from the poller)."""
        self.status.value = status_html(st, error)
        state = (st or {}).get("state")
        self.state = state
        final = state in FINAL_STATES or error is not None
        self.pause_button.disabled = final or state == "paused"
        self.resume_button.disabled = final or state == "running"
        self.step_button.disabled = final
        self.stop_button.disabled = final
        self.checkpoint_button.disabled = final

    def close(self) -> None:
        for w in [*self.buttons, self.status, self.message]:
            w.close()
        super().close()


def _describe(name: str, result: Any) -> str:
    if name == "step" and isinstance(result, dict):
        keys = ", ".join(f"{k}={_short(v)}" for k, v in result.items() if k != "stage")
        return f"ran <b>{html.escape(str(result.get('stage')))}</b> {html.escape(keys)}"
    if name == "checkpoint":
        return f"saved {html.escape(str(result))}"
    if isinstance(result, dict) and "state" in result:
        return f"state {html.escape(str(result['state']))}"
    return "done"


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)[:40]


__all__ = ["Actions", "Controls", "status_html"]
