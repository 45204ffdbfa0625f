"""A LeRobot dataset as RL transitions ``(obs, actions, rewards, next_obs, terminated)``.

Frame ``t`` of an episode holds ``o_t``, ``a_t``, and the reward/done that followed ``a_t``
(``next.reward``, ``next.done``), so a transition is frame ``t`` plus the observation of frame
``t+1``. The last frame of an episode has no successor: its ``next_obs`` is its own
observation. That is exact when the episode terminated (``terminated`` masks the bootstrap);
when it was cut by a time limit (``next.done`` False on the last frame, or no done feature and
``terminal_at_end=False``) the transition is marked ``truncated`` and can be dropped with
``drop_truncated=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_nb.data.features import DONE, REWARD
from rlinf_nb.data.lerobot_io import open_dataset

__all__ = ["BUFFER_FIELDS", "dataset_to_transitions", "load_into_buffer"]


def dataset_to_transitions(
    dataset: Any,
    obs_keys: str | Sequence[str] | None = None,
    action_key: str = "action",
    *,
    extras: Sequence[str] | Mapping[str, str] = (),
    terminal_at_end: bool = True,
    drop_truncated: bool = False,
) -> dict[str, Any]:
    """Every transition of ``dataset`` as numpy arrays with a leading ``[n]`` dim.

    Args:
        dataset: a ``LeRobotDataset`` or the path of a local one.
        obs_keys: one feature name (``obs`` is then that array) or several (``obs`` is a dict
            keyed by the name without its ``observation.`` prefix). Default: every
            ``observation.*`` feature, as a dict.
        action_key: the action feature.
        extras: more per-frame features to include, e.g. ``["complementary_info.is_intervention"]``
            (output name: the part after the last dot), or a mapping feature -> output name.
        terminal_at_end: without a ``next.done`` feature, whether an episode's end counts as
            termination (True, e.g. demos that end on success) or as a time-limit cut.
        drop_truncated: leave out truncated episode ends (their ``next_obs`` is not real).

    Returns:
        ``{"obs", "actions", "rewards" (float32), "next_obs", "terminated" (bool),
        "truncated" (bool), "episode_index" (int64), **extras}``. Images come back as
        ``uint8 [n, H, W, 3]``. Without a ``next.reward`` feature, rewards are zeros.
    """
    ds = open_dataset(Path(dataset)) if isinstance(dataset, str | Path) else dataset
    features = ds.meta.features
    single = isinstance(obs_keys, str)
    keys = [obs_keys] if single else list(obs_keys or [k for k in features if k.startswith("observation.")])
    if not keys:
        raise ValueError("dataset_to_transitions: no observation features; pass obs_keys=...")
    extra_map = dict(extras) if isinstance(extras, Mapping) else {k: k.rsplit(".", 1)[-1] for k in extras}
    for key in (*keys, action_key, *extra_map):
        if key not in features:
            raise ValueError(
                f"dataset_to_transitions: {key!r} is not a feature; features: {', '.join(sorted(features))}"
            )

    video_keys = [k for k in keys if features[k]["dtype"] == "video"]
    columns = ["index", "episode_index", action_key, *[k for k in keys if k not in video_keys], *extra_map]
    columns += [k for k in (REWARD, DONE) if k in features and k not in columns]
    table = ds.hf_dataset.select_columns(list(dict.fromkeys(columns))).with_format("numpy")[:]
    cols = {k: _stack(v) for k, v in table.items()}
    for key in video_keys:  # decoded by LeRobot itself (one frame at a time: slow for long videos)
        cols[key] = np.stack([_to_uint8_hwc(ds[i][key]) for i in range(len(ds))])
    order = np.argsort(cols["index"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}

    n = len(order)
    ep = cols["episode_index"].astype(np.int64)
    is_last = np.ones(n, dtype=bool)
    is_last[:-1] = ep[1:] != ep[:-1]
    nxt = np.where(is_last, np.arange(n), np.arange(n) + 1)
    if DONE in cols:
        terminated = cols[DONE].reshape(n).astype(bool)
    else:
        terminated = is_last & terminal_at_end
    truncated = is_last & ~terminated
    rewards = cols[REWARD].reshape(n).astype(np.float32) if REWARD in cols else np.zeros(n, np.float32)

    def obs_at(idx: np.ndarray) -> Any:
        if single:
            return cols[keys[0]][idx]
        return {k.removeprefix("observation."): cols[k][idx] for k in keys}

    rows = np.flatnonzero(~truncated) if drop_truncated else np.arange(n)
    out: dict[str, Any] = {
        "obs": obs_at(rows),
        "actions": cols[action_key][rows],
        "rewards": rewards[rows],
        "next_obs": obs_at(nxt[rows]),
        "terminated": terminated[rows],
        "truncated": truncated[rows],
        "episode_index": ep[rows],
    }
    for key, name in extra_map.items():
        v = cols[key][rows]
        out[name] = v.reshape(len(rows)) if features[key]["shape"] in ((1,), [1]) else v
    return out


#: the fields an off-policy learner's buffers hold (as rlinf_nb.algorithms.sac.TRANSITION_KEYS)
BUFFER_FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")


def load_into_buffer(
    dataset: Any, buffer: Any, fields: Sequence[str] | None = BUFFER_FIELDS, **kwargs: Any
) -> int:
    """Append every transition of ``dataset`` to ``buffer`` (anything with ``extend(batch)``,
    e.g. :class:`rlinf_nb.algorithms.replay.ReplayBuffer` used as an RLPD demo buffer).

    Args:
        fields: which fields to append (default: those the online buffer holds, so the two mix
            in a ``MixedReplay``); None for all of them.
        kwargs: passed to :func:`dataset_to_transitions` (``obs_keys``, ``drop_truncated``...).

    Returns:
        the number of transitions appended.
    """
    batch = dataset_to_transitions(dataset, **kwargs)
    if fields is not None:
        missing = [f for f in fields if f not in batch]
        if missing:
            raise ValueError(f"load_into_buffer: fields {missing} not in the transitions {sorted(batch)}")
        batch = {f: batch[f] for f in fields}
    extend = getattr(buffer, "extend", None)
    if not callable(extend):
        raise ValueError(f"load_into_buffer: {type(buffer).__name__} has no extend(batch) method")
    extend(batch)
    return len(batch["actions"])


def _stack(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values
    return np.stack([np.asarray(v) for v in values])


def _to_uint8_hwc(x: Any) -> np.ndarray:
    arr = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    return np.clip(np.round(np.moveaxis(arr, 0, -1) * 255.0), 0, 255).astype(np.uint8)
