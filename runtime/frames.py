"""What an env worker shows the dashboard: named camera frames, and the frames of env 0's last episode.

Every ``env.render_every`` env steps (never every step by default) the env worker captures the
frames of env 0 by name (:func:`capture_frames`): the gymnasium ``render()`` frame as ``"render"``,
each camera image of a dict observation (ManiSkill ``rgb_<camera>``, robot camera paths such as
``cams/front``: free, they are already there) and, for robot envs whose observation has no images,
each robot camera's image. The newest set goes on the run's drop-oldest ``frames`` channel under
the worker's rank (optionally compressed per camera by ``compression.frames``).

The same samples, downscaled, are kept for env 0's current episode (:class:`EpisodeFrames`,
bounded: past ``max_frames`` every other frame is dropped and the sampling stride doubles, so a
long episode is still covered end to end). When env 0's episode ends they go, stacked per camera,
on the same channel under ``episode/<rank>``: the dashboard's rollout viewer scrubs through them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf_nb.config import param

__all__ = [
    "EpisodeFrames",
    "FrameCaptureConfig",
    "FramePublisher",
    "capture_frames",
    "decimate",
    "downscale",
    "episode_key",
    "image_leaves",
]

RENDER = "render"
"""The name of the gymnasium ``render()`` frame among an env's camera frames."""


def episode_key(rank: int) -> str:
    """The ``frames`` channel key of env worker ``rank``'s last finished episode."""
    return f"episode/{rank}"


@dataclass
class FrameCaptureConfig:
    """How an env worker keeps the frames of env 0's current episode for the rollout viewer."""

    max_frames: int = param(
        200, doc="most frames kept per episode (older ones thinned out)", range=(2, 10_000)
    )
    max_width: int = param(
        160, doc="episode frames are downscaled to at most this width (px)", range=(8, 4096)
    )


def image_leaves(obs: Any) -> dict[str, np.ndarray]:
    """Env 0's camera images in a dict observation: its ``uint8 [N, H, W, C]`` leaves (C = 1, 3 or 4)."""
    if not isinstance(obs, Mapping):
        return {}
    out = {}
    for key, value in obs.items():
        if (
            isinstance(value, np.ndarray)
            and value.dtype == np.uint8
            and value.ndim == 4
            and value.shape[-1] in (1, 3, 4)
        ):
            out[str(key)] = value[0]
    return out


def _robot_cameras(env: Any) -> Mapping[str, Any] | None:
    """Sub-env 0's robot cameras (a robot env's ``cameras``: path -> camera component), or None."""
    envs = getattr(env, "envs", None)
    if not envs:
        return None
    cameras = getattr(envs[0], "cameras", None)
    return cameras if isinstance(cameras, Mapping) and cameras else None


def capture_frames(env: Any, obs: Any) -> dict[str, np.ndarray]:
    """Env 0's frames by camera name, the cheapest way the env offers them.

    Images already in the observation are taken as they are. A robot env's ``render()`` is its first
    camera, so robot envs give their cameras instead (read only when the observation lacks them);
    any other env gives its ``render()`` frame (if it renders) as ``"render"``, first.
    """
    frames = image_leaves(obs)
    cameras = _robot_cameras(env)
    if cameras is not None:
        for path, camera in cameras.items():
            if path not in frames:
                frames[path] = np.asarray(camera.image())
        return frames
    frame = env.render()
    if frame is None:
        return frames
    return {RENDER: np.asarray(frame), **frames}


