"""The notebook dashboard: widget state and what goes over the comm.

Fast tests drive the widgets with an in-memory fake run; the live tests build a dashboard on a
real run of the session cluster (``attached``), click its buttons and check the run's state,
the widgets and the messages a recording comm captured.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import comm
import ipywidgets as widgets
import numpy as np
import pytest
from rlinf_nb.widgets import CARTPOLE_WITH_FRAMES, dashboard
from rlinf_nb.widgets.curves import Curves, ema, event_text
from rlinf_nb.widgets.hparams import make_input
from rlinf_nb.widgets.media import JPEG_MAGIC, PNG_MAGIC, RolloutTile, encode_frame
from rlinf_nb.widgets.poller import Pacer, Poller, Task, _CellTracker

from rlinf_nb.config import ConfigError
from rlinf_nb.envs.cartpole_sketch import draw_cartpole

# ----------------------------------------------------------------------------- a recording comm


class RecordingComm(comm.base_comm.BaseComm):
    """A comm that keeps every message it would send to the page."""

    log: list[tuple[RecordingComm, str, dict, list]] = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        RecordingComm.log.append((self, msg_type, data or {}, list(buffers or [])))

    def messages(self, msg_type: str = "comm_msg") -> list[tuple[dict, list]]:
        return [(d, b) for c, t, d, b in RecordingComm.log if c is self and t == msg_type]

    def pong(self, n: int) -> None:
        """What the page's pacer.js sends back."""
        data = {"method": "custom", "content": {"pong": n}}
        self.handle_msg({"content": {"comm_id": self.comm_id, "data": data}, "buffers": []})


@pytest.fixture()
def recording(monkeypatch):
    RecordingComm.log = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(**kw))
    yield RecordingComm
    RecordingComm.log = []


def image_updates(image: widgets.Image) -> list[tuple[dict, list]]:
    """Every state update of ``image`` that carries its value (inline or as a buffer)."""
    out = []
    for data, buffers in image.comm.messages():
        if data.get("method") == "update" and ("value" in data["state"] or ["value"] in data["buffer_paths"]):
            out.append((data, buffers))
    return out


# ----------------------------------------------------------------------------- a fake run


