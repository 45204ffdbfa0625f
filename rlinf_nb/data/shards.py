"""On-disk layout of a recording root: shards, completion markers, quarantine, the writer lock.

::

    root/
      .lock                  flock()ed by the one Recorder writing here (released when it dies)
      shard-000000/          a LeRobot v3 dataset, finalized
        .complete            JSON manifest, written atomically *after* LeRobot's finalize()
      shard-000001/          ... no .complete: unfinished (being written, or its writer died)
      quarantine/shard-000002/   an unfinished shard a later Recorder moved aside

A shard counts as finalized exactly when its ``.complete`` marker exists; readers (merge, info)
use only those. LeRobot 0.4.4 cannot read a dataset whose writer died before ``finalize()``
(RECIPES.md), which is why shards are small and each is finalized on its own.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MARKER",
    "QUARANTINE",
    "RecordingLock",
    "ShardScan",
    "fsync_tree",
    "is_recording_root",
    "lock_is_held",
    "quarantine_shard",
    "read_marker",
    "scan",
    "shard_dir",
    "write_marker",
]

MARKER = ".complete"
QUARANTINE = "quarantine"
LOCK = ".lock"
_SHARD_RE = re.compile(r"^shard-(\d{6,})(?:\.\d+)?$")


def shard_dir(root: Path, number: int) -> Path:
    return Path(root) / f"shard-{number:06d}"


def shard_number(path: Path) -> int | None:
    m = _SHARD_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class ShardScan:
    """What a recording root holds, by shard directory (each list sorted by shard number)."""

    finalized: list[Path]
    """shards with a completion marker: complete LeRobot datasets"""
    unfinished: list[Path]
    """shard directories without a marker (an active writer's shard, or a dead writer's)"""
    quarantined: list[Path]
    """unfinished shards moved aside by a later Recorder"""

    @property
    def next_number(self) -> int:
        """The shard number a new shard gets: one past every number ever used here."""
        nums = [shard_number(p) for p in (*self.finalized, *self.unfinished, *self.quarantined)]
        return max((n for n in nums if n is not None), default=-1) + 1


def scan(root: Path) -> ShardScan:
    root = Path(root)
    finalized, unfinished = [], []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.is_dir() and shard_number(p) is not None:
                (finalized if (p / MARKER).is_file() else unfinished).append(p)
    qdir = root / QUARANTINE
    quarantined = sorted(p for p in qdir.iterdir() if p.is_dir()) if qdir.is_dir() else []
    key = lambda p: (shard_number(p) or 0, p.name)  # noqa: E731
    return ShardScan(sorted(finalized, key=key), sorted(unfinished, key=key), sorted(quarantined, key=key))


def is_recording_root(path: Path) -> bool:
    """True for a directory of shards (as opposed to a single LeRobot dataset)."""
    path = Path(path)
    if (path / "meta" / "info.json").is_file():
        return False
    s = scan(path)
    return bool(s.finalized or s.unfinished or s.quarantined) or (path / LOCK).exists()


def quarantine_shard(root: Path, shard: Path) -> Path:
    """Move an unfinished shard to ``root/quarantine/`` (never overwriting); returns the new path."""
    qdir = Path(root) / QUARANTINE
    qdir.mkdir(exist_ok=True)
    dest = qdir / shard.name
    n = 1
    while dest.exists():
        dest = qdir / f"{shard.name}.{n}"
        n += 1
    os.replace(shard, dest)
    _fsync_dir(Path(root))
    return dest


def remove_empty_dirs(path: Path) -> None:
    """Remove ``path`` and its subdirectories if they hold no files."""
    if not path.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass


def remove_shard(shard: Path) -> None:
    shutil.rmtree(shard, ignore_errors=True)


# ----------------------------------------------------------------------------- markers


def write_marker(shard: Path, manifest: dict[str, Any]) -> None:
    """Write ``shard/.complete`` atomically (temp file, fsync, rename, fsync the directory)."""
    tmp = shard / f"{MARKER}.tmp"
    data = json.dumps({**manifest, "finalized_at": time.time()}, indent=2).encode()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, shard / MARKER)
    _fsync_dir(shard)


def read_marker(shard: Path) -> dict[str, Any]:
    return json.loads((Path(shard) / MARKER).read_text())


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under ``path`` (once per shard, not per frame)."""
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- lock


class RecordingLock:
    """An exclusive ``flock`` on ``root/.lock``: one writer per root; the kernel drops it if we die."""

    def __init__(self, root: Path):
        self.path = Path(root) / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise RuntimeError(
                    f"another Recorder is writing to {self.path.parent} (it holds {self.path}); "
                    "close it first or record into another root"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def lock_is_held(root: Path) -> bool:
    """Whether a live Recorder holds ``root``'s lock right now."""
    path = Path(root) / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
