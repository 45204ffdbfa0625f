#!/usr/bin/env python
"""Is this machine ready for rlinf-nb? Prints a table and exits non-zero if anything is not.

Run by ``scripts/setup.sh`` (``make setup``) after the venv is synced; run it again any time with
``.venv/bin/python scripts/selfcheck.py``. Checks: the Python version, the stack's imports,
Vulkan (SAPIEN needs a device even on the CPU), one ManiSkill RGB frame, headless Chromium, and
a throwaway Ray head started and stopped under a private RLINF_NB_HOME (the user's cluster is
never touched). Slow or fragile checks run in subprocesses with timeouts, so a hang cannot block
setup. About 60-90 s on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIX_SETUP = "run `make setup` (uv sync --frozen --all-extras from uv.lock)"
FIX_SYSTEM = "run `bash scripts/setup_system.sh` (Mesa lavapipe >= 24.3 from bookworm-backports)"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# module -> distribution name (for the version); rlinf_nb's subpackages have no version of their own
STACK = {
    "torch": "torch",
    "torchvision": "torchvision",
    "ray": "ray",
    "lerobot": "lerobot",
    "mani_skill": "mani-skill",
    "sapien": "sapien",
    "gymnasium": "gymnasium",
    "ipywidgets": "ipywidgets",
    "jupyterlab": "jupyterlab",
    "anywidget": "anywidget",
    "plotly": "plotly",
    "pandas": "pandas",
    "zstandard": "zstandard",
    "lz4": "lz4",
    "rlinf_nb": "rlinf-nb",
    "rlinf_nb.runtime": None,
    "rlinf_nb.widgets": None,
    "rlinf_nb.robots": None,
}


class CheckFailed(Exception):
    """A check's failure; the message says what is wrong and how to fix it."""


# ----------------------------------------------------------------------------- helpers


def _run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None):
    """Run ``cmd`` in its own process group; kill the whole group on timeout."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise CheckFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd[:3])} ...") from None
    finally:
        _LIVE.discard(proc)
    return proc.returncode, out, err


_LIVE: set[subprocess.Popen] = set()  # check subprocesses running now (killed on Ctrl-C)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _py_json(code: str, timeout: float) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is a JSON object."""
    rc, out, err = _run([sys.executable, "-c", code], timeout=timeout, cwd=REPO)
    if rc != 0:
        raise CheckFailed(f"exit {rc}: {_last_line(err or out)}")
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CheckFailed(f"unexpected output: {_last_line(out + err)}") from None


# ----------------------------------------------------------------------------- checks


def check_python() -> str:
    v = sys.version_info
    text = f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) != (3, 11):
        raise CheckFailed(f"{text}; need 3.11 (lerobot 0.4.4): {FIX_SETUP}")
    return text


