"""Where rlinf-nb keeps its state on disk.

Everything lives under one home directory: ``$RLINF_NB_HOME`` if set, else
``$XDG_DATA_HOME/rlinf-nb`` (``~/.local/share/rlinf-nb``). The local cluster's
state file, auth token and Ray temp dir are under ``cluster/``; runs are under
``runs/<name>/``. Nothing is written to the shared ``/tmp/ray``.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "RLINF_NB_HOME"


def home() -> Path:
    """The rlinf-nb home directory (created on first use)."""
    env = os.environ.get(HOME_ENV)
    if env:
        root = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        root = Path(xdg) / "rlinf-nb"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def cluster_dir() -> Path:
    """State of the local persistent cluster: state file, token, Ray temp dir."""
    path = home() / "cluster"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """Parent of every run directory."""
    path = home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path
