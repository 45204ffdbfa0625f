"""Datasets: crash-safe LeRobot recording, merge/filter/info tools, loading into replay buffers.

- :class:`Recorder` streams episodes into sharded LeRobot v3 datasets (``recorder.py``).
- :func:`merge` joins a recording's finalized shards into one dataset (``merging.py``).
- :func:`filter_dataset` keeps episodes by success, intervention, length, task or a predicate
  over :class:`EpisodeSummary` (``filtering.py``, summaries in ``summaries.py``).
- :func:`info` describes a recording root or a dataset (``describe.py``).
- :func:`dataset_to_transitions` / :func:`load_into_buffer` turn a dataset into
  ``(obs, actions, rewards, next_obs, terminated)`` arrays (``transitions.py``).

The same tools are the ``rlinf-nb data ...`` commands. Names resolve lazily, so importing this
package (the CLI does) does not import LeRobot or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Recorder": "recorder",
    "RecorderConfig": "recorder",
    "image": "features",
    "vector": "features",
    "REWARD": "features",
    "DONE": "features",
    "SUCCESS": "features",
    "INTERVENTION": "features",
    "merge": "merging",
    "filter_dataset": "filtering",
    "EpisodeSummary": "summaries",
    "episode_summaries": "summaries",
    "info": "describe",
    "DataInfo": "describe",
    "dataset_to_transitions": "transitions",
    "load_into_buffer": "transitions",
    "open_dataset": "lerobot_io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlinf_nb.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlinf_nb.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