def check_imports() -> str:
    from importlib import import_module, metadata

    found, missing = [], []
    for module, dist in STACK.items():
        try:
            mod = import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import error means "not ready"
            missing.append(f"{module} ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if dist is None:
            found.append(module)
            continue
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = getattr(mod, "__version__", "?")
        found.append(f"{module} {version}")
    if missing:
        raise CheckFailed(f"cannot import: {'; '.join(missing)}; {FIX_SETUP}")
    return ", ".join(found)


_VULKAN_CODE = """
import json, sapien.render
print(json.dumps({"summary": sapien.render.get_device_summary()}))
"""


def check_vulkan() -> str:
    summary = _py_json(_VULKAN_CODE, timeout=60)["summary"]
    devices, current = [], None
    for line in summary.splitlines():
        if line.startswith("GPU:") or line.startswith("CPU:"):
            current = line.split(":", 1)[1].strip()
        elif "Supported:" in line and current is not None:
            devices.append((current, line.split(":", 1)[1].strip() == "1"))
    supported = [name for name, ok in devices if ok]
    if not supported:
        seen = ", ".join(name for name, _ in devices) or "no Vulkan device at all"
        raise CheckFailed(f"SAPIEN finds no supported rendering device ({seen}); {FIX_SYSTEM}")
    return "SAPIEN device: " + ", ".join(supported)


_MANISKILL_CODE = """
import json, time, warnings
warnings.filterwarnings("ignore")
t0 = time.time()
import gymnasium as gym
import mani_skill.envs  # noqa: F401  (registers the envs)
env = gym.make("PushCube-v1", obs_mode="rgb", sim_backend="physx_cpu", render_backend="cpu", num_envs=1)
try:
    obs, _ = env.reset(seed=0)
    rgb = obs["sensor_data"]["base_camera"]["rgb"]
    rgb = rgb.cpu().numpy() if hasattr(rgb, "cpu") else rgb
    print(json.dumps({"shape": list(rgb.shape), "dtype": str(rgb.dtype), "max": int(rgb.max()),
                      "mean": float(rgb.mean()), "secs": time.time() - t0}))
finally:
    env.close()
"""


def check_maniskill() -> str:
    res = _py_json(_MANISKILL_CODE, timeout=120)
    shape = res["shape"]
    if len(shape) != 4 or shape[-1] != 3 or min(shape) < 1:
        raise CheckFailed(f"unexpected frame shape {shape} (want [1, H, W, 3])")
    if res["max"] == 0:
        raise CheckFailed(f"the {shape} frame is all zeros: the CPU renderer draws nothing; {FIX_SYSTEM}")
    return (
        f"PushCube-v1 physx_cpu/cpu: frame {'x'.join(map(str, shape))} {res['dtype']}, "
        f"mean {res['mean']:.0f} (env up in {res['secs']:.0f} s)"
    )


def check_chromium() -> str:
    exe = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if exe is None:
        raise CheckFailed("chromium not found (the browser tests drive it); " + FIX_SYSTEM.split(" (")[0])
    profile = tempfile.mkdtemp(prefix="rnb-chromium-")
    try:
        rc, out, err = _run(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", "about:blank"], timeout=60
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if rc != 0 or "<body" not in out:
        raise CheckFailed(f"headless chromium failed (exit {rc}): {_last_line(err or out)}")
    rc, version, _ = _run([exe, "--version"], timeout=30)
    return f"{_last_line(version)}: headless --dump-dom ok"


def check_ray() -> str:
    """Start and stop a throwaway head with our own cluster code under a fresh RLINF_NB_HOME."""
    import psutil

    home = tempfile.mkdtemp(prefix="rnb-sc-", dir="/tmp")  # short: Ray's socket paths are limited
    old_home = os.environ.get("RLINF_NB_HOME")
    os.environ["RLINF_NB_HOME"] = home
    try:
        from rlinf_nb.runtime import cluster

        from rlinf_nb.connection import attach, cluster_info, detach

        log: list[str] = []
        state = None
        try:
            t0 = time.time()
            state, started = cluster.up(echo=log.append, timeout=90)
            t_up = time.time() - t0
            if not started or not cluster.gcs_answers(state.address):
                raise CheckFailed(f"the GCS at {state.address} does not answer after start")
            attach(start=False, quiet=True)
            try:
                alive = [n for n in cluster_info()["nodes"] if n["alive"]]
            finally:
                detach()
            if not alive:
                raise CheckFailed(f"the GCS at {state.address} answered but lists no alive node")
        except cluster.ClusterError as exc:
            raise CheckFailed(f"{str(exc).splitlines()[0]} (see {home}/cluster/ray-start.log)") from None
        finally:
            if state is not None:
                t1 = time.time()
                cluster.down(echo=log.append)
                t_down = time.time() - t1
        left = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(cluster.CLUSTER_ID_ENV) == state.cluster_id:
                    left.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if left:
            raise CheckFailed(f"processes of the test cluster survived `down`: {left}")
        if cluster.gcs_answers(state.address):
            raise CheckFailed(f"the GCS at {state.address} still answers after `down`")
        retried = " after a retry" if any("retrying" in line for line in log) else ""
        return (
            f"head {state.address} up in {t_up:.0f} s{retried} (token auth, {len(alive)} alive node), "
            f"down in {t_down:.0f} s, no process left"
        )
    finally:
        if old_home is None:
            os.environ.pop("RLINF_NB_HOME", None)
        else:
            os.environ["RLINF_NB_HOME"] = old_home
        shutil.rmtree(home, ignore_errors=True)


# (name, check, background). A background check only waits on its own subprocess, so it runs in a
# thread beside the ones before it; the Ray check runs alone (Ray's start-up is timing-sensitive).
CHECKS: list[tuple[str, Callable[[], str], bool]] = [
    ("python 3.11", check_python, False),
    ("stack imports", check_imports, False),
    ("vulkan (sapien)", check_vulkan, False),
    ("maniskill rgb frame", check_maniskill, True),
    ("headless chromium", check_chromium, False),
    ("ray head up/down", check_ray, False),
]


def _timed(fn: Callable[[], str]) -> tuple[str, str, float]:
    """``(status, detail, seconds)`` of one check; a crashing check is a failed check."""
    t0 = time.time()
    try:
        detail, status = fn(), "ok"
    except CheckFailed as exc:
        detail, status = str(exc), "FAIL"
    except Exception as exc:  # noqa: BLE001
        detail, status = f"{type(exc).__name__}: {exc}", "FAIL"
    return status, detail, time.time() - t0


# ----------------------------------------------------------------------------- table

NAME_W, STATUS_W, TIME_W, DETAIL_W = 20, 6, 7, 84


def _row(name: str, status: str, secs: str, detail: str) -> str:
    lines = textwrap.wrap(detail, DETAIL_W) or [""]
    first = f"{name:<{NAME_W}} {status:<{STATUS_W}} {secs:>{TIME_W}}  {lines[0]}"
    pad = " " * (NAME_W + STATUS_W + TIME_W + 4)
    return "\n".join([first, *(pad + ln for ln in lines[1:])])


def main() -> int:
    print("rlinf-nb self-check")
    print(_row("check", "status", "time", "detail / how to fix"))
    print("-" * (NAME_W + STATUS_W + TIME_W + 4 + DETAIL_W))
    failed = []
    t_all = time.time()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        background = {name: pool.submit(_timed, fn) for name, fn, bg in CHECKS if bg}
        for name, fn, _ in CHECKS:
            status, detail, secs = background[name].result() if name in background else _timed(fn)
            if status != "ok":
                failed.append(name)
            print(_row(name, status, f"{secs:.1f}s", detail), flush=True)
    except KeyboardInterrupt:
        for proc in list(_LIVE):
            _kill_group(proc)
        print("\nself-check interrupted", file=sys.stderr)
        return 130
    finally:
        pool.shutdown(wait=True)
    print("-" * (NAME_W + STATUS_W + TIME_W + 4 + DETAIL_W))
    total = f"{time.time() - t_all:.0f} s"
    if failed:
        print(f"NOT READY ({total}): {len(failed)} check(s) failed: {', '.join(failed)}")
        return 1
    print(f"all {len(CHECKS)} checks ok ({total})")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything this script started is stopped by now; skip the interpreter's teardown of
    # torch, ray and friends (5-15 s on a busy 2-core machine).
    os._exit(code)