class FakeRun:
    """The parts of :class:`rlinf_nb.Run` the dashboard uses, in memory."""

    stages = ["rollout", "advantages", "update", "sync_weights"]

    def __init__(self, name: str = "fake", render: bool = False, n_rows: int = 0):
        self.name = name
        self.live = True
        self.render = render
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = [self._event("start")]
        self.state, self.stage_i, self.overrides = "running", 0, {}
        self.hp = {
            "algo.lr": 1e-3,
            "algo.ent_coef": 0.0,
            "algo.epochs": 20,
            "algo.normalize_advantages": True,
        }
        self.frame_step = 0
        for _ in range(n_rows):
            self.add_row()

    def _event(self, kind: str, **data: Any) -> dict[str, Any]:
        return {"time": time.time(), "step": len(getattr(self, "rows", [])), "env_steps": 256 * len(getattr(self, "rows", [])),
                "kind": kind, **data}  # fmt: skip

    def add_row(self) -> None:
        i = len(self.rows) + 1
        self.rows.append({"step": i, "env_steps": 256 * i, "wall_time": time.time(), "episode_return_mean": 10.0 + i,
                          "loss/policy": 1.0 / i, "hp/algo.lr": self.hp["algo.lr"]})  # fmt: skip

    # the client API
    def metrics_since(self, cursor: int = 0):
        return self.rows[cursor:], len(self.rows)

    def events_since(self, cursor: int = 0):
        return self.events[cursor:], len(self.events)

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "mode": "run", "stage": self.stages[self.stage_i], "stages": self.stages,
                "update_step": len(self.rows), "env_steps": 256 * len(self.rows), "steps_per_s": 1000.0,
                "episode_return_mean": self.rows[-1]["episode_return_mean"] if self.rows else None,
                "stage_times": dict.fromkeys(self.stages, 0.01), "overrides": dict(self.overrides), "error": None}  # fmt: skip

    def config(self) -> dict[str, Any]:
        return {"env": {"render_every": 8 if self.render else 0}}

    @property
    def hparams(self) -> dict[str, dict[str, Any]]:
        ranges = {"algo.lr": (1e-7, 1.0), "algo.ent_coef": (0.0, 1.0), "algo.epochs": (1, 1000)}
        return {
            k: {"value": v, "doc": k, "range": ranges.get(k), "choices": None} for k, v in self.hp.items()
        }

    def set_hparams(self, **changes: Any) -> dict[str, Any]:
        spec = self.hparams
        for key, value in changes.items():
            lo, hi = spec[key]["range"] or (None, None)
            if lo is not None and not lo <= value <= hi:
                raise ConfigError(key, value, f"allowed range: [{lo}, {hi}]")
        old = {k: self.hp[k] for k in changes}
        self.hp.update(changes)
        self.events.append(
            self._event("hparams", changes={k: {"old": old[k], "new": v} for k, v in changes.items()})
        )
        return changes

    def pause(self):
        self.state = "paused"
        self.events.append(self._event("pause"))
        return self.status()

    def resume(self):
        self.state = "running"
        self.events.append(self._event("resume"))
        return self.status()

    def step(self, stage=None):
        ran = self.stages[self.stage_i]
        self.stage_i = (self.stage_i + 1) % len(self.stages)
        self.state = "paused"
        return {"stage": ran}

    def stop(self, wait=True):
        self.state = "stopped"
        return self.status()

    def checkpoint(self):
        return "step_000001"

    def revert(self, stage):
        self.events.append(self._event("revert", stage=stage))
        return self.overrides.pop(stage, None) is not None

    def batch(self):
        class View:
            rows = [
                {
                    "key": "rewards",
                    "shape": (32, 8),
                    "dtype": "float32",
                    "mean": 1.0,
                    "std": 0.0,
                    "min": 1.0,
                    "max": 1.0,
                }
            ]

        return View()

    def health(self):
        return {"groups": {"env": [{"rank": 0, "alive": True, "pid": 123, "node_id": "abcdef0123456789", "host": "h"}]},
                "channels": {"obs": {"depth": 1, "puts": 10, "gets": 9, "dropped": 0, "bytes_in": 2e6}}}  # fmt: skip

    def latest_episode(self, since=None):
        return None

    def latest_frames(self, since=None):
        if not self.render:
            return {}
        self.frame_step += 8
        return {
            0: {
                "frame": draw_cartpole(0.1 * np.sin(self.frame_step / 50), 0.05),
                "env_steps": self.frame_step,
            }
        }


# ----------------------------------------------------------------------------- fast tests


def test_ema_matches_a_reference_loop_and_keeps_gaps():
    y = np.array([np.nan, 1.0, 2.0, np.nan, 4.0, 5.0])
    out = ema(y, 0.6)
    assert np.isnan(out[0]) and np.isnan(out[3])
    # debiased EMA over the finite values
    num = den = 0.0
    ref = []
    for v in y:
        if np.isnan(v):
            ref.append(np.nan)
            continue
        num, den = 0.6 * num + 0.4 * v, 0.6 * den + 0.4
        ref.append(num / den)
    np.testing.assert_allclose(out, ref)
    assert ema(y, 0.0) is y


def test_event_text_describes_changes():
    text = event_text(
        {"kind": "hparams", "step": 3, "env_steps": 768, "changes": {"algo.lr": {"old": 1e-3, "new": 3e-4}}}
    )
    assert "lr: 0.001 → 0.0003" in text and "step 3" in text
    assert "advantages ← mc" in event_text({"kind": "override", "stage": "advantages", "fn": "mc"})
    restored = event_text({"kind": "recovery", "group": "actor", "action": "restored", "from_step": 40})
    assert "actor: restored" in restored and "back to the checkpoint of step 40" in restored
    failed = event_text({"kind": "worker_failed", "detail": "a rollout worker was lost during the rollout"})
    assert "worker_failed" in failed and "a rollout worker was lost" in failed


