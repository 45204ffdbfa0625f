"""Stream episodes into crash-safe, sharded LeRobot v3 datasets.

::

    from rlinf_nb.data import Recorder, image, vector

    features = {"observation.state": vector(4), "observation.images.front": image(64, 64),
                "action": vector(2)}
    with Recorder("runs/demo/data", fps=10, features=features, shard_episodes=20) as rec:
        for t in range(T):
            rec.add_frame({"observation.state": s, "observation.images.front": rgb, "action": a,
                           "reward": r, "done": d, "intervention": human})
        rec.end_episode(task="push the cube", success=True)

Every shard is its own LeRobot dataset written by LeRobot 0.4.4's ``LeRobotDataset``
(``create`` / ``add_frame`` / ``save_episode`` / ``finalize``). A shard is finalized after
``shard_episodes`` episodes or, at the first episode end after ``shard_seconds``, and only then
gets its ``.complete`` marker (see :mod:`rlinf_nb.data.shards`). If the process dies, only the
open shard is lost (LeRobot cannot read a dataset that was never finalized); a later Recorder on
the same root quarantines it and continues numbering. ``merge`` joins the finalized shards.

Writing cost is LeRobot's: frames are buffered in memory (images go to PNG files, by
``image_writer_threads`` background threads), and ``end_episode`` writes the episode's parquet
rows (and encodes its video) before it returns.
"""

from __future__ import annotations

import atexit
import logging
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_nb.config import ConfigError, build, param, to_dict
from rlinf_nb.data import shards
from rlinf_nb.data.features import DONE, SUCCESS, convert_frame, normalize_features
from rlinf_nb.data.lerobot_io import open_metadata, quiet_datasets
from rlinf_nb.data.scheduling import normal_scheduling

