"""The intervention panel of a robot run's dashboard: take over, drive with the keys, mark, e-stop.

Shown when the run's envs are robot envs (``robot:<spec>/<task>``), hidden otherwise. It has

* an env selector and a **Take over / Hand back** toggle (``run.take_over`` / ``run.hand_back``;
  handing back blends over the env's ``blend_steps``);
* on multi-arm robots an arm selector: the toggle and the keys act on that arm only (the policy
  keeps driving the others), or on every arm together ("all arms", each arm moved by the same keys);
* **Mark success / Mark failure** (``run.mark``: ends the env's episode with that verdict);
* a red, latched **E-STOP** (``run.estop``: every robot env of the run holds at once, until
  cleared) and **Clear e-stop** (``run.clear_estop``);
* a keyboard teleop pad (:class:`TeleopKeys`, an anywidget): click it, then hold keys; each
  change sends ``run.human_action`` with an end-effector step of ``step`` (in [-1, 1], a fraction
  of the env's ``max_ee_step`` per control step) along the held keys' axes (:data:`KEY_HELP`);
* a mode line from ``run.status()``: who drives each env (agent / human / blending; per arm on
  multi-arm robots), which envs are e-stopped (and why) and where each end effector is.

Commands run on the panel's own daemon threads, never in the kernel's cell: the e-stop has a
thread to itself, so it never waits behind a slow command (a ``step`` of the dashboard, a burst
of key actions). Like every widget callback, a click reaches the kernel only while no cell is
blocking it.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import numpy as np
import traitlets

from .controls import Actions

#: key -> (axis, sign) of the end-effector delta (x forward from the base, y to its left, z up)
KEYMAP: dict[str, tuple[int, float]] = {
    "w": (0, 1.0),
    "arrowup": (0, 1.0),
    "s": (0, -1.0),
    "arrowdown": (0, -1.0),
    "a": (1, 1.0),
    "arrowleft": (1, 1.0),
    "d": (1, -1.0),
    "arrowright": (1, -1.0),
    "e": (2, 1.0),
    "q": (2, -1.0),
}
KEY_HELP = (
    "<b>W/S</b> or <b>↑/↓</b> ±x (forward/back) · <b>A/D</b> or <b>←/→</b> ±y (left/right) · "
    "<b>E/Q</b> ±z (up/down) · <b>Space</b> hold still · <b>G</b> gripper open/close · "
    "<b>T</b> take over / hand back · <b>Esc</b> E-STOP. Held keys drive the end effector by "
    "<i>step</i> × the env's <code>max_ee_step</code> per control step; releasing them holds it still."
)
_MODE_COLOURS = {"agent": "#2ca02c", "human": "#ff7f0e", "blending": "#9467bd"}
SYNC_GRACE_S = 3.0  # after a local toggle, the status may still show the old mode for this long
ALL_ARMS = ""  # the arm selector's value for "every arm together"


class TeleopKeys(anywidget.AnyWidget):
    """A focusable pad: the page sends key presses and releases while it has focus (see teleop_keys.js)."""

    _esm = (Path(__file__).parent / "teleop_keys.js").read_text()
    label = traitlets.Unicode("click here, then drive with the keys").tag(sync=True)
    active = traitlets.Bool(False).tag(sync=True)  # a human drives (the pad is drawn red when focused)
    focused = traitlets.Bool(False).tag(sync=True)  # set by the page

    def __init__(self, on_key: Callable[[str, bool], None], on_blur: Callable[[], None], **kwargs: Any):
        super().__init__(**kwargs)
        self._on_key = on_key
        self._on_blur = on_blur
        self.on_msg(self._handle)

    def _handle(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "key" and isinstance(content.get("key"), str):
            self._on_key(content["key"], bool(content.get("down")))
        elif content.get("type") == "blur":
            self._on_blur()


def robot_run_info(run: Any) -> dict[str, Any]:
    """Whether ``run``'s envs are robot envs, how many there are, and whether they have a gripper action."""
    try:
        cfg = run.config()
    except Exception:  # noqa: BLE001 - no config: not a robot run as far as we can tell
        return {"robot": False, "n_envs": 1, "gripper": False, "human": False}
    env = cfg.get("env") or {}
    kwargs = env.get("kwargs") or {}
    workers = ((cfg.get("placement") or {}).get("env") or {}).get("num_workers", 1)
    return {
        "robot": str(env.get("id", "")).startswith("robot:"),
        "n_envs": int(env.get("num_envs", 1)) * int(workers or 1),
        "gripper": bool(kwargs.get("gripper", False)),
        "human": kwargs.get("human") is not None,
    }


