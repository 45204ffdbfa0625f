"""LeRobot datasets of scripted-expert episodes: demonstrations to clone or to seed a buffer.

``record_scripted_dataset(out, "maniskill:PushCube-v1", episodes=50)`` plays the env's scripted
policy (:mod:`rlinf_nb.envs.scripted`), streams the successful episodes through a
:class:`~rlinf_nb.data.Recorder` (crash-safe shards) and merges them into one LeRobot dataset at
``out``, which LeRobot itself opens. Features: ``observation.state`` (the env's state vector),
``action``, and the RL flags ``next.reward``, ``next.done``, ``next.success``.

:func:`cached_scripted_dataset` keeps one such dataset per (env, kwargs, episodes, seed) under
``RLINF_NB_HOME/datasets/`` so runs that name ``scripted:<n>`` share it instead of re-recording.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_nb.data.features import vector
from rlinf_nb.data.lerobot_io import open_metadata
from rlinf_nb.paths import home

__all__ = ["cached_scripted_dataset", "record_scripted_dataset"]


def record_scripted_dataset(
    out: str | Path, env_id: str, episodes: int, *, seed: int = 0, fps: int = 20, task: str | None = None,
    action_noise: Sequence[float] = (), progress: bool | Callable[[int, int], None] = True, **env_kwargs: Any,
) -> Path:  # fmt: skip
    """Record ``episodes`` scripted episodes of ``env_id`` into a LeRobot dataset at ``out``.

    Without ``action_noise`` every episode is a successful one (failed ones are replayed). With it
    (DART-style demos, see :func:`~rlinf_nb.envs.scripted.scripted_episodes`) the env is driven with
    noisy actions, ``action`` holds the expert's clean label for each state, and every episode is kept,
    failed ones too (their labels are the expert's all the same); ``next.success`` tells them apart.
    ``out`` appears only when complete (see :func:`merge`). ``progress``: a tqdm bar over the episodes
    (``True``), none (``False``), or ``progress(kept, episodes)`` called after each episode kept.

    Raises:
        FileExistsError: ``out`` exists.
        ValueError: no scripted policy for ``env_id`` or incompatible env kwargs.
    """
    from rlinf_nb.data.merging import merge
    from rlinf_nb.data.recorder import Recorder
    from rlinf_nb.envs.scripted import scripted_episodes

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"record_scripted_dataset: {out} already exists")
    noisy = any(std > 0 for std in action_noise)
    with _episode_progress(progress, episodes, f"recording {env_id}") as report:
        transitions, _ = scripted_episodes(
            env_id, episodes, seed=seed, successful_only=not noisy, action_noise=action_noise,
            progress=report, **env_kwargs,
        )  # fmt: skip
    obs = transitions["obs"].reshape(len(transitions["obs"]), -1).astype(np.float32)
    actions = transitions["actions"].reshape(len(obs), -1).astype(np.float32)
    ends = np.flatnonzero(transitions["done"]) + 1
    features = {"observation.state": vector(obs.shape[1]), "action": vector(actions.shape[1])}
    shards_root = out.with_name(out.name + ".shards")
    shutil.rmtree(shards_root, ignore_errors=True)  # a previous attempt that died before merging
    task = task or f"scripted expert on {env_id}"
    with Recorder(shards_root, fps=fps, features=features, shard_episodes=max(1, episodes)) as rec:
        start = 0
        for end in ends:
            for t in range(start, end):
                last = t == end - 1
                rec.add_frame({"observation.state": obs[t], "action": actions[t],
                               "reward": float(transitions["rewards"][t]), "done": last,
                               "success": bool(transitions["success"][t])})  # fmt: skip
            rec.end_episode(task=task)
            start = end
    merge(shards_root, out)
    shutil.rmtree(shards_root, ignore_errors=True)
    return out


@contextmanager
def _episode_progress(
    progress: bool | Callable[[int, int], None], episodes: int, desc: str
) -> Iterator[Callable[[int, int], None] | None]:
    """The ``progress(kept, episodes)`` callback :func:`record_scripted_dataset` was asked for."""
    if callable(progress) or not progress:
        yield progress or None
        return
    from tqdm.auto import tqdm

    with tqdm(total=episodes, desc=desc, unit="episode") as bar:

        def report(kept: int, total: int) -> None:
            bar.update(kept - bar.n)

        yield report


def cached_scripted_dataset(
    env_cfg: Mapping[str, Any], episodes: int, seed: int = 0, action_noise: Sequence[float] = (),
    progress: bool | Callable[[int, int], None] = True,
) -> Path:  # fmt: skip
    """The scripted-expert dataset for a run's ``env`` section, recorded once under ``RLINF_NB_HOME``.

    The cache key covers the env id, its kwargs (render mode aside), the episode count, the seed and
    the action noise; a dataset is used only once complete (merge renames it into place at the end).
    ``progress`` is that of :func:`record_scripted_dataset`, used only when it records.
    """
    kwargs = {k: v for k, v in dict(env_cfg.get("kwargs") or {}).items() if k != "render_mode"}
    spec = {"id": env_cfg["id"], "kwargs": kwargs, "episodes": episodes, "seed": seed}
    if action_noise:  # (no key of its own without noise: datasets recorded before it keep their names)
        spec["action_noise"] = [float(std) for std in action_noise]
    key = json.dumps(spec, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = env_cfg["id"].replace(":", "-").replace("/", "-")
    out = home() / "datasets" / f"scripted-{name}-{episodes}ep-{digest}"
    if out.exists():
        open_metadata(out)  # raises if it is not a readable LeRobot dataset
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return record_scripted_dataset(
        out, env_cfg["id"], episodes, seed=seed, action_noise=action_noise, progress=progress, **kwargs
    )