__all__ = ["Recorder", "RecorderConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecorderConfig:
    """How a :class:`Recorder` writes (the features and fps are given to the Recorder itself)."""

    shard_episodes: int = param(
        50,
        doc="finalize the open shard after this many episodes (what a crash can lose at most)",
        range=(1, None),
    )
    shard_seconds: float | None = param(
        600.0,
        doc="also finalize at the first episode end this many seconds after the shard opened (None: never)",
        range=(0.0, None),
    )
    video: bool = param(
        False,
        doc="store image features as video (small, lossy) instead of PNG frames in parquet (lossless)",
    )
    vcodec: str = param(
        "libsvtav1", doc="video codec (PyAV encoders that work here)", choices=("libsvtav1", "h264")
    )
    streaming_encoding: bool = param(
        False, doc="video: encode frames as they arrive instead of at end_episode (LeRobot option)"
    )
    image_writer_threads: int = param(
        2, doc="background threads writing image PNGs (0: write inside add_frame)", range=(0, 64)
    )
    task: str = param("", doc="task string used when neither the frame nor end_episode names one")
    robot_type: str | None = param(None, doc="LeRobot's robot_type label in info.json")
    reward: bool = param(True, doc="add a 'next.reward' float feature (frames give 'reward')")
    done: bool = param(True, doc="add a 'next.done' bool feature (frames give 'done'; default False)")
    success: bool = param(
        True, doc="add a 'next.success' bool feature (frames give 'success'; default False)"
    )
    intervention: bool = param(
        True, doc="add a 'complementary_info.is_intervention' bool feature (frames give 'intervention')"
    )
    on_unfinished: str = param(
        "quarantine",
        doc="what a new Recorder does with a dead writer's unfinished shard",
        choices=("quarantine", "delete"),
    )
    fsync: bool = param(True, doc="fsync a shard's files before its completion marker (survives power loss)")

    def validate(self) -> None:
        if self.shard_seconds is not None and self.shard_seconds <= 0:
            raise ConfigError(
                "shard_seconds", self.shard_seconds, "must be > 0 seconds, or None for no limit"
            )


class Recorder:
    """Write episodes into ``root/shard-NNNNNN/`` LeRobot datasets; see the module docstring.

    Not thread-safe: call it from one thread (a Ray actor, an env loop).

    Args:
        root: the recording directory (created if missing). One Recorder writes a root at a time.
        fps: frames per second of the recording (LeRobot timestamps are ``frame_index / fps``).
        features: name -> LeRobot feature dict (see :func:`~rlinf_nb.data.image`,
            :func:`~rlinf_nb.data.vector`); the RL flags of the config are added.
        config: a :class:`RecorderConfig`; keyword overrides (``shard_episodes=5``) go on top.

    Raises:
        ValueError: a bad feature, fps or config value (naming it), or a root recorded with
            other features or fps.
        RuntimeError: another live Recorder holds the root.
    """

    def __init__(
        self,
        root: str | Path,
        fps: int,
        features: Mapping[str, Any],
        config: RecorderConfig | Mapping[str, Any] | None = None,
        **overrides: Any,
    ):
        base = to_dict(config) if isinstance(config, RecorderConfig) else dict(config or {})
        self.config: RecorderConfig = build(RecorderConfig, {**base, **overrides})
        if isinstance(fps, bool) or not isinstance(fps, int | np.integer) or fps < 1:
            raise ValueError(f"Recorder: fps must be a positive int, got {fps!r}")
        self.fps = int(fps)
        cfg = self.config
        flags = {
            "reward": cfg.reward,
            "done": cfg.done,
            "success": cfg.success,
            "intervention": cfg.intervention,
        }
        self.features = normalize_features(features, video=cfg.video, vcodec=cfg.vcodec, flags=flags)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # Import LeRobot (and torch, ~5 s) now rather than inside the first add_frame.
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self._dataset_cls = LeRobotDataset
        quiet_datasets()

        self._lock = shards.RecordingLock(self.root)
        self._lock.acquire()
        try:
            self.recovered = self._recover()
            found = shards.scan(self.root)
            self._check_compatible(found.finalized)
        except BaseException:
            self._lock.release()
            raise
        self._next_shard = found.next_number
        self._episodes_before = sum(shards.read_marker(p)["episodes"] for p in found.finalized)
        self.shards_finalized = len(found.finalized)
        self.frames_written = sum(shards.read_marker(p)["frames"] for p in found.finalized)
        self._ds: Any = None  # the open shard's LeRobotDataset
        self._shard_path: Path | None = None
        self._shard_opened = 0.0
        self._shard_episodes = 0
        self._shard_frames = 0
        self._shard_tasks: set[str] = set()
        self._frames_in_episode = 0
        self._closed = False
        self._atexit = _register_atexit(self)

    # ------------------------------------------------------------------ public API

    @property
    def episodes_written(self) -> int:
        """Episodes saved so far in this root (finalized shards plus the open shard)."""
        return self._episodes_before + self._shard_episodes

    @property
    def current_shard(self) -> Path | None:
        """The open (unfinalized) shard's directory, if any."""
        return self._shard_path

    @property
    def frames_in_episode(self) -> int:
        return self._frames_in_episode

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        """Append one frame to the current episode (a shard opens on the first frame).

        ``frame`` maps feature names (or the aliases ``reward``, ``done``, ``success``,
        ``intervention``) to values, plus an optional ``"task"`` string.
        """
        self._check_open()
        values = convert_frame(frame, self.features)
        task = frame.get("task", self.config.task)
        if not isinstance(task, str):
            raise ValueError(f"add_frame: 'task' must be a string, got {type(task).__name__}")
        if self._ds is None:
            self._open_shard()
        with normal_scheduling():  # streaming video encoding starts here
            self._ds.add_frame({**values, "task": task})
        self._frames_in_episode += 1

    def end_episode(
        self, task: str | None = None, *, success: bool | None = None, done: bool | None = None
    ) -> int | None:
        """Save the current episode; returns its index in this root (None if it had no frames).

        Args:
            task: the episode's task string for every frame (default: the frames' own tasks).
            success: if given, sets the last frame's ``next.success``.
            done: if given, sets the last frame's ``next.done`` (e.g. ``True`` when the episode
                terminated, ``False`` when it was cut by a time limit).
        """
        self._check_open()
        if self._frames_in_episode == 0:
            return None
        buf = self._ds.episode_buffer
        if task is not None:
            if not isinstance(task, str):
                raise ValueError(f"end_episode: task must be a string, got {type(task).__name__}")
            buf["task"] = [task] * buf["size"]
        for flag, name in ((success, SUCCESS), (done, DONE)):
            if flag is not None:
                if name not in self.features:
                    raise ValueError(f"end_episode: {name!r} is not a feature of this recording")
                buf[name][-1] = np.array([bool(flag)])
        for name, feat in self.features.items():
            # LeRobot 0.4.4 stacks shape-(1,) values to (n, 1) and hands them to `datasets`,
            # which calls float() on each row: NumPy >= 2.4 refuses that for 1-element
            # arrays. LeRobot already accepts 0-d values at this point (its stats handle
            # 1-d columns), so we give it those.
            if feat["shape"] == (1,) and feat["dtype"] not in ("image", "video"):
                buf[name] = [np.asarray(v).reshape(()) for v in buf[name]]
        n = int(buf["size"])
        self._shard_tasks.update(buf["task"])
        with warnings.catch_warnings():
            # LeRobot's stats histogram casts bool features to uint8 and warns each episode.
            warnings.filterwarnings("ignore", "Converting input from bool", RuntimeWarning)
            with normal_scheduling():
                self._ds.save_episode()
        index = self.episodes_written
        self._shard_episodes += 1
        self._shard_frames += n
        self.frames_written += n
        self._frames_in_episode = 0
        cfg = self.config
        age = time.monotonic() - self._shard_opened
        if self._shard_episodes >= cfg.shard_episodes or (
            cfg.shard_seconds is not None and age >= cfg.shard_seconds
        ):
            self.flush()
        return index

    def discard_episode(self) -> None:
        """Drop the current episode's frames (nothing of it is written)."""
        self._check_open()
        if self._ds is not None and self._frames_in_episode:
            self._ds.clear_episode_buffer()
        self._frames_in_episode = 0

    def flush(self) -> Path | None:
        """Finalize the open shard now (if it holds saved episodes); returns its directory."""
        self._check_open()
        if self._ds is None:
            return None
        if self._frames_in_episode:
            raise RuntimeError("flush: an episode is in progress; end_episode() or discard_episode() first")
        return self._finalize_shard()

    def close(self) -> None:
        """Finalize saved episodes and release the root. An unfinished episode is discarded."""
        if self._closed:
            return
        try:
            if self._frames_in_episode:
                warnings.warn(
                    f"Recorder.close: discarding an unfinished episode of {self._frames_in_episode} frames "
                    "(call end_episode() to keep it)",
                    stacklevel=2,
                )
                self.discard_episode()
            if self._ds is not None:
                self._finalize_shard()
        finally:
            self._closed = True
            atexit.unregister(self._atexit)
            self._lock.release()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Recorder({str(self.root)!r}, episodes={self.episodes_written}, "
            f"shards_finalized={self.shards_finalized}, open_shard={self._shard_path and self._shard_path.name})"
        )

    # ------------------------------------------------------------------ shards

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Recorder is closed")

    def _open_shard(self) -> None:
        cfg = self.config
        path = shards.shard_dir(self.root, self._next_shard)
        self._next_shard += 1
        self._ds = self._dataset_cls.create(
            repo_id=f"local/{path.name}",
            fps=self.fps,
            features=self.features,
            root=path,
            robot_type=cfg.robot_type,
            use_videos=any(f["dtype"] == "video" for f in self.features.values()),
            image_writer_threads=cfg.image_writer_threads,
            vcodec=cfg.vcodec,
            streaming_encoding=cfg.streaming_encoding,
        )
        self._shard_path = path
        self._shard_opened = time.monotonic()
        self._shard_episodes = self._shard_frames = 0
        self._shard_tasks = set()

    def _finalize_shard(self) -> Path | None:
        ds, path = self._ds, self._shard_path
        assert path is not None
        self._ds, self._shard_path = None, None
        if self._shard_episodes == 0:  # opened, but every episode was discarded
            ds.stop_image_writer()
            shards.remove_shard(path)
            return None
        ds.finalize()
        ds.stop_image_writer()
        shards.remove_empty_dirs(path / "images")  # LeRobot leaves the per-episode PNG dirs' parents
        if self.config.fsync:
            shards.fsync_tree(path)
        shards.write_marker(
            path,
            {
                "shard": shards.shard_number(path),
                "episodes": self._shard_episodes,
                "frames": self._shard_frames,
                "first_episode": self._episodes_before,
                "tasks": sorted(self._shard_tasks),
                "fps": self.fps,
            },
        )
        self._episodes_before += self._shard_episodes
        self._shard_episodes = self._shard_frames = 0
        self.shards_finalized += 1
        return path

    def _recover(self) -> list[Path]:
        """Quarantine (or delete) unfinished shards a dead writer left; returns their new paths."""
        found = shards.scan(self.root)
        out = []
        for shard in found.unfinished:
            if self.config.on_unfinished == "delete":
                shards.remove_shard(shard)
                log.warning("Recorder: deleted unfinished shard %s", shard)
            else:
                dest = shards.quarantine_shard(self.root, shard)
                log.warning("Recorder: moved unfinished shard %s to %s", shard, dest)
                out.append(dest)
        return out

    def _check_compatible(self, finalized: list[Path]) -> None:
        if not finalized:
            return
        meta = open_metadata(finalized[-1])
        if meta.fps != self.fps:
            raise ValueError(f"Recorder: {self.root} was recorded at fps={meta.fps}, got fps={self.fps}")
        theirs = {k: (v["dtype"], tuple(v["shape"])) for k, v in meta.features.items()}
        ours = {k: (v["dtype"], tuple(v["shape"])) for k, v in self.features.items()}
        theirs = {
            k: v
            for k, v in theirs.items()
            if k not in ("timestamp", "frame_index", "episode_index", "index", "task_index")
        }
        if theirs != ours:
            diff = sorted(set(theirs.items()) ^ set(ours.items()))
            raise ValueError(
                f"Recorder: {self.root} holds shards with other features (merge needs equal features); "
                f"differences (name, (dtype, shape)): {diff}; record into a new root"
            )


def _register_atexit(rec: Recorder):
    """Close a forgotten Recorder at interpreter exit (its saved episodes get finalized)."""
    ref = weakref.ref(rec)

    def _close() -> None:
        r = ref()
        if r is not None and not r._closed:
            r.close()

    atexit.register(_close)
    return _close