def test_the_status_line_says_when_a_failed_rollout_waits_for_an_estop():
    from rlinf_nb.widgets.controls import status_html

    st = {"state": "running", "stage": "rollout", "update_step": 3, "env_steps": 96}
    assert "rollout failed" not in status_html({**st, "failing": None})
    line = status_html(
        {**st, "failing": "ChannelTimeout: channel 'r/obs': nothing arrived on 0 within 5.0 s"}
    )
    assert "rollout failed, ends at the e-stop's clear: ChannelTimeout: channel &#x27;r/obs&#x27;" in line


def test_the_feed_starts_over_when_a_learner_is_restored_from_a_checkpoint():
    """After a rollback the controller's rows can outgrow the feed's cursor before its next poll; the
    ``restored`` recovery event makes the feed fetch the whole (rewritten) history."""
    from rlinf_nb.widgets.dashboard import RunFeed

    run = FakeRun(n_rows=6)
    feed = RunFeed(run)
    rows, _events, reset = feed.pull()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and not reset
    del run.rows[4:]  # back to step 4's checkpoint, then steps 5-7 re-run between two polls
    run.events.append(run._event("recovery", group="actor", action="restored", from_step=4))
    for _ in range(3):
        run.add_row()
    rows, _events, reset = feed.pull()
    assert reset and [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    rows, _events, reset = feed.pull()
    assert rows == [] and not reset


def test_curves_plot_each_row_overlay_runs_and_mark_events():
    a, b = FakeRun("a", n_rows=30), FakeRun("b", n_rows=12)
    a.set_hparams(**{"algo.lr": 3e-4})
    a.pause()
    curves = Curves(["a", "b"])
    for run in (a, b):
        curves.add(run.name, run.rows, run.events)
    assert curves.render() and not curves.render()  # nothing new: nothing sent
    assert len(curves.trace("a").x) == len(curves.trace("a").y) == 30
    assert len(curves.trace("b").y) == 12
    assert list(curves.trace("a").y[:3]) == [11.0, 12.0, 13.0]
    marks = curves.events_trace("a")
    kinds = [t.split("</b>")[0].removeprefix("<b>") for t in marks.text]
    assert kinds == ["hparams", "pause"]  # "start" is not drawn
    assert all(np.isfinite(marks.y))
    assert "loss/policy" in curves.metric_select.options and "hp/algo.lr" in curves.metric_select.options
    curves.metric_select.value = ("episode_return_mean", "loss/policy")
    curves.smoothing.value = 0.9
    assert curves.render()
    assert len(curves.fig.data) == 2 * 2 + 2
    assert curves.trace("b", "loss/policy").y[0] == 1.0 and curves.trace("b", "loss/policy").y[-1] > 1.0 / 12
    curves.max_points = 10
    curves.render(force=True)
    assert len(curves.trace("a").x) == 10 and curves.trace("a").x[-1] == 30 * 256


def test_chosen_metrics_stay_selected_when_new_metric_columns_arrive():
    curves = Curves(["a"], metrics=["intervention_rate"])
    curves.add("a", [{"step": 1, "env_steps": 8, "episode_return_mean": None, "intervention_rate": 0.5}])
    curves.add(
        "a", [{"step": 2, "env_steps": 16, "episode_return_mean": 1.0, "intervention_rate": 0.2, "loss": 1.0}]
    )
    assert curves.metric_select.value == ("intervention_rate",)
    assert "loss" in curves.metric_select.options


def test_hparam_inputs_follow_the_declared_fields():
    assert isinstance(make_input("algo.lr", {"value": 1e-3, "range": (1e-7, 1.0)}), widgets.FloatLogSlider)
    assert isinstance(make_input("algo.ent_coef", {"value": 0.0, "range": (0.0, 1.0)}), widgets.FloatText)
    assert isinstance(make_input("algo.epochs", {"value": 20, "range": (1, 1000)}), widgets.IntText)
    assert isinstance(make_input("algo.norm", {"value": True}), widgets.Checkbox)
    dd = make_input("algo.sched", {"value": "linear", "choices": ("constant", "linear")})
    assert isinstance(dd, widgets.Dropdown) and dd.options == ("constant", "linear")


def test_frames_are_sent_as_binary_buffers_not_base64(recording):
    tile = RolloutTile(fmt="jpeg")
    frame = draw_cartpole(0.3, -0.1)
    assert tile.update({0: {"frame": frame, "env_steps": 8}})
    assert not tile.update({0: {"frame": frame, "env_steps": 8}})  # same frame: nothing sent
    value = tile.image.value
    assert value[:3] == JPEG_MAGIC
    updates = image_updates(tile.image)
    assert len(updates) == 1
    data, buffers = updates[0]
    assert data["buffer_paths"] == [["value"]] and "value" not in data["state"]
    assert bytes(buffers[0]) == bytes(value)
    assert encode_frame(frame, "png")[:8] == PNG_MAGIC


def test_pacer_skips_while_the_page_lags_and_recovers_on_pong(recording, monkeypatch):
    monkeypatch.setattr(_CellTracker, "running", False)
    pacer = Pacer(max_outstanding=2, idle_interval=60.0)
    for _ in range(3):
        assert pacer.ready()
        pacer.ping()
    assert pacer.outstanding == 3 and not pacer.ready() and pacer.mode() == "throttled"
    pings = [d["content"]["ping"] for d, _ in pacer.comm.messages() if d.get("method") == "custom"]
    assert pings == [1, 2, 3]
    pacer.comm.pong(3)  # through the comm, as the page would
    assert pacer.outstanding == 0 and pacer.ready()
    # While a cell blocks, pongs cannot arrive: a modest time-based rate instead.
    for _ in range(3):
        pacer.ping()
    monkeypatch.setattr(_CellTracker, "running", True)
    monkeypatch.setattr(_CellTracker, "started", time.monotonic())
    pacer.blind_interval = 0.0
    assert pacer.ready() and pacer.mode() == "blind"
    pacer.blind_limit = 0.0  # blind for too long: back to the idle rate
    assert not pacer.ready()


def test_without_a_page_updates_do_not_pile_up(recording, monkeypatch):
    """No pongs ever: frames and plots go out about once per idle_interval, not at 10 Hz."""
    monkeypatch.setattr(_CellTracker, "running", False)
    run = FakeRun(render=True, n_rows=3)
    dash = dashboard(run, start=False, frame_hz=50, plot_hz=50)
    dash.pacer.idle_interval = 0.5
    stop = threading.Event()

    def train():
        while not stop.wait(0.02):
            run.add_row()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        dash.start()
        time.sleep(2.0)
    finally:
        stop.set()
        dash.stop()
    assert not dash.poller.running
    frames = len(image_updates(dash.media.image))
    pings = dash.pacer.sent
    dash.close()
    # 3 unanswered pings, then one every 0.5 s: ~ 3 + 2.0 / 0.5 (+1 for timing)
    assert pings <= 8, pings
    assert frames <= pings + 1, (frames, pings)
    assert dash.poller.skipped > 20


def test_poller_survives_failing_tasks_and_stops():
    calls = []

    def boom():
        calls.append(1)
        raise RuntimeError("controller gone")

    errors = []
    poller = Poller([Task("boom", boom, 0.01)], tick=0.01, on_error=lambda t, e: errors.append(e))
    poller.start()
    time.sleep(0.3)
    poller.stop()
    assert not poller.running
    assert calls and "controller gone" in errors[-1]
    assert len(calls) < 30  # a failing task backs off


def test_dashboard_with_a_fake_run(recording):
    run = FakeRun(render=True, n_rows=5)
    other = FakeRun("other", n_rows=8)
    dash = dashboard(run, compare=[other], start=False)
    dash.tabs.selected_index = 2  # the cluster tab: health is polled only while it is open
    dash.poll_once()
    assert len(dash.curves.trace("fake").y) == 5 and len(dash.curves.trace("other").y) == 8
    assert "running" in dash.controls.status.value and "vs" in dash.header.value
    assert dash.media.image.value[:3] == JPEG_MAGIC
    assert "abcdef0123" in dash.cluster.table.value and "<td>obs</td>" in dash.cluster.table.value

    dash.controls.pause_button.click()
    dash.actions.wait(5)
    dash.poll_once()
    assert run.state == "paused" and dash.controls.resume_button.disabled is False

    dash.hparams.inputs["algo.ent_coef"].value = 5.0
    dash.hparams.apply_button.click()
    assert "allowed range" in dash.hparams.message.value and run.hp["algo.ent_coef"] == 0.0
    dash.hparams.inputs["algo.ent_coef"].value = 0.01
    dash.hparams.inputs["algo.lr"].value = 3e-4
    dash.hparams.apply_button.click()
    assert run.hp["algo.lr"] == 3e-4 and run.hp["algo.ent_coef"] == 0.01
    assert "applied" in dash.hparams.message.value

    run.set_hparams(**{"algo.epochs": 5})  # from code: the panel follows
    dash.poll_once()
    assert dash.hparams.inputs["algo.epochs"].value == 5

    dash.controls.step_button.click()
    dash.actions.wait(5)
    dash.poll_once()
    assert dash.debugger.next_stage == "advantages"
    assert "rnb-stage rnb-next' data-stage='advantages'" in dash.debugger.stages.value
    assert "rewards" in dash.debugger.batch.value

    run.overrides["advantages"] = "def mc(ctx):\n    ..."
    dash.poll_once()
    (row,) = dash.debugger.overrides.children
    row.children[0].click()
    dash.actions.wait(5)
    dash.poll_once()
    assert run.overrides == {} and "none" in dash.debugger.overrides.children[0].value
    kinds = [e["kind"] for e in dash.events["fake"]]
    assert kinds.count("hparams") == 2 and "pause" in kinds and "revert" in kinds

    dash.close()
    assert dash.comm is None and dash.curves.fig.comm is None


# ----------------------------------------------------------------------------- on a real run


def wait_until(cond, timeout: float = 120.0, what: str = "condition", poll: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} not reached in {timeout:.0f} s")


@pytest.fixture(scope="module")
def live(attached):
    """A real run with frames and a dashboard on it whose widgets talk through a recording comm."""
    import rlinf_nb as rl

    mp = pytest.MonkeyPatch()
    RecordingComm.log = []
    mp.setattr(comm, "create_comm", lambda **kw: RecordingComm(**kw))
    run = rl.launch("ppo_cartpole", name=f"dash_{uuid.uuid4().hex[:6]}", env__id=CARTPOLE_WITH_FRAMES,
                    env__render_every=32, budget__total_env_steps=10**7, budget__stop_metric=None,
                    budget__stop_value=None, checkpoint__every=0)  # fmt: skip
    try:
        wait_until(lambda: run.status()["update_step"] >= 2, 300, "two updates")
        dash = rl.dashboard(run, start=False)
        yield run, dash
        dash.close()
    finally:
        mp.undo()
        run.stop(timeout=120)


def test_live_curve_has_every_metric_row(live):
    run, dash = live
    dash.poll_once()
    n = dash.feeds[run.name].metrics_cursor
    trace = dash.curves.trace(run.name)
    assert n >= 2 and len(trace.x) == len(trace.y) == n
    rows = run.metrics_since(0)[0][:n]
    np.testing.assert_allclose(trace.x, [r["env_steps"] for r in rows])
    np.testing.assert_allclose(trace.y, [np.nan if r["episode_return_mean"] is None else r["episode_return_mean"]
                                         for r in rows])  # fmt: skip
    # plotly sends the curve's numpy arrays as binary buffers
    assert any(buffers for _d, buffers in dash.curves.fig.comm.messages())


def test_live_frames_reach_the_image_as_jpeg_bytes(live):
    run, dash = live
    wait_until(lambda: run.latest_frames(), 60, "a frame")
    dash.poll_once(["status", "frames"])
    image = dash.media.image
    assert image is not None and image.value[:3] == JPEG_MAGIC
    data, buffers = image_updates(image)[-1]
    assert ["value"] in data["buffer_paths"] and bytes(buffers[0])[:3] == JPEG_MAGIC
    assert "fps" in dash.media.tiles[(0, "render")].caption.value  # one tile per (env worker, camera)


def test_live_pause_button_pauses_the_run(live):
    run, dash = live
    dash.controls.pause_button.click()
    dash.actions.wait(60)
    wait_until(lambda: run.status()["state"] == "paused", 120, "paused")
    dash.poll_once()
    assert "paused" in dash.controls.status.value
    assert "pause" in [e["kind"] for e in dash.events[run.name]]
    assert any(t.startswith("<b>pause</b>") for t in dash.curves.events_trace(run.name).text)


def test_live_hparam_panel_applies_and_shows_errors(live):
    run, dash = live
    panel = dash.hparams
    panel.inputs["algo.ent_coef"].value = 5.0
    panel.apply_button.click()
    assert "allowed range" in panel.message.value and "algo.ent_coef" in panel.message.value
    panel.inputs["algo.ent_coef"].value = panel.current["algo.ent_coef"]
    panel.inputs["algo.lr"].value = 3e-4
    panel.apply_button.click()
    assert "applied" in panel.message.value, panel.message.value

    def hp_event():
        dash.poll_once(["data"])
        return [e for e in dash.events[run.name] if e["kind"] == "hparams"]

    (event,) = wait_until(hp_event, 60, "an hparams event")  # applied at the paused gate
    assert event["changes"]["algo.lr"]["new"] == pytest.approx(3e-4)
    assert run.hparams["algo.lr"]["value"] == pytest.approx(3e-4)


def test_live_step_button_runs_one_stage_and_the_debugger_follows(live):
    run, dash = live
    st = run.status()
    stages = st["stages"]
    before = st["stage"]
    dash.controls.step_button.click()
    summary = dash.actions.wait(120)
    assert summary["stage"] == before
    dash.poll_once()
    expected = stages[(stages.index(before) + 1) % len(stages)]
    assert run.status()["stage"] == expected == dash.debugger.next_stage
    assert f"rnb-stage rnb-next' data-stage='{expected}'" in dash.debugger.stages.value
    assert dash.debugger.batch_rows and "<table" in dash.debugger.batch.value


def test_live_poller_thread_updates_and_a_new_dashboard_has_the_history(live):
    import rlinf_nb as rl

    run, dash = live
    dash.controls.resume_button.click()
    dash.actions.wait(60)
    dash.start()
    try:
        assert dash.poller.running
        start = len(dash.curves.trace(run.name).x)
        wait_until(lambda: len(dash.curves.trace(run.name).x) >= start + 2, 180, "new points from the thread")
    finally:
        dash.stop()
    assert not dash.poller.running
    # As after a kernel restart: a fresh handle and dashboard read the whole history from cursor 0.
    again = rl.dashboard(rl.get_run(run.name), start=False)
    try:
        again.poll_once(["data", "plot"])
        n = again.feeds[run.name].metrics_cursor
        assert n >= start + 2 and len(again.curves.trace(run.name).x) == n
    finally:
        again.close()
    assert again.comm is None
