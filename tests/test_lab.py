"""`rlinf-nb lab` serves JupyterLab safely, and every notebook runs top to bottom headless."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.helpers import CLI, REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
URL_RE = re.compile(r"http://127\.0\.0\.1:(\d+)/lab/tree/(\S+)\?token=([0-9a-zA-Z_-]+)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, body: dict, timeout: float = 60.0) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _non_loopback_ipv4() -> list[str]:
    return sorted(
        {
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")
        }
    )


def _start_lab(home: Path, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, RLINF_NB_HOME=str(home))
    with log.open("wb") as out:
        return subprocess.Popen(
            [*CLI, "lab", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_ready(proc: subprocess.Popen, home: Path, log: Path, timeout: float = 120.0) -> tuple[str, str]:
    """Wait for url.txt and the server to answer; returns (base url, token)."""
    url_txt = home / "lab" / "url.txt"
    deadline = time.time() + timeout
    base = token = None
    while time.time() < deadline:
        assert proc.poll() is None, f"`rlinf-nb lab` exited early ({proc.returncode}):\n{log.read_text()}"
        if base is None and url_txt.exists():
            match = URL_RE.fullmatch(url_txt.read_text().strip())
            assert match, f"url.txt holds no lab URL: {url_txt.read_text()!r}"
            base, token = f"http://127.0.0.1:{match.group(1)}", match.group(3)
        if base is not None:
            try:
                status, _ = _get(f"{base}/api/status?token={token}", timeout=2)
                if status == 200:
                    return base, token
            except OSError:
                pass
        time.sleep(0.5)
    raise AssertionError(f"the lab did not come up in {timeout:.0f} s:\n{log.read_text()}")


def _server_procs(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _listening_addresses(procs: list[psutil.Process]) -> list:
    """The listening inet addresses of these processes; one that exits meanwhile (a short-lived helper) is skipped."""
    addrs = []
    for p in procs:
        try:
            addrs += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    return addrs


def _stop(proc: subprocess.Popen, sig: int, timeout: float = 60.0) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        for child in _server_procs(proc):
            child.kill()
        raise AssertionError(f"`rlinf-nb lab` did not exit within {timeout:.0f} s of signal {sig}") from None


def test_lab_serves_on_loopback_with_token(cluster, session_home: Path, tmp_path: Path):
    from rlinf_nb.runtime import cluster as cluster_mod

    url_txt = session_home / "lab" / "url.txt"
    url_txt.unlink(missing_ok=True)
    port = _free_port()
    log = tmp_path / "lab.log"
    proc = _start_lab(session_home, port, log)
    server = []
    try:
        base, token = _wait_ready(proc, session_home, log)
        printed = URL_RE.search(log.read_text())
        assert printed, f"no URL printed:\n{log.read_text()}"
        assert printed.group(0) == url_txt.read_text().strip()
        assert printed.group(1) == str(port)
        assert printed.group(2) == "notebooks/00_quickstart.ipynb"
        assert (url_txt.stat().st_mode & 0o777) == 0o600

        status, body = _get(f"{base}/api/contents/notebooks/00_quickstart.ipynb?token={token}")
        assert status == 200, body[:500]
        model = json.loads(body)
        assert model["type"] == "notebook" and model["content"]["cells"]

        status, _ = _get(f"{base}/api/contents/notebooks/00_quickstart.ipynb")
        assert status in (401, 403), f"the API answered {status} without the token"
        status, _ = _get(f"{base}/api/contents/notebooks/00_quickstart.ipynb?token=wrong{token}")
        assert status in (401, 403), f"the API answered {status} to a wrong token"

        # Loopback only: every listening socket of the server is on 127.0.0.1, and the machine's
        # other addresses refuse the port.
        server = _server_procs(proc)
        listening = _listening_addresses(server)
        assert any(addr.port == port for addr in listening), listening
        assert all(addr.ip == "127.0.0.1" for addr in listening), listening
        for ip in _non_loopback_ipv4():
            with pytest.raises(OSError):
                socket.create_connection((ip, port), timeout=2).close()

        # The kernel is the venv's python and inherits RLINF_NB_HOME.
        status, body = _post(f"{base}/api/kernels?token={token}", {"name": "python3"})
        assert status in (200, 201), body[:500]
        time.sleep(1)
        server = _server_procs(proc)
        kernels = [p for p in server if "ipykernel_launcher" in " ".join(p.cmdline())]
        assert kernels, [p.cmdline() for p in server]
        assert kernels[0].cmdline()[0] == sys.executable
        assert kernels[0].environ().get("RLINF_NB_HOME") == str(session_home)
    except BaseException:
        _stop(proc, signal.SIGTERM)
        raise

    # Ctrl-C: the lab and its kernel stop, the cluster keeps running.
    rc = _stop(proc, signal.SIGINT)
    assert rc == 0, log.read_text()
    _, alive = psutil.wait_procs(server, timeout=15)
    assert not alive, f"left running after Ctrl-C: {[p.cmdline() for p in alive]}"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert cluster_mod.is_up(cluster), "the cluster stopped with the lab"


def test_lab_takes_next_free_port_and_stops_on_sigterm(cluster, session_home: Path, tmp_path: Path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    (session_home / "lab" / "url.txt").unlink(missing_ok=True)
    log = tmp_path / "lab.log"
    proc = _start_lab(session_home, port, log)
    try:
        base, token = _wait_ready(proc, session_home, log)
        assert not base.endswith(f":{port}"), base
        assert f"port {port} is busy" in log.read_text()
        server = _server_procs(proc)
    except BaseException:
        _stop(proc, signal.SIGTERM)
        raise
    finally:
        busy.close()
    assert _stop(proc, signal.SIGTERM) == 0, log.read_text()
    _, alive = psutil.wait_procs(server, timeout=15)
    assert not alive, f"left running after SIGTERM: {[p.cmdline() for p in alive]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_headless(cluster, session_home: Path, tmp_path: Path, path: Path):
    """Every notebook in notebooks/ runs top to bottom in a venv kernel without errors."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    spec_dir = tmp_path / "kernels" / "rlinf-nb-venv"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "rlinf-nb venv",
                "language": "python",
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    km = KernelManager(kernel_name="rlinf-nb-venv", kernel_spec_manager=ksm)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        km=km,
        timeout=600,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    env = dict(os.environ, RLINF_NB_HOME=str(session_home), RLINF_NB_CI="1")
    try:
        client.execute(env=env)  # raises CellExecutionError naming the failing cell
    finally:
        # nbclient leaves a kernel it did not create running: a leaked kernel keeps its Ray driver
        # (and this session's stdout) alive after the suite, which once kept CI from ever finishing.
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    assert not km.is_alive()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, errors
