"""Opening local LeRobot datasets offline, the way that works here (pyav, explicit roots).

LeRobot treats a missing or broken local dataset as "download it from the Hub", which offline
surfaces as a misleading Hub error; we check the files first and raise ``FileNotFoundError``.
Videos are always decoded with ``pyav``: LeRobot's default, torchcodec, cannot load its FFmpeg
libraries on this machine (RECIPES.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "LOCAL_REPO_PREFIX",
    "open_dataset",
    "open_metadata",
    "quiet_datasets",
    "repo_id_for",
    "require_dataset",
]

#: repo ids only label local datasets (LeRobot needs one); nothing is ever pushed
LOCAL_REPO_PREFIX = "local"


def repo_id_for(path: Path) -> str:
    return f"{LOCAL_REPO_PREFIX}/{Path(path).name}"


def require_dataset(path: Path) -> Path:
    path = Path(path)
    if not (path / "meta" / "info.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a LeRobot dataset (no meta/info.json); a recording root of shards "
            "needs `merge` first (rlinf-nb data merge ROOT OUT)"
        )
    return path


def open_metadata(path: Path) -> Any:
    """``LeRobotDatasetMetadata`` of a local dataset (reads only ``meta/``)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    path = require_dataset(path)
    quiet_datasets()
    return LeRobotDatasetMetadata(repo_id_for(path), root=path)


def open_dataset(path: Path, **kwargs: Any) -> Any:
    """``LeRobotDataset(repo_id, root=path, video_backend="pyav", **kwargs)`` for a local dataset."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    path = require_dataset(path)
    quiet_datasets()
    kwargs.setdefault("video_backend", "pyav")
    return LeRobotDataset(repo_id_for(path), root=path, **kwargs)


def quiet_datasets() -> None:
    """Silence Hugging Face ``datasets`` progress bars (LeRobot prints several per episode).

    Process-wide (that is how ``datasets`` offers it); every tool here calls it."""
    import datasets

    datasets.disable_progress_bars()
