"""The dashboard's camera feeds and rollout viewer: capture on the env worker, the widgets, and a real run.

Fast tests capture frames from real envs (CartPole with a numpy renderer, the mock robot arm with
its synthetic camera) and drive the widgets through the recording comm of ``test_widgets``; the
live test runs a robot env on the session cluster (``attached``) and reads its frames back.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import numpy as np
import pytest
from rlinf_nb.runtime.compression import CompressionConfig, ObsDecoder, ObsEncoder
from rlinf_nb.runtime.frames import (
    EpisodeFrames,
    FrameCaptureConfig,
    FramePublisher,
    capture_frames,
    downscale,
    episode_key,
)
from rlinf_nb.widgets import CARTPOLE_WITH_FRAMES, dashboard
from rlinf_nb.widgets.episode_viewer import EpisodeViewer
from rlinf_nb.widgets.media import JPEG_MAGIC, RolloutTile

from rlinf_nb.envs import make_env
from rlinf_nb.envs.cartpole_sketch import draw_cartpole

from .test_widgets import FakeRun, image_updates, recording  # noqa: F401 - recording is a fixture

# ----------------------------------------------------------------------------- capture on the env worker


def test_capture_names_the_render_frame_and_each_robot_camera():
    cart = make_env(CARTPOLE_WITH_FRAMES, 2, seed=0, render_mode="rgb_array")
    frames = capture_frames(cart, cart.reset(seed=0))
    assert list(frames) == ["render"] and frames["render"].shape == (200, 300, 3)

    arm = make_env("robot:mock_arm/reach", 2, seed=0, render_mode="rgb_array")  # state obs: cameras are read
    frames = capture_frames(arm, arm.reset(seed=0))
    assert list(frames) == ["cams/front"]  # render() is the first camera: not sent twice
    assert frames["cams/front"].shape == (64, 64, 3) and frames["cams/front"].dtype == np.uint8

    arm_dict = make_env("robot:mock_arm/reach", 2, seed=0, obs_mode="dict")  # images already in the obs
    obs = arm_dict.reset(seed=0)
    frames = capture_frames(arm_dict, obs)
    assert list(frames) == ["cams/front"]
    np.testing.assert_array_equal(frames["cams/front"], obs["cams/front"][0])


def test_capture_takes_maniskill_sensor_cameras_from_the_rgb_obs_and_its_render_frame():
    pytest.importorskip("mani_skill")
    env = make_env("maniskill:PushCube-v1", 1, seed=0, obs_mode="rgb", camera_width=64, camera_height=48,
                   sim_backend="physx_cpu", render_mode="rgb_array")  # fmt: skip
    try:
        obs = env.reset(seed=0)
        frames = capture_frames(env, obs)
        cams = [k for k in obs if k.startswith("rgb_")]
        assert cams and list(frames) == ["render", *cams]
        for cam in cams:
            assert frames[cam].shape == (48, 64, 3)
            np.testing.assert_array_equal(frames[cam], obs[cam][0])  # taken from the obs, not rendered again
        assert frames["render"].ndim == 3 and frames["render"].dtype == np.uint8
    finally:
        env.close()


def test_episode_frames_stay_bounded_and_cover_the_whole_episode():
    buf = EpisodeFrames(FrameCaptureConfig(max_frames=10, max_width=32))
    frame = np.zeros((48, 96, 3), np.uint8)
    for step in range(1, 38):
        buf.add({"cam": frame + step}, env_steps=step)
    ep = buf.finish()
    assert ep is not None and 5 <= len(ep["env_steps"]) <= 10
    assert (
        ep["env_steps"][0] == 1 and ep["env_steps"][-1] >= 37 - buf.cfg.max_frames
    )  # first kept, end reached
    assert np.all(np.diff(ep["env_steps"]) == ep["env_steps"][1] - ep["env_steps"][0])  # evenly thinned
    assert ep["cameras"]["cam"].shape == (len(ep["env_steps"]), 16, 32, 3)  # stride 3 fits 32 px
    assert int(ep["cameras"]["cam"][-1, 0, 0, 0]) == ep["env_steps"][-1]  # the frames match their steps
    assert buf.finish() is None  # started over
    assert downscale(frame, 200).shape == frame.shape and downscale(frame, 200) is not frame


class SinkChannel:
    """Stands in for a Channel handle: keeps what is put, by key (the channel itself is tested elsewhere)."""

    def __init__(self) -> None:
        self.items: dict[Any, list[Any]] = {}

    def put(self, key: Any, item: Any, timeout: float | None = 60.0, block: bool = True) -> None:
        self.items.setdefault(key, []).append(item)


def test_publisher_sends_compressed_named_frames_and_each_finished_episode():
    env = make_env("robot:mock_arm/reach", 2, seed=0, render_mode="rgb_array", max_steps=6,
                   terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    # compression.frames as a run turns it on (every frame a keyframe: the dashboard only peeks)
    codec = ObsEncoder(dataclasses.replace(CompressionConfig().frames, enabled=True))
    pub, sink = FramePublisher(3, render_every=4, codec=codec), SinkChannel()
    steps = 0
    for _ in range(13):  # two whole episodes of 6 steps
        res = env.step(np.zeros((2, *env.action_space.shape), np.float32))
        steps += 2
        pub.after_step(env, res, steps, sink)
    live = sink.items[3]
    assert len(live) == 6  # every 4 env steps = every other vector step
    decoded = ObsDecoder().decode(live[-1]["cameras"], 3)
    assert list(decoded) == ["cams/front"] and decoded["cams/front"].shape == (64, 64, 3)
    episodes = sink.items[episode_key(3)]
    assert [e["id"] for e in episodes] == ["3:1", "3:2"] and live[-1]["episodes"] == 2
    second = episodes[1]
    assert second["episode_length"] == 6 and second["rank"] == 3
    assert second["cameras"]["cams/front"].shape == (3, 64, 64, 3)  # 6 steps sampled every other step
    assert len(second["env_steps"]) == 3 and second["env_steps"] == sorted(second["env_steps"])


# ----------------------------------------------------------------------------- the widgets


def _frame(i: int) -> np.ndarray:
    return draw_cartpole(0.1 * np.sin(i / 5), 0.05)


def test_one_tile_per_camera_with_binary_jpeg_and_no_resend(recording):  # noqa: F811
    tile = RolloutTile()
    cams = {"cams/front": _frame(1), "cams/wrist": _frame(2)[::2, ::2]}
    item = {"cameras": cams, "env_steps": 8, "time": time.time()}
    assert tile.update({0: item, 1: {**item, "cameras": {"render": _frame(3)}}})
    assert sorted(tile.tiles) == [(0, "cams/front"), (0, "cams/wrist"), (1, "render")]
    for t in tile.tiles.values():
        (data, buffers) = image_updates(t.image)[0]
        assert data["buffer_paths"] == [["value"]] and bytes(buffers[0])[:3] == JPEG_MAGIC
        assert "fps" in t.caption.value and "frame age" in t.caption.value
    assert "cams/wrist" in tile.tiles[(0, "cams/wrist")].caption.value
    assert tile.since() == {0: 8, 1: 8}
    assert not tile.update({0: item})  # the same frame again: nothing sent
    assert len(image_updates(tile.tiles[(0, "cams/front")].image)) == 1
    newer = {"cameras": {**cams, "cams/front": _frame(9)}, "env_steps": 16, "time": time.time()}
    assert tile.update({0: newer})  # a newer one is
    assert len(image_updates(tile.tiles[(0, "cams/front")].image)) == 2
    tile.close()


def _episode(n: int, ep_id: str = "0:1") -> dict[str, Any]:
    frames = np.stack([downscale(_frame(i), 160) for i in range(n)])
    return {"id": ep_id, "rank": 0, "cameras": {"render": frames}, "env_steps": list(range(8, 8 * (n + 1), 8)),
            "episode_return": 12.0, "episode_length": 8 * n, "success": None}  # fmt: skip


def test_scrubber_spans_the_episode_and_moving_it_changes_the_image(recording):  # noqa: F811
    viewer = EpisodeViewer()
    assert viewer.show(_episode(12))
    assert viewer.slider.max == viewer.play.max == 11 and viewer.frame_count == 12
    image = viewer.images["render"]
    first = image.value
    assert first[:3] == JPEG_MAGIC and "12 frames" in viewer.caption.value
    viewer.slider.value = 7
    assert image.value != first and image.value == viewer.jpegs["render"][7]
    sent = len(image_updates(image))
    viewer.slider.value = 7  # no move: nothing sent
    assert len(image_updates(image)) == sent
    assert not viewer.show(_episode(12))  # the same episode: not encoded again
    assert viewer.show(_episode(5, "0:2")) and viewer.slider.max == 4 and viewer.slider.value == 0
    viewer.close()


def _frames_fake_run() -> FakeRun:
    run = FakeRun(render=True, n_rows=2)
    run.calls: dict[str, list[Any]] = {"frames": [], "episode": [], "health": 0}
    plain = run.latest_frames

    def latest_frames(since=None):
        run.calls["frames"].append(since)
        out = plain()
        return {r: {**item, "cameras": {"render": item["frame"]}} for r, item in out.items()}

    def latest_episode(since=None):
        run.calls["episode"].append(since)
        return None if since == "0:1" else _episode(6)

    health = run.health

    def counted_health():
        run.calls["health"] += 1
        return health()

    run.latest_frames, run.latest_episode, run.health = latest_frames, latest_episode, counted_health
    return run


def _page_says(widget: Any, content: dict[str, Any]) -> None:
    data = {"method": "custom", "content": content}
    widget.comm.handle_msg({"content": {"comm_id": widget.comm.comm_id, "data": data}, "buffers": []})


def test_dashboard_skips_frames_off_screen_and_health_while_its_tab_is_closed(recording):  # noqa: F811
    run = _frames_fake_run()
    dash = dashboard(run, start=False)
    dash.poll_once()
    assert dash.media.image.value[:3] == JPEG_MAGIC and dash.viewer.slider.max == 5
    assert run.calls["frames"] == [{}] and run.calls["episode"] == [None]
    assert run.calls["health"] == 0  # the cluster tab is not open
    dash.poll_once()
    assert run.calls["frames"][-1] == {0: 8} and run.calls["episode"][-1] == "0:1"  # only what is newer

    _page_says(dash.visibility, {"view": "v1", "visible": False})  # scrolled away
    n_frames, n_episode = len(run.calls["frames"]), len(run.calls["episode"])
    dash.poll_once(["frames", "episode"])
    assert len(run.calls["frames"]) == n_frames and len(run.calls["episode"]) == n_episode
    _page_says(dash.visibility, {"view": "v1", "visible": True})
    assert dash.poller.tasks["frames"].requested  # back on screen: fetched at the next tick
    dash.poll_once(["frames"])
    assert len(run.calls["frames"]) == n_frames + 1

    dash.tabs.selected_index = 2  # the cluster tab
    assert dash.poller.tasks["health"].requested
    dash.poll_once(["health"])
    assert run.calls["health"] == 1 and "abcdef0123" in dash.cluster.table.value
    dash.close()


# ----------------------------------------------------------------------------- on a real run


@pytest.mark.usefixtures("attached")
def test_robot_run_publishes_named_camera_frames_and_finished_episodes():
    import rlinf_nb as rl

    cfg = {
        "algorithm": "ppo",
        "env": {
            "id": "robot:mock_arm/reach",
            "num_envs": 2,
            "render_every": 4,
            "kwargs": {"max_steps": 12, "terminate_on_success": False},
        },  # fmt: skip
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [32, 32]}},
        "algo": {"rollout_steps": 16, "epochs": 1, "minibatch_size": 32},
        "budget": {"total_env_steps": 10**7, "stop_metric": None, "stop_value": None},
        "compression": {"frames": {"enabled": True}},
        "checkpoint": {"every": 0},
        "linger_s": 30,
    }
    run = rl.launch(cfg, name=f"cams_{uuid.uuid4().hex[:6]}")
    try:
        deadline, frames, episode = time.time() + 300, {}, None
        while time.time() < deadline and not (frames and episode):
            frames = frames or run.latest_frames()
            episode = episode or run.latest_episode()
            time.sleep(0.3)
        assert frames, "no frames within 300 s"
        cams = frames[0]["cameras"]
        assert list(cams) == ["cams/front"] and cams["cams/front"].shape == (64, 64, 3)
        assert cams["cams/front"].dtype == np.uint8 and cams["cams/front"].std() > 0  # decoded, not blank
        shown = frames[0]["env_steps"]
        newer = run.latest_frames({0: shown})
        assert not newer or newer[0]["env_steps"] != shown  # what the caller has is not sent again

        assert episode is not None, "no finished episode within 300 s"
        assert episode["episode_length"] == 12 and episode["rank"] == 0
        n = len(episode["env_steps"])
        assert 5 <= n <= 6  # a frame every 4 env steps = every other step of env 0's 12
        assert episode["cameras"]["cams/front"].shape == (n, 64, 64, 3)
        again = run.latest_episode(episode["id"])  # the one the caller has is not sent again
        assert again is None or again["id"] != episode["id"]
    finally:
        run.stop(timeout=120)
