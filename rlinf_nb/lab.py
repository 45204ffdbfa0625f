"""``rlinf-nb lab`` (``make lab``): our cluster, then JupyterLab on 127.0.0.1 with a token.

The cluster is started (or found) first and keeps running after the lab stops: kernels attach
to it, it does not belong to them. JupyterLab runs in the foreground from this venv's Python,
so its default ``python3`` kernel is this venv's interpreter, and it inherits ``RLINF_NB_HOME``
so notebooks attach to the same cluster. Its config, data, settings and workspaces live under
``rlinf_nb.paths.home()/"lab"``: ``~/.jupyter`` is neither read nor changed, and the setup is
the same every time (default kernel auto-starts, no news or update checks).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import webbrowser
from pathlib import Path

from rlinf_nb import paths

HOST = "127.0.0.1"
_PORT_TRIES = 50

# JupyterLab user settings we own: plugin id -> values merged into the user's settings file.
_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def lab_dir() -> Path:
    """Where the lab keeps its Jupyter dirs, token and ``url.txt``."""
    path = paths.home() / "lab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def url_file() -> Path:
    return lab_dir() / "url.txt"


def default_root() -> Path:
    """The repository root (where ``notebooks/`` lives), else the current directory."""
    repo = Path(__file__).resolve().parents[1]
    return repo if (repo / "notebooks").is_dir() else Path.cwd()


def port_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on ``host:port`` (a port left in TIME_WAIT counts as free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(port: int, host: str = HOST) -> int:
    """``port`` if nothing listens there, else the next free one above it."""
    for candidate in range(port, min(port + _PORT_TRIES, 65536)):
        if port_free(candidate, host):
            return candidate
    raise OSError(f"no free port in {port}..{port + _PORT_TRIES - 1} on {host}; pass another --port")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (it holds the token)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _write_settings(settings_dir: Path) -> None:
    """Merge our settings into JupyterLab's user settings (a file it cannot parse is left alone)."""
    for plugin, values in _SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        current: dict = {}
        if path.exists():
            try:
                current = json.loads(path.read_text() or "{}")
            except ValueError:
                continue  # JSON5 with comments, written by the user through the UI: theirs
        if all(current.get(k) == v for k, v in values.items()):
            continue
        current.update(values)
        path.write_text(json.dumps(current, indent=2) + "\n")


def _write_kernelspec(data_dir: Path) -> None:
    """A ``python3`` kernelspec that names this venv's interpreter explicitly."""
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (rlinf-nb)",
        "language": "python",
        "metadata": {"debugger": True},
    }
    path = data_dir / "kernels" / "python3" / "kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(spec, indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def lab_env(token_file: Path) -> dict[str, str]:
    """The server's environment: our Jupyter dirs, our home, the token by file (not argv)."""
    base = lab_dir()
    dirs = {
        "JUPYTER_CONFIG_DIR": base / "config",
        "JUPYTER_DATA_DIR": base / "data",
        "JUPYTER_RUNTIME_DIR": base / "runtime",
        "JUPYTERLAB_SETTINGS_DIR": base / "settings",
        "JUPYTERLAB_WORKSPACES_DIR": base / "workspaces",
        "IPYTHONDIR": base / "ipython",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "JUPYTER_PATH")}
    env.update({k: str(v) for k, v in dirs.items()})
    env["JUPYTER_TOKEN_FILE"] = str(token_file)
    env["JUPYTER_PREFER_ENV_PATH"] = "0"  # our data dir (and its python3 kernelspec) first
    env[paths.HOME_ENV] = str(paths.home())  # kernels attach to the same cluster
    return env


def lab_command(port: int, root: Path) -> list[str]:
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.expose_app_in_browser=True",
    ]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def _has_display() -> bool:
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open_when_ready(url: str, port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.3)
    else:
        return
    try:
        webbrowser.open(url)
    except Exception:  # noqa: BLE001 - a browser that will not open is not an error
        pass


class _Stop(Exception):
    """Raised in the main thread by SIGINT/SIGTERM/SIGHUP so they all shut down like Ctrl-C."""


def _raise_stop(signum, frame):
    raise _Stop(signum)