def mode_html(states: list[dict[str, Any]] | None, selected: int) -> str:
    """One line per env: who drives, e-stop, end effector (the selected env in bold)."""
    if not states:
        return "<i>waiting for the robots' state ...</i>"
    lines = []
    for s in states:
        mode = s.get("mode", "?")
        colour = _MODE_COLOURS.get(mode, "#333")
        bits = [f"env {s.get('env')}", f"<b style='color:{colour}'>{html.escape(mode)}</b>"]
        arms = s.get("arms") or []
        if len(arms) > 1:  # who drives each arm, and where its end effector is
            bits.append(", ".join(_arm_html(a) for a in arms))
        if s.get("estopped"):
            why = html.escape(str(s.get("reason") or ""))
            bits.append(
                f"<b style='color:#d62728'>E-STOPPED</b> ({why})"
                + (" · waits for Clear" if s.get("waiting") else "")
            )
        if s.get("ee") and len(arms) <= 1:
            bits.append(_ee_html(s["ee"]))
        bits.append(f"episode step {s.get('episode_step', '?')}")
        if not s.get("human", True):
            bits.append(
                "<small>(no human in the loop: launch with <code>env.kwargs.human: {}</code>)</small>"
            )
        line = " · ".join(bits)
        lines.append(f"<b>{line}</b>" if s.get("env") == selected else line)
    return "<br>".join(lines)


def _ee_html(ee: list[float]) -> str:
    return "ee " + " ".join(f"{a}={v:+.3f}" for a, v in zip("xyz", ee, strict=False))


def _arm_html(arm: dict[str, Any]) -> str:
    """``left/arm agent (ee x=... y=... z=...)`` for one arm of a multi-arm env."""
    colour = _MODE_COLOURS.get(arm["mode"], "#333")
    ee = f" ({_ee_html(arm['ee'])})" if arm.get("ee") else ""
    return f"{html.escape(arm['path'])} <span style='color:{colour}'>{html.escape(arm['mode'])}</span>{ee}"


