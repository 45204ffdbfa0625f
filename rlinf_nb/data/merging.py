"""Merge a recording's finalized shards (or any LeRobot datasets) into one LeRobot dataset."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rlinf_nb.data import shards
from rlinf_nb.data.lerobot_io import open_metadata, quiet_datasets, repo_id_for, require_dataset

__all__ = ["merge", "resolve_sources"]


def resolve_sources(sources: str | Path | Sequence[str | Path]) -> list[Path]:
    """Dataset directories named by ``sources``: a recording root expands to its finalized
    shards (unfinished ones are skipped); a dataset directory stands for itself; a directory of
    recording roots (a run's ``data/`` with one ``env-<rank>`` root per env worker) expands to
    each root's shards, roots in name order."""
    items = [sources] if isinstance(sources, str | Path) else list(sources)
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if not path.exists():
            raise FileNotFoundError(f"merge: {path} does not exist")
        if shards.is_recording_root(path):
            out.extend(shards.scan(path).finalized)
        elif path.is_dir() and not (path / "meta").exists() and (roots := _recording_roots(path)):
            for root in roots:
                out.extend(shards.scan(root).finalized)
        else:
            out.append(require_dataset(path))
    return out


def _recording_roots(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and shards.is_recording_root(p))


def merge(sources: str | Path | Sequence[str | Path], out: str | Path) -> Path:
    """Join every finalized shard of ``sources`` into a new LeRobot dataset at ``out``.

    Episodes keep their order (shard by shard); ``episode_index``, ``index`` and task indices
    are renumbered from 0; tasks are the union. ``out`` appears only when complete (written
    beside it, then renamed).

    Raises:
        FileExistsError: ``out`` exists.
        ValueError: nothing finalized to merge, or the sources differ in fps/features/robot type.
    """
    # Wraps LeRobot 0.4.4's own `lerobot.datasets.aggregate.aggregate_datasets`, which does the
    # real work (copies parquet and video files, concatenates videos, renumbers episodes, frames
    # and tasks, aggregates stats) and works offline on local roots. What we add: resolving a
    # recording root to its *finalized* shards, refusing to run on nothing, and writing into a
    # temporary sibling renamed at the end, so a crash mid-merge never leaves a half dataset at
    # `out` (aggregate_datasets writes in place).
    from lerobot.datasets.aggregate import aggregate_datasets

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"merge: output {out} already exists; pick a new path")
    roots = resolve_sources(sources)
    if not roots:
        raise ValueError(f"merge: no finalized shards or datasets found in {sources}")
    metas = [open_metadata(r) for r in roots]
    for root, meta in zip(roots, metas, strict=True):
        if meta.total_episodes == 0:
            raise ValueError(f"merge: {root} has no episodes")
    quiet_datasets()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_parent = Path(tempfile.mkdtemp(prefix=f".{out.name}.merging-", dir=out.parent))
    tmp = tmp_parent / out.name
    try:
        aggregate_datasets(
            repo_ids=[repo_id_for(r) for r in roots],
            aggr_repo_id=repo_id_for(out),
            roots=roots,
            aggr_root=tmp,
        )
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp_parent, ignore_errors=True)
    return out
