"""Keep a dataset's episodes by success, intervention, length, task, or any predicate."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from rlinf_nb.data import shards
from rlinf_nb.data.lerobot_io import open_dataset, open_metadata, quiet_datasets, repo_id_for, require_dataset
from rlinf_nb.data.scheduling import normal_scheduling
from rlinf_nb.data.summaries import EpisodeSummary, episode_summaries

__all__ = ["filter_dataset", "select_episodes", "where_predicate"]

_SAFE_BUILTINS = {"len": len, "min": min, "max": max, "abs": abs, "any": any, "all": all, "sum": sum,
                  "round": round, "True": True, "False": False, "None": None}  # fmt: skip


def where_predicate(expr: str) -> Callable[[EpisodeSummary], bool]:
    """A predicate from a Python expression over an episode's summary fields, e.g.
    ``"success and not intervention and length >= 20"`` or ``"'push' in task"``.

    Names: ``index, length, task, tasks, success, intervention, intervention_frames,
    total_reward, done`` (see :class:`EpisodeSummary`).
    """
    try:
        code = compile(expr, "<where>", "eval")
    except SyntaxError as exc:
        raise ValueError(f"where: not a Python expression: {expr!r} ({exc.msg})") from None

    def pred(s: EpisodeSummary) -> bool:
        names = {f: getattr(s, f) for f in s.__dataclass_fields__}
        names["task"] = s.task
        try:
            return bool(eval(code, {"__builtins__": _SAFE_BUILTINS}, names))  # noqa: S307 - the user's own filter
        except NameError as exc:
            allowed = ", ".join(sorted(names))
            raise ValueError(f"where: {exc} in {expr!r}; names you can use: {allowed}") from None

    return pred


def select_episodes(
    summaries: Sequence[EpisodeSummary],
    *,
    success: bool | None = None,
    intervention: bool | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    task: str | Sequence[str] | None = None,
    where: str | Callable[[EpisodeSummary], bool] | None = None,
) -> list[int]:
    """Indices of the episodes that pass every given criterion (None: not filtered on).

    Args:
        success: keep episodes whose success is this (needs a success feature).
        intervention: keep episodes with (True) or without (False) any intervention frame.
        min_length, max_length: inclusive bounds on the frame count.
        task: keep episodes with this task (or any of these tasks).
        where: an expression for :func:`where_predicate`, or a callable on the summary.
    """
    if min_length is not None and max_length is not None and min_length > max_length:
        raise ValueError(f"filter: min_length={min_length} is greater than max_length={max_length}")
    tasks = None if task is None else ({task} if isinstance(task, str) else set(task))
    pred = where_predicate(where) if isinstance(where, str) else where
    keep = []
    for s in summaries:
        if success is not None:
            if s.success is None:
                raise ValueError("filter: success=... given, but the dataset has no 'next.success' feature")
            if s.success != success:
                continue
        if intervention is not None:
            if s.intervention is None:
                raise ValueError(
                    "filter: intervention=... given, but the dataset has no "
                    "'complementary_info.is_intervention' feature"
                )
            if s.intervention != intervention:
                continue
        if min_length is not None and s.length < min_length:
            continue
        if max_length is not None and s.length > max_length:
            continue
        if tasks is not None and not tasks.intersection(s.tasks):
            continue
        if pred is not None and not pred(s):
            continue
        keep.append(s.index)
    return keep


def filter_dataset(
    src: str | Path,
    out: str | Path,
    *,
    success: bool | None = None,
    intervention: bool | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    task: str | Sequence[str] | None = None,
    where: str | Callable[[EpisodeSummary], bool] | None = None,
) -> list[int]:
    """Write the episodes of dataset ``src`` that pass the criteria (see :func:`select_episodes`)
    to a new dataset ``out``, renumbered from 0; returns the kept source episode indices.

    Raises:
        FileExistsError: ``out`` exists.
        ValueError: no episode passes, ``src`` is a recording root (merge it first), or a
            criterion needs a feature the dataset lacks.
    """
    # Wraps LeRobot 0.4.4's `lerobot.datasets.dataset_tools.delete_episodes` (we delete the
    # complement of the selection): it rewrites the parquet files with renumbered episode,
    # frame and task indices, keeps only the kept episodes' tasks, and recomputes stats.
    # Limits met there, which we guard or note: it re-encodes every video file that mixes kept
    # and dropped episodes with a hard-coded libsvtav1 (lossy a second time, and SVT-AV1 kills
    # the process below ~26 px, so we refuse small videos); it raises when nothing would be
    # deleted (we copy the dataset instead); it writes in place (we write a sibling and rename).
    src, out = Path(src), Path(out)
    if shards.is_recording_root(src):
        raise ValueError(f"filter: {src} is a recording root of shards; merge it first (rlinf-nb data merge)")
    require_dataset(src)
    if out.exists():
        raise FileExistsError(f"filter: output {out} already exists; pick a new path")
    summaries = episode_summaries(src)
    keep = select_episodes(
        summaries, success=success, intervention=intervention, min_length=min_length,
        max_length=max_length, task=task, where=where,
    )  # fmt: skip
    if not keep:
        raise ValueError(
            f"filter: no episode of {src} passes the criteria ({len(summaries)} episodes checked)"
        )
    drop = sorted({s.index for s in summaries} - set(keep))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_parent = Path(tempfile.mkdtemp(prefix=f".{out.name}.filtering-", dir=out.parent))
    tmp = tmp_parent / out.name
    try:
        if drop:
            _check_video_sizes(src)
            from lerobot.datasets.dataset_tools import delete_episodes

            quiet_datasets()
            with normal_scheduling():  # it re-encodes videos
                delete_episodes(open_dataset(src), drop, output_dir=tmp, repo_id=repo_id_for(out))
        else:
            shutil.copytree(src, tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp_parent, ignore_errors=True)
    return keep


def _check_video_sizes(src: Path) -> None:
    meta = open_metadata(src)
    for key in meta.video_keys:
        h, w = meta.features[key]["shape"][:2]
        if min(h, w) < 32:
            raise ValueError(
                f"filter: {src} stores {key!r} as {h}x{w} video; LeRobot's delete_episodes re-encodes "
                "with libsvtav1, which crashes below 32 px. Record small images with video=False."
            )