class InterventionPanel(widgets.VBox):
    """Human take-over, keyboard teleop, marks and the e-stop of a robot run (see the module doc)."""

    def __init__(self, run: Any, n_envs: int = 1, gripper: bool = False, visible: bool = True,
                 on_done: Callable[[str, Any], None] | None = None) -> None:  # fmt: skip
        self.run = run
        self.n_envs = max(1, int(n_envs))
        self.gripper = gripper
        self.on_done = on_done
        self.actions = Actions("rlinf-nb-teleop")  # take over, keys, marks: in order
        self.estop_actions = Actions("rlinf-nb-estop")  # the e-stop never waits behind them
        self.held: set[str] = set()
        self.grip = 1.0  # gripper action (1 open, -1 closed)
        self.states: list[dict[str, Any]] | None = None
        self.estopped: list[int] = []
        self.sent: list[tuple[int, list[float]]] = []  # every human action sent (env, action), newest last
        self._lock = threading.Lock()
        self._pending: tuple[int, list[float]] | None = None
        self._queued = False
        self._syncing = False
        self._local_change_at = 0.0

        def button(label: str, icon: str, tip: str, style: str = "", width: str = "auto") -> widgets.Button:
            return widgets.Button(description=label, icon=icon, tooltip=tip, button_style=style,
                                  layout=widgets.Layout(width=width))  # fmt: skip

        self.env_select = widgets.Dropdown(
            options=[(f"env {i}", i) for i in range(self.n_envs)], value=0, description="env",
            layout=widgets.Layout(width="140px"), style={"description_width": "30px"},
        )  # fmt: skip
        self.arm_paths: list[str] = []  # the robot's arms (learned from the status; shown when more than one)
        self.arm_select = widgets.Dropdown(
            options=[("all arms", ALL_ARMS)], value=ALL_ARMS, description="arm",
            tooltip="the arm that Take over and the keys act on (the policy keeps the others)",
            layout=widgets.Layout(width="180px", display="none"), style={"description_width": "30px"},
        )  # fmt: skip
        self.takeover_button = widgets.ToggleButton(
            value=False, description="Take over", icon="hand-paper-o", button_style="info",
            tooltip="a human drives the selected env (keys below) until Hand back", layout=widgets.Layout(width="auto"),
        )  # fmt: skip
        self.success_button = button(
            "Mark success", "check", "end this env's episode as a success", "success"
        )
        self.failure_button = button(
            "Mark failure", "times", "end this env's episode as a failure", "warning"
        )
        self.estop_button = button("E-STOP", "stop-circle", "latch the e-stop of every robot env of the run: "
                                   "the arms hold until Clear e-stop", "danger", width="120px")  # fmt: skip
        self.estop_button.style.font_weight = "bold"
        self.clear_button = button(
            "Clear e-stop", "unlock", "clear the e-stop of every robot env (when it is safe)"
        )
        self.clear_button.disabled = True
        self.step_size = widgets.FloatSlider(
            value=0.5, min=0.05, max=1.0, step=0.05, description="step", readout_format=".2f",
            tooltip="action per held key, in [-1, 1] (a fraction of the env's max_ee_step per control step)",
            layout=widgets.Layout(width="260px"), style={"description_width": "40px"},
        )  # fmt: skip
        self.pad = TeleopKeys(on_key=self._on_key, on_blur=self._on_blur)
        self.mode = widgets.HTML(mode_html(None, 0))
        self.message = widgets.HTML("")
        self.help = widgets.HTML(f"<small>{KEY_HELP}</small>")

        self.takeover_button.observe(self._toggled, names=["value"])
        self.env_select.observe(self._env_changed, names=["value"])
        self.arm_select.observe(self._arm_changed, names=["value"])
        self.success_button.on_click(lambda _b: self.mark("success"))
        self.failure_button.on_click(lambda _b: self.mark("failure"))
        self.estop_button.on_click(lambda _b: self.engage_estop("dashboard"))
        self.clear_button.on_click(lambda _b: self.clear_estop())
        self.step_size.observe(lambda _c: self._keys_changed(), names=["value"])

        title = widgets.HTML("<b>intervention</b>")
        row1 = widgets.HBox([self.env_select, self.arm_select, self.takeover_button, self.success_button, self.failure_button,
                             self.estop_button, self.clear_button], layout=widgets.Layout(flex_flow="row wrap"))  # fmt: skip
        row2 = widgets.HBox([self.pad, self.step_size], layout=widgets.Layout(align_items="center"))
        self._parts = [title, row1, row2, self.help, self.mode, self.message]
        super().__init__(self._parts, layout=widgets.Layout(border="1px solid #ddd", padding="4px",
                                                            display=None if visible else "none"))  # fmt: skip
        self._show_label()

    @classmethod
    def for_run(cls, run: Any, **kwargs: Any) -> InterventionPanel:
        """A panel sized from ``run``'s config, hidden unless its envs are robot envs."""
        info = robot_run_info(run)
        return cls(run, n_envs=info["n_envs"], gripper=info["gripper"], visible=info["robot"], **kwargs)

    @property
    def visible(self) -> bool:
        return self.layout.display != "none"

    @property
    def env(self) -> int:
        return int(self.env_select.value)

    @property
    def arm(self) -> str | None:
        """The selected arm's path (None: every arm, the only choice on single-arm robots)."""
        return self.arm_select.value or None

    def _where(self, env: int, arm: str | None) -> str:
        return f"env {env}" + (f" {arm}" if arm else "")

    # ------------------------------------------------------------------ commands

    def _act(self, name: str, fn: Callable[[], Any], actions: Actions | None = None, quiet: bool = False,
             on_error: Callable[[], None] | None = None) -> Future:  # fmt: skip
        if not quiet:
            self.message.value = f"<i>{html.escape(name)} ...</i>"

        def done(fut: Future) -> None:
            exc = fut.exception()
            if exc is not None:
                self.message.value = (
                    f"<span style='color:#d62728'>{html.escape(name)} failed: {html.escape(str(exc))}</span>"
                )
                if on_error is not None:
                    on_error()
            elif not quiet:
                self.message.value = f"{html.escape(name)}: done"
            if self.on_done is not None:
                self.on_done(name, None if exc else fut.result())

        return (actions or self.actions).submit(fn, done)

    def take_over(self) -> None:
        """A human takes over the selected env (the toggle's on state)."""
        self.takeover_button.value = True

    def hand_back(self) -> None:
        self.takeover_button.value = False

    def _toggled(self, change: dict[str, Any]) -> None:
        self._style_toggle()
        if self._syncing:
            return
        self._local_change_at = time.monotonic()
        env, arm = self.env, self.arm
        self.held.clear()
        if change["new"]:
            self._act(f"take over {self._where(env, arm)}", lambda: self.run.take_over(env=env, arm=arm),
                      on_error=lambda: self._set_toggle(False))  # fmt: skip
        else:
            self._act(f"hand back {self._where(env, arm)}", lambda: self.run.hand_back(env=env, arm=arm))
        self._show_label()

    def _style_toggle(self) -> None:
        on = self.takeover_button.value
        self.takeover_button.description = "Hand back" if on else "Take over"
        self.takeover_button.button_style = "warning" if on else "info"
        self.pad.active = on

    def _env_changed(self, change: dict[str, Any]) -> None:
        self._let_go(int(change["old"]), self.arm)
        self._sync_from_states(force=True)
        self.mode.value = mode_html(self.states, self.env)
        self._show_label()

    def _arm_changed(self, change: dict[str, Any]) -> None:
        self._let_go(self.env, change["old"] or None)
        self._sync_from_states(force=True)
        self._show_label()

    def _let_go(self, env: int, arm: str | None) -> None:
        """The human lets go of what it drove before choosing another env or arm."""
        if self.takeover_button.value:
            self.held.clear()
            self._act(f"hand back {self._where(env, arm)}", lambda: self.run.hand_back(env=env, arm=arm))
            self._set_toggle(False)

    def mark(self, outcome: str) -> Future:
        env = self.env
        return self._act(f"mark {outcome} on env {env}", lambda: self.run.mark(outcome, env=env))

    def engage_estop(self, reason: str = "dashboard") -> Future:
        """Latch the e-stop of every robot env of the run (on the e-stop's own thread)."""
        self.estop_button.description = "E-STOPPED"
        self.clear_button.disabled = False
        return self._act("E-STOP", lambda: self.run.estop(reason=reason), actions=self.estop_actions)

    def clear_estop(self) -> Future:
        return self._act("clear e-stop", lambda: self.run.clear_estop(), actions=self.estop_actions)

    # ------------------------------------------------------------------ keys

    def action(self) -> list[float]:
        """The human action of the held keys: ``step`` along each held axis (plus the gripper's).

        With every arm selected on a multi-arm robot, each arm gets the same end-effector step."""
        a = np.zeros(3)
        for key in self.held:
            axis, sign = KEYMAP[key]
            a[axis] += sign
        a = np.clip(a, -1.0, 1.0) * float(self.step_size.value)
        out = [float(x) for x in a]
        if self.arm is None and len(self.arm_paths) > 1:
            out = out * len(self.arm_paths)
        if self.gripper:
            out.append(self.grip)
        return out

    def _on_key(self, key: str, down: bool) -> None:
        if key == "escape":
            if down:
                self.engage_estop("keyboard")
            return
        if key == "t":
            if down:
                self.takeover_button.value = not self.takeover_button.value
            return
        if key == "g" and self.gripper:
            if down:
                self.grip = -self.grip
            else:
                return
        elif key == "space":
            if down:
                self.held.clear()
        elif key in KEYMAP:
            (self.held.add if down else self.held.discard)(key)
        else:
            return
        self._keys_changed()

    def _on_blur(self) -> None:
        if self.held:
            self.held.clear()
            self._keys_changed()
        self._show_label()

    def _keys_changed(self) -> None:
        self._show_label()
        if not self.takeover_button.value:
            if self.held:
                self.message.value = (
                    "<i>press <b>Take over</b> (or T) first: keys drive only a taken-over env</i>"
                )
            return
        self._send_action(self.env, self.arm, self.action())

    def _send_action(self, env: int, arm: str | None, action: list[float]) -> None:
        """Send the newest action; while one is on its way, later ones replace each other (no backlog)."""
        with self._lock:
            self._pending = (env, arm, action)
            if self._queued:
                return
            self._queued = True

        def job() -> None:
            with self._lock:
                env_, arm_, action_ = self._pending
                self._queued = False
            self.sent.append((env_, action_))
            self.run.human_action(action_, env=env_, arm=arm_)

        self._act("human action", job, quiet=True)

    def _show_label(self) -> None:
        if not self.takeover_button.value:
            self.pad.label = f"keys: take over {self._where(self.env, self.arm)} first (button or T)"
            return
        held = " ".join(sorted(k.upper() if len(k) == 1 else k for k in self.held)) or "none"
        a = self.action()
        self.pad.label = (f"driving {self._where(self.env, self.arm)} · held: {held} · action "
                          + " ".join(f"{x:+.2f}" for x in a))  # fmt: skip

    # ------------------------------------------------------------------ status

    def update(self, st: dict[str, Any] | None) -> None:
        """Show the run's status (from the dashboard's poller): modes, e-stops, end effectors."""
        if not st:
            return
        states = st.get("robot_envs")
        if states is not None and not self.visible:
            self.layout.display = None
        self.states = states
        self._learn_arms(states)
        self.estopped = list(st.get("estopped") or [])
        latched = bool(self.estopped)
        self.estop_button.description = "E-STOPPED" if latched else "E-STOP"
        self.clear_button.disabled = not latched
        from rlinf_nb.client import FINAL_STATES

        final = st.get("state") in FINAL_STATES
        for w in (
            self.takeover_button,
            self.success_button,
            self.failure_button,
            self.estop_button,
            self.env_select,
            self.arm_select,
        ):
            w.disabled = final
        if final:
            self.clear_button.disabled = True
        self._sync_from_states()
        self.mode.value = mode_html(states, self.env)

    def _learn_arms(self, states: list[dict[str, Any]] | None) -> None:
        """Offer the robot's arms in the arm selector once the status names more than one."""
        paths = [a["path"] for a in ((states or [{}])[0].get("arms") or [])]
        if paths == self.arm_paths:
            return
        self.arm_paths = paths
        self.arm_select.options = [("all arms", ALL_ARMS)] + [(p, p) for p in paths]
        self.arm_select.layout.display = None if len(paths) > 1 else "none"
        self._show_label()

    def _sync_from_states(self, force: bool = False) -> None:
        """The toggle follows the selected env's (or arm's) mode: a take-over from code shows here too."""
        if not self.states or (not force and time.monotonic() - self._local_change_at < SYNC_GRACE_S):
            return
        mine = next((s for s in self.states if s.get("env") == self.env), None)
        if mine is None:
            return
        arm = next((a for a in mine.get("arms") or [] if a.get("path") == self.arm), None)
        self._set_toggle((arm or mine).get("mode") == "human")

    def _set_toggle(self, on: bool) -> None:
        if self.takeover_button.value == on:
            return
        self._syncing = True
        try:
            self.takeover_button.value = on
        finally:
            self._syncing = False
        if not on:
            self.held.clear()
        self._show_label()

    def close(self) -> None:
        self.actions.close()
        self.estop_actions.close()
        for w in (*self._parts, self.env_select, self.arm_select, self.takeover_button, self.success_button, self.failure_button,
                  self.estop_button, self.clear_button, self.step_size, self.pad, *self._parts[1].children):  # fmt: skip
            w.close()
        super().close()


__all__ = ["ALL_ARMS", "KEYMAP", "KEY_HELP", "InterventionPanel", "TeleopKeys", "mode_html", "robot_run_info"]
