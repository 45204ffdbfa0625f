"""Helpers for tests: run the CLI or a Python snippet in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "rlinf_nb.cli"]


def run_cli(*args: str, home: Path | None = None, timeout: float = 300, env: dict | None = None):
    """Run ``rlinf-nb ARGS`` in a subprocess; returns the CompletedProcess."""
    full_env = dict(os.environ)
    if home is not None:
        full_env["RLINF_NB_HOME"] = str(home)
    full_env.update(env or {})
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )


def run_py(code: str, home: Path | None = None, timeout: float = 180, env: dict | None = None):
    """Run a Python snippet in a fresh interpreter (a stand-in for a second kernel)."""
    full_env = dict(os.environ)
    if home is not None:
        full_env["RLINF_NB_HOME"] = str(home)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )
