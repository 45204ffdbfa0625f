"""A run is its directory: ``runs/<name>/`` under the rlinf-nb home.

Layout::

    runs/<name>/
      config.yaml          the resolved config (written once at launch)
      metrics.jsonl        append-only, one JSON row per update step
      events.jsonl         append-only: hparams, pauses, overrides, recoveries, checkpoints
      checkpoints/
        ckpt-00000010/     state.pt + manifest.json (the manifest is written last)

Nothing here is ever left half-written in a way a reader could mistake for whole:
log rows are single ``write`` calls of one line followed by flush+fsync, and a
torn last line (a writer killed mid-row) is skipped on read; a checkpoint is
complete only when its manifest exists and every file it lists has the recorded
size and checksum.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlinf_nb import paths

CHECKPOINT_PREFIX = "ckpt-"
MANIFEST = "manifest.json"


def run_path(name: str) -> Path:
    return paths.runs_dir() / name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync and rename.

    The temp file is per process and thread: two threads writing one path (the controller's loop and a
    control call) each rename a whole file of their own, never one the other is still writing.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as compact JSON (numpy values as plain numbers and lists)."""
    atomic_write_bytes(path, json.dumps(obj, default=_json_default, separators=(",", ":")).encode())


class JsonlLog:
    """An append-only JSON-lines log that tolerates a torn last line."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=_json_default, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = []
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # a writer died mid-row: the torn tail is not data
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    path: Path
    step: int
    env_steps: int
    created: float


class RunDir:
    """The on-disk record of one run."""

    def __init__(self, name: str, root: Path | None = None):
        self.name = name
        self.path = (root or paths.runs_dir()) / name
        self.metrics = JsonlLog(self.path / "metrics.jsonl")
        self.events = JsonlLog(self.path / "events.jsonl")
        self.checkpoints = self.path / "checkpoints"

    @property
    def exists(self) -> bool:
        return (self.path / "config.yaml").exists()

    def create(self, config: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        atomic_write_bytes(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    # ------------------------------------------------------------------ last known status

    def write_status(self, status: dict[str, Any]) -> None:
        """Atomically record the controller's status (read when the controller is gone)."""
        atomic_write_json(self.path / "status.json", status)

    def read_status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None

    # ------------------------------------------------------------------ the timeline

    @property
    def trace_path(self) -> Path:
        return self.path / "trace.json"

    def write_trace(self, trace: dict[str, Any]) -> None:
        """Atomically keep the run's last timeline (Trace Event Format, see :mod:`.trace`)."""
        atomic_write_json(self.trace_path, trace)

    def read_trace(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.trace_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, step: int, env_steps: int, state: dict[str, Any], keep: int = 3) -> Path:
        """Write ``state`` (a torch-saveable dict) as checkpoint ``step``; the manifest goes last."""
        import torch

        final = self.checkpoints / f"{CHECKPOINT_PREFIX}{step:08d}"
        if final.exists():
            shutil.rmtree(final)
        final.mkdir(parents=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        atomic_write_bytes(final / "state.pt", blob)
        manifest = {
            "step": step,
            "env_steps": env_steps,
            "created": time.time(),
            "files": {"state.pt": {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}},
        }
        atomic_write_bytes(final / MANIFEST, json.dumps(manifest, indent=1).encode())
        self._prune(keep)
        return final

    def _prune(self, keep: int) -> None:
        complete = self.list_checkpoints()
        for info in complete[:-keep] if keep > 0 else []:
            shutil.rmtree(info.path, ignore_errors=True)

    @staticmethod
    def _verify(ckpt: Path) -> CheckpointInfo | None:
        manifest_path = ckpt / MANIFEST
        if not manifest_path.exists():
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            for fname, meta in manifest["files"].items():
                fpath = ckpt / fname
                if not fpath.exists() or fpath.stat().st_size != meta["bytes"]:
                    return None
            return CheckpointInfo(
                ckpt, int(manifest["step"]), int(manifest["env_steps"]), float(manifest["created"])
            )
        except (ValueError, KeyError, OSError):
            return None

    def list_checkpoints(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first (half-written ones are skipped)."""
        if not self.checkpoints.exists():
            return []
        found = []
        for ckpt in sorted(self.checkpoints.glob(f"{CHECKPOINT_PREFIX}*")):
            info = self._verify(ckpt)
            if info is not None:
                found.append(info)
        return sorted(found, key=lambda c: c.step)

    def latest_checkpoint(self) -> CheckpointInfo | None:
        complete = self.list_checkpoints()
        return complete[-1] if complete else None

    def load_checkpoint(self, info: CheckpointInfo) -> dict[str, Any]:
        import torch

        blob = (info.path / "state.pt").read_bytes()
        manifest = json.loads((info.path / MANIFEST).read_text())
        if hashlib.sha256(blob).hexdigest() != manifest["files"]["state.pt"]["sha256"]:
            raise ValueError(f"checkpoint {info.path} is corrupt (checksum mismatch)")
        return torch.load(io.BytesIO(blob), weights_only=False)


def dedupe_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics log's rows as the run's history: rows are appended in step order, so a row whose step is
    not past the previous one starts a re-run from a checkpoint (``resume=True``, a restored learner).
    It replaces the rows of its step and after: those belong to the lost timeline, even the steps the
    re-run has not reached (yet)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        while out and out[-1]["step"] >= row["step"]:
            out.pop()
        out.append(row)
    return out
