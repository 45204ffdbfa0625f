"""A run's episodes streamed into LeRobot datasets: the ``record:`` section of a run config.

Each env worker owns one :class:`EpisodeStreamer`, which owns one crash-safe
:class:`~rlinf_nb.data.Recorder` at ``<root>/env-<rank>``. Envs step in lockstep, so their
episodes interleave: the streamer keeps each env's current episode in memory and hands it to the
Recorder when it ends (the Recorder writes one episode at a time). What a frame holds:

- the observation the action was chosen on: a ``Box`` observation as ``observation.state``
  (flattened); a ``Dict`` observation's ``uint8`` HxWx3 entries as ``observation.images.<key>``
  (with ``images: true``) and every other entry as ``observation.<key>`` (``observation.state``
  for a key named ``state``);
- ``action``: the action the env really applied (a human's, a hand-back blend's, or the policy's
  clipped to the action bounds);
- ``next.reward``, ``next.done`` (the episode *terminated* after this frame; a time-limit cut
  leaves it False), ``next.success`` (set on an episode's last frame), and
  ``complementary_info.is_intervention`` (a human drove this step).

``episodes`` picks what is kept: ``all``, ``successful``, or ``intervened`` (episodes a human
touched: DAgger-style data). Merge what a run wrote with ``rlinf_nb.data.merge(run_dir / "data", out)``
or ``rlinf-nb data merge``; a run with ``record:`` can be cloned with ``algo.dataset: <that root>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_nb.config import param

__all__ = ["EPISODE_FILTERS", "EpisodeStreamer", "RecordConfig", "frame_features"]

EPISODE_FILTERS = ("all", "successful", "intervened")


@dataclass
class RecordConfig:
    """Stream a run's episodes into LeRobot datasets (off unless ``enabled``)."""

    enabled: bool = param(False, doc="record every env worker's episodes")
    root: str | None = param(None, doc="recording directory (None: the run directory's data/)")
    episodes: str = param("all", doc="which episodes to keep", choices=EPISODE_FILTERS)
    images: bool = param(True, doc="also record image observations (dict observations' uint8 HxWx3 entries)")
    fps: int = param(
        20, doc="frames per second written into the dataset (the env's control rate)", range=(1, 1000)
    )
    task: str | None = param(None, doc="task string of every episode (None: the env id)")
    shard_episodes: int = param(
        10, doc="finalize a shard after this many episodes (at most lost in a crash)", range=(1, None)
    )
    shard_seconds: float | None = param(
        300.0, doc="also finalize at the first episode end this long after a shard opened", range=(0.0, None)
    )
    video: bool = param(False, doc="store images as video (small, lossy) instead of PNG frames (lossless)")
    max_episodes: int | None = param(
        None, doc="stop recording after this many episodes per env worker", range=(1, None)
    )


def _is_image(space: Any) -> bool:
    shape = getattr(space, "shape", None) or ()
    return getattr(space, "dtype", None) == np.uint8 and len(shape) == 3 and shape[-1] == 3


def _obs_name(key: str, space: Any) -> str:
    key = key.replace("/", ".")  # robot camera paths (cams/front): LeRobot stores images under the name
    if _is_image(space):
        return f"observation.images.{key}"
    return "observation.state" if key == "state" else f"observation.{key}"


def frame_features(obs_space: Any, action_space: Any, images: bool = True) -> dict[str, tuple[str, Any]]:
    """Dataset feature name -> (observation key or ``None`` for a Box obs / ``"action"``, LeRobot feature)."""
    import gymnasium as gym

    from rlinf_nb.data.features import image, vector

    out: dict[str, tuple[str, Any]] = {}
    if isinstance(obs_space, gym.spaces.Dict):
        for key, space in obs_space.spaces.items():
            if _is_image(space):
                if images:
                    out[_obs_name(key, space)] = (key, image(space.shape[0], space.shape[1]))
            else:
                out[_obs_name(key, space)] = (key, vector(int(np.prod(space.shape))))
    else:
        out["observation.state"] = (None, vector(int(np.prod(obs_space.shape))))
    if isinstance(action_space, gym.spaces.Discrete):
        out["action"] = ("action", vector(1, dtype="int64"))
    else:
        out["action"] = ("action", vector(int(np.prod(action_space.shape))))
    return out


class EpisodeStreamer:
    """Buffers each env's episode and writes the finished ones through one Recorder (one env worker)."""

    def __init__(self, root: str | Path, cfg: RecordConfig, obs_space: Any, action_space: Any,
                 num_envs: int, task: str):  # fmt: skip
        from rlinf_nb.data.recorder import Recorder

        self.cfg = cfg
        self.layout = frame_features(obs_space, action_space, images=cfg.images)
        self.low = getattr(action_space, "low", None)
        self.high = getattr(action_space, "high", None)
        self.task = cfg.task or task
        self.recorder = Recorder(
            root, fps=cfg.fps, features={name: feat for name, (_, feat) in self.layout.items()},
            shard_episodes=cfg.shard_episodes, shard_seconds=cfg.shard_seconds, video=cfg.video, task=self.task,
        )  # fmt: skip
        self.episodes: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]
        self.written = 0
        self.skipped = 0

    def _frame(
        self, obs: Any, i: int, action: Any, reward: float, done: bool, intervened: bool
    ) -> dict[str, Any]:
        frame: dict[str, Any] = {}
        for name, (key, _) in self.layout.items():
            if key == "action":
                continue
            value = obs[key][i] if key is not None else obs[i]
            frame[name] = (
                np.array(value, copy=True).reshape(-1)
                if not name.startswith("observation.images.")
                else np.array(value, copy=True)
            )
        frame["action"] = np.asarray(action).reshape(-1)
        frame.update(reward=float(reward), done=bool(done), intervention=bool(intervened), success=False)
        return frame

    def step(self, obs: Any, actions: np.ndarray, res: Any) -> None:
        """Record one vectorised step: ``obs`` acted on, ``actions`` [N, ...] chosen, ``res`` the StepResult."""
        if self.full:
            return
        applied = res.applied_actions if res.applied_actions is not None else actions
        applied = np.asarray(applied)
        if self.low is not None and np.issubdtype(applied.dtype, np.floating):
            applied = np.clip(applied, self.low, self.high)
        ended = np.flatnonzero(res.terminated | res.truncated)
        success_of = (
            dict(zip(ended.tolist(), res.successes, strict=False)) if len(res.successes) == len(ended) else {}
        )
        for i in range(len(applied)):
            human = bool(res.intervened[i]) if res.intervened is not None else False
            self.episodes[i].append(self._frame(obs, i, applied[i], res.reward[i], res.terminated[i], human))
        for i in ended.tolist():
            self._end(i, bool(success_of.get(i, False)))

    @property
    def full(self) -> bool:
        return self.cfg.max_episodes is not None and self.written >= self.cfg.max_episodes

    def _end(self, i: int, success: bool) -> None:
        frames, self.episodes[i] = self.episodes[i], []
        keep = {"all": True, "successful": success, "intervened": any(f["intervention"] for f in frames)}
        if not keep[self.cfg.episodes] or self.full:
            self.skipped += 1
            return
        frames[-1]["success"] = success
        for frame in frames:
            self.recorder.add_frame(frame)
        self.recorder.end_episode()
        self.written += 1

    def close(self) -> dict[str, Any]:
        """Finalize the open shard (unfinished episodes are dropped); returns what was written."""
        self.recorder.close()
        return {"episodes": self.written, "skipped": self.skipped, "root": str(self.recorder.root)}