def _stop_server(proc: subprocess.Popen, grace: float = 20.0) -> int:
    """SIGTERM the server (it shuts its kernels down), SIGKILL its group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print(f"[rlinf-nb] JupyterLab did not stop in {grace:.0f} s; killing it", flush=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait()


def serve_lab(
    port: int = 8888,
    open_path: str = "notebooks/00_quickstart.ipynb",
    no_browser: bool = True,
    root_dir: str | Path | None = None,
    token: str | None = None,
) -> int:
    """Ensure our cluster is up, then run JupyterLab in the foreground until Ctrl-C.

    Listens on 127.0.0.1 only, with a token (a fresh random one unless given), on ``port`` or
    the next free port above it. Prints the URL that opens ``open_path`` (relative to
    ``root_dir``, default the repo root) and writes it to ``<home>/lab/url.txt``. Ctrl-C (or
    SIGTERM) stops JupyterLab and its kernels; the cluster keeps running. Returns the server's
    exit status (0 after a clean shutdown).
    """
    from rlinf_nb.runtime import cluster

    print("[rlinf-nb] checking the local cluster ...", flush=True)
    state, started = cluster.up(echo=lambda msg: print(msg, flush=True))
    how = "started" if started else "already running"
    print(
        f"[rlinf-nb] cluster {how} at {state.address} ({len(state.nodes)} node(s)); "
        "it keeps running after the lab stops (`rlinf-nb cluster down` stops it)",
        flush=True,
    )

    root = Path(root_dir).expanduser().resolve() if root_dir is not None else default_root()
    if not root.is_dir():
        raise FileNotFoundError(f"the lab's root dir {root} does not exist")
    rel = Path(open_path)
    if rel.is_absolute():
        try:
            rel = rel.resolve().relative_to(root)
        except ValueError:
            raise FileNotFoundError(f"{open_path} is not inside the lab's root dir {root}") from None
    if not (root / rel).exists():
        print(f"[rlinf-nb] warning: {root / rel} does not exist; the lab opens on it anyway", flush=True)

    chosen = pick_port(port)
    if chosen != port:
        print(f"[rlinf-nb] port {port} is busy; using {chosen}", flush=True)
    token = token or secrets.token_hex(24)
    base = lab_dir()
    token_file = base / "token"
    _write_private(token_file, token)
    env = lab_env(token_file)
    _write_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
    _write_kernelspec(Path(env["JUPYTER_DATA_DIR"]))

    url = f"http://{HOST}:{chosen}/lab/tree/{rel.as_posix()}?token={token}"
    _write_private(url_file(), url + "\n")
    print(f"[rlinf-nb] JupyterLab: {url}", flush=True)
    print(f"[rlinf-nb] (also in {url_file()}; Ctrl-C stops the lab, the cluster keeps running)", flush=True)

    # Own session: a terminal Ctrl-C reaches only us, and we stop the server with SIGTERM (no
    # "Shut down this Jupyter server (y/[n])?" prompt, kernels shut down by the server).
    proc = subprocess.Popen(
        lab_command(chosen, root),
        env=env,
        cwd=root,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    if not no_browser and _has_display():
        threading.Thread(target=_open_when_ready, args=(url, chosen, proc), daemon=True).start()

    # SIGINT explicitly too: a process started in the background of a non-interactive shell
    # inherits SIGINT as ignored, and Python then never raises KeyboardInterrupt.
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, _raise_stop) for sig in stop_signals}
    try:
        rc = proc.wait()
        print(f"[rlinf-nb] JupyterLab exited ({rc})", flush=True)
        return rc
    except (KeyboardInterrupt, _Stop):
        print("\n[rlinf-nb] stopping JupyterLab (the cluster keeps running) ...", flush=True)
        rc = _stop_server(proc)
        print("[rlinf-nb] JupyterLab stopped", flush=True)
        return 0 if rc in (0, -signal.SIGTERM) else rc
    finally:
        if proc.poll() is None:  # any other exception: never leave the server behind
            _stop_server(proc)
        for sig, handler in old.items():
            signal.signal(sig, handler)
