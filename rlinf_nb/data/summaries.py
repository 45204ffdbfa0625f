"""Per-episode summaries of a LeRobot dataset (length, tasks, success, interventions, return).

Read from ``meta/episodes`` and the scalar parquet columns only; images and videos are never
decoded, so summarising a large dataset is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinf_nb.data.features import DONE, INTERVENTION, REWARD, SUCCESS
from rlinf_nb.data.lerobot_io import open_metadata

__all__ = ["EpisodeSummary", "episode_summaries"]


@dataclass(frozen=True)
class EpisodeSummary:
    """One episode, as filters and ``--where`` expressions see it."""

    index: int
    """the episode's ``episode_index`` in its dataset"""
    length: int
    """number of frames"""
    tasks: tuple[str, ...]
    """every task string of the episode (usually one)"""
    success: bool | None
    """whether any frame has ``next.success`` set (None: the dataset has no such feature)"""
    intervention: bool | None
    """whether any frame was a human intervention (None: no intervention feature)"""
    intervention_frames: int
    """how many frames were interventions (0 without the feature)"""
    total_reward: float | None
    """sum of ``next.reward`` over the episode (None: no reward feature)"""
    done: bool | None
    """``next.done`` of the last frame: True when the episode terminated (None: no feature)"""

    @property
    def task(self) -> str:
        """The episode's task (its tasks joined by ' | ' if it has several)."""
        return " | ".join(self.tasks)


def episode_summaries(path: str | Path) -> list[EpisodeSummary]:
    """Summaries of every episode of the LeRobot dataset at ``path``, by episode index."""
    import pyarrow.parquet as pq

    meta = open_metadata(Path(path))
    wanted = [k for k in (SUCCESS, INTERVENTION, REWARD, DONE) if k in meta.features]
    per_ep: dict[int, dict[str, np.ndarray]] = {}
    files = sorted(
        {
            (int(c), int(f))
            for c, f in zip(meta.episodes["data/chunk_index"], meta.episodes["data/file_index"], strict=True)
        }
    )
    for chunk, file in files:
        table = pq.read_table(
            meta.root / meta.data_path.format(chunk_index=chunk, file_index=file),
            columns=["episode_index", "frame_index", *wanted],
        )
        cols = {name: table.column(name).to_numpy() for name in table.column_names}
        for ep in np.unique(cols["episode_index"]):
            sel = cols["episode_index"] == ep
            order = np.argsort(cols["frame_index"][sel], kind="stable")
            part = {k: np.asarray(v[sel][order]).reshape(int(sel.sum()), -1)[:, 0] for k, v in cols.items()}
            if int(ep) in per_ep:  # an episode split over two files
                part = {k: np.concatenate([per_ep[int(ep)][k], v]) for k, v in part.items()}
            per_ep[int(ep)] = part
    out = []
    for row in meta.episodes:
        ep = int(row["episode_index"])
        cols = per_ep.get(ep, {})
        inter = cols.get(INTERVENTION)
        out.append(
            EpisodeSummary(
                index=ep,
                length=int(row["length"]),
                tasks=tuple(row["tasks"]),
                success=bool(cols[SUCCESS].any()) if SUCCESS in cols else None,
                intervention=bool(inter.any()) if inter is not None else None,
                intervention_frames=int(inter.sum()) if inter is not None else 0,
                total_reward=float(cols[REWARD].astype(np.float64).sum()) if REWARD in cols else None,
                done=bool(cols[DONE][-1]) if DONE in cols and len(cols[DONE]) else None,
            )
        )
    return sorted(out, key=lambda s: s.index)