def downscale(frame: np.ndarray, max_width: int) -> np.ndarray:
    """``frame`` (H x W [x C]) shrunk by the smallest integer stride that fits ``max_width``; always a copy."""
    stride = max(1, -(-frame.shape[1] // max_width))
    return np.array(frame[::stride, ::stride], copy=True)


def decimate(frames: list[Any]) -> list[Any]:
    """Every other item, the first kept (how a full episode buffer makes room)."""
    return frames[::2]


class EpisodeFrames:
    """The sampled, downscaled frames of env 0's current episode (bounded by ``cfg.max_frames``)."""

    def __init__(self, cfg: FrameCaptureConfig):
        self.cfg = cfg
        self.frames: list[dict[str, np.ndarray]] = []
        self.env_steps: list[int] = []
        self.stride = 1  # keep every stride-th sample (doubles each time the buffer fills)
        self._seen = 0

    def add(self, frames: Mapping[str, np.ndarray], env_steps: int) -> None:
        """Keep one sample (every ``stride``-th one once the buffer has filled)."""
        self._seen += 1
        if (self._seen - 1) % self.stride:
            return
        if len(self.frames) >= self.cfg.max_frames:
            self.frames, self.env_steps = decimate(self.frames), decimate(self.env_steps)
            self.stride *= 2
        self.frames.append({name: downscale(f, self.cfg.max_width) for name, f in frames.items()})
        self.env_steps.append(int(env_steps))

    def finish(self) -> dict[str, Any] | None:
        """The episode's frames stacked per camera (``uint8 [T, h, w, C]``), then start over; None if empty.

        A camera missing from some samples is kept only where present (its own ``env_steps``).
        """
        frames, steps = self.frames, self.env_steps
        self.frames, self.env_steps, self.stride, self._seen = [], [], 1, 0
        if not frames:
            return None
        names = list(dict.fromkeys(name for f in frames for name in f))
        cameras, camera_steps = {}, {}
        for name in names:
            present = [(f[name], s) for f, s in zip(frames, steps, strict=True) if name in f]
            shapes = {a.shape for a, _ in present}
            if len(shapes) != 1:  # a camera that changed size mid-episode: keep its last size only
                last = present[-1][0].shape
                present = [(a, s) for a, s in present if a.shape == last]
            cameras[name] = np.stack([a for a, _ in present])
            camera_steps[name] = [s for _, s in present]
        return {"cameras": cameras, "camera_env_steps": camera_steps, "env_steps": steps}


class FramePublisher:
    """An env worker's side of the dashboard's frames: live camera frames and finished episodes.

    Args:
        rank: the env worker's rank (its ``frames`` channel key).
        render_every: capture every this many env steps (0: never).
        codec: ``compression.frames`` (an :class:`~runtime.compression.ObsEncoder`; identity when off),
            applied per camera to the live frames.
        cfg: how episode frames are kept.
    """

    def __init__(self, rank: int, render_every: int, codec: Any, cfg: FrameCaptureConfig | None = None):
        self.rank = rank
        self.render_every = int(render_every or 0)
        self.codec = codec
        self.episode = EpisodeFrames(cfg or FrameCaptureConfig())
        self.episodes = 0  # finished episodes published so far

    def reset(self) -> None:
        """The envs were reset: env 0's partial episode is dropped."""
        self.episode.finish()

    def after_step(self, env: Any, res: Any, env_steps: int, channel: Any) -> None:
        """Call after every vector step (``res``: its StepResult; ``env_steps``: the worker's total so far)."""
        if not self.render_every:
            return
        if bool(res.terminated[0]) or bool(res.truncated[0]):
            self._publish_episode(res, channel)  # this step's frames (after auto-reset) begin the next one
        if env_steps % self.render_every >= env.num_envs:
            return
        frames = capture_frames(env, res.obs)
        if not frames:
            return
        self.episode.add(frames, env_steps)
        item = {"cameras": self.codec.encode(frames), "env_steps": int(env_steps), "time": time.time(),
                "episodes": self.episodes}  # fmt: skip
        channel.put(self.rank, item, block=False)  # drop-oldest: never waits; pipelined, the rollout goes on

    def _publish_episode(self, res: Any, channel: Any) -> None:
        episode = self.episode.finish()
        if episode is None:
            return
        self.episodes += 1
        # same-step auto-reset lists the ended envs in index order: env 0's return comes first
        ret = float(res.episode_returns[0]) if res.episode_returns else None
        length = int(res.episode_lengths[0]) if res.episode_lengths else None
        success = (
            float(res.successes[0])
            if len(res.successes) == len(res.episode_returns) and res.successes
            else None
        )
        channel.put(episode_key(self.rank), {**episode, "id": f"{self.rank}:{self.episodes}", "rank": self.rank,
                                             "episode_return": ret, "episode_length": length, "success": success,
                                             "time": time.time()}, block=False)  # fmt: skip
