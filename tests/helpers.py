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


def assert_learners_continue_identically(learner, other, cfg, seed: int) -> None:
    """Two off-policy learners (one restored from the other's checkpoint) train 3 more steps alike:
    same metrics, same critic weights, same policy weights."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    m1 = learner.train(3, cfg)
    torch.manual_seed(seed)
    m2 = other.train(3, cfg)
    assert m1 == m2
    for a, b in zip(learner.critic.state_dict().values(), other.critic.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for k, v in learner.policy_state().items():
        np.testing.assert_array_equal(v, other.policy_state()[k])


# ----------------------------------------------------------------------------- fault injection on a live run


def sigkill_worker(run, group: str) -> int:
    """SIGKILL a live worker of ``run``'s worker group ``group`` (``env``, ``rollout``, ``actor``); returns its pid."""
    import signal

    pid = next(h["pid"] for h in run.health()["groups"][group] if h["alive"])
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_while_running(run, until, timeout: float, what: str, poll: float = 0.3):
    """Poll ``until(status)`` until it gives something other than None or False (returned), failing at once
    if the run fails or ends."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        st = run.status()
        assert st["state"] not in ("failed", "finished", "stopped"), st["error"]
        value = until(st)
        if type(value).__name__ in ("bool", "bool_"):  # numpy's booleans too
            value = bool(value)
        if value is not None and value is not False:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} not seen within {timeout:.0f} s: {run.status()}")


def learner_recovery(run):
    """The run's first ``recovery`` event of the learner group (``actor``), or None."""
    events = run.events()
    if "group" not in events:
        return None
    found = events[(events["kind"] == "recovery") & (events["group"] == "actor")]
    return found.iloc[0] if len(found) else None
