"""Describe a recording root (its shards) or a single LeRobot dataset."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlinf_nb.data import shards
from rlinf_nb.data.lerobot_io import open_metadata

__all__ = ["DataInfo", "info"]

_INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")


@dataclass
class DataInfo:
    """What :func:`info` reports."""

    path: str
    """the directory described"""
    kind: str
    """``"recording"`` (a root of shards) or ``"dataset"`` (one LeRobot dataset)"""
    episodes: int = 0
    """episodes in finalized shards (or in the dataset)"""
    frames: int = 0
    """frames in finalized shards (or in the dataset)"""
    tasks: list[str] = field(default_factory=list)
    """distinct task strings"""
    fps: int | None = None
    """frames per second (None: nothing finalized yet)"""
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> {dtype, shape} of the recorded features (LeRobot's index columns left out)"""
    shards_finalized: list[str] = field(default_factory=list)
    """recording: finalized shard directory names"""
    shards_unfinished: list[str] = field(default_factory=list)
    """recording: shards without a completion marker (being written if ``writer_active``)"""
    shards_quarantined: list[str] = field(default_factory=list)
    """recording: unfinished shards a later Recorder moved to ``quarantine/``"""
    writer_active: bool = False
    """recording: a live Recorder holds the root's lock"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"{self.kind} {self.path}",
            f"  episodes {self.episodes}, frames {self.frames}, fps {self.fps}",
        ]
        lines.append(f"  tasks ({len(self.tasks)}): " + "; ".join(self.tasks))
        lines.append("  features:")
        for name, f in self.features.items():
            lines.append(f"    {name:<40} {f['dtype']:<8} {tuple(f['shape'])}")
        if self.kind == "recording":
            lines.append(
                f"  shards: {len(self.shards_finalized)} finalized, {len(self.shards_unfinished)} unfinished"
                f"{' (writer active)' if self.writer_active else ''}, {len(self.shards_quarantined)} quarantined"
            )
            for name in self.shards_unfinished:
                lines.append(f"    unfinished: {name}")
        return "\n".join(lines)


def info(path: str | Path) -> DataInfo:
    """Episodes, frames, tasks, features and (for a recording root) shard states of ``path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"info: {path} does not exist")
    if not shards.is_recording_root(path):
        meta = open_metadata(path)
        out = DataInfo(str(path), "dataset")
        _add(out, meta)
        return out
    found = shards.scan(path)
    out = DataInfo(
        str(path),
        "recording",
        shards_finalized=[p.name for p in found.finalized],
        shards_unfinished=[p.name for p in found.unfinished],
        shards_quarantined=[p.name for p in found.quarantined],
        writer_active=shards.lock_is_held(path),
    )
    for shard in found.finalized:
        _add(out, open_metadata(shard))
    return out


def _add(out: DataInfo, meta: Any) -> None:
    out.episodes += int(meta.total_episodes)
    out.frames += int(meta.total_frames)
    tasks = list(meta.tasks.index) if meta.tasks is not None else []
    out.tasks.extend(t for t in tasks if t not in out.tasks)
    out.fps = int(meta.fps)
    if not out.features:
        out.features = {
            k: {"dtype": v["dtype"], "shape": list(v["shape"])}
            for k, v in meta.features.items()
            if k not in _INDEX_FEATURES
        }
