"""Shared fixtures: one real local Ray cluster for the whole test session.

The cluster is started through the CLI in a subprocess (as a user would) under a
private RLINF_NB_HOME, and stopped the same way at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# A short home keeps Ray's unix-socket paths under their length limit.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="rnb-", dir="/tmp"))
os.environ["RLINF_NB_HOME"] = str(_SESSION_HOME)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.helpers import run_cli  # noqa: E402


@pytest.fixture(scope="session")
def session_home() -> Path:
    return _SESSION_HOME


@pytest.fixture(scope="session")
def cluster(session_home: Path):
    """A real local cluster, up for the whole session (started via `rlinf-nb cluster up`)."""
    proc = run_cli("cluster", "up", home=session_home, timeout=600)
    assert proc.returncode == 0, f"cluster up failed:\n{proc.stdout}\n{proc.stderr}"
    from rlinf_nb.runtime import cluster as cluster_mod

    state = cluster_mod.read_state()
    assert state is not None and cluster_mod.is_up(state)
    yield state
    import ray

    if ray.is_initialized():
        ray.shutdown()
    down = run_cli("cluster", "down", home=session_home, timeout=120)
    assert down.returncode == 0, down.stderr
    shutil.rmtree(session_home, ignore_errors=True)


@pytest.fixture(scope="session")
def attached(cluster):
    """This test process attached to the session cluster."""
    import rlinf_nb as rl

    return rl.attach(start=False, quiet=True)


def pytest_sessionfinish(session, exitstatus):
    """Kill whatever this session started and left running (a kernel, a browser, a driver).

    A leaked child keeps the session's stdout open and can spin once the cluster is gone, so
    the suite would never be seen to finish. Leaks are printed: each one is a bug to fix.
    """
    import psutil

    leftovers = psutil.Process().children(recursive=True)
    for proc in leftovers:
        try:
            print(f"\n[conftest] killing leftover process {proc.pid}: {' '.join(proc.cmdline())[:160]}")
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(leftovers, timeout=10)
