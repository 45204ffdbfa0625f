"""The local persistent Ray cluster: up, down, status, and its state file.

Our cluster is a Ray head (plus optional worker nodes from a cluster YAML) that
outlives any notebook kernel. Facts this module is built on (shared RECIPES.md):

* Token auth is set explicitly (``RAY_AUTH_MODE=token`` + our own token file) for
  the head, every node and every client; the shared ``~/.ray/auth_token`` is never used.
* A single-node cluster binds every port to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
  makes Ray treat the node as local-only). Ray then refuses worker nodes, so a
  multi-node cluster runs without that flag: Ray rewrites the node address and its
  GCS and raylets listen on all interfaces, protected by the token only.
* State and Ray's temp dir live under ``rlinf_nb.paths.cluster_dir()``, never /tmp/ray.
* ``ray stop`` kills every Ray on the machine, so ``down`` stops only processes
  that carry our cluster id in their environment, recorded PIDs and their
  descendants, collected in full before any signal is sent.
* ``ray.init`` on an address where nothing listens hangs for minutes: callers
  probe the GCS port with a TCP connect first (:func:`gcs_answers`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlinf_nb import paths
from rlinf_nb.config import parse_bytes, to_dict

from .cluster_spec import ClusterSpec, NodeGroupSpec, load_cluster_spec

CLUSTER_ID_ENV = "RLINF_NB_CLUSTER_ID"
NAMESPACE = "rlinf_nb"
STATE_FILE = "state.json"
TOKEN_FILE = "auth_token"


class ClusterError(RuntimeError):
    """The local cluster is missing, stale or failed to start; the message says what to do."""


@dataclass
class NodeState:
    """One Ray node we started."""

    name: str
    group: str
    ip: str
    head: bool
    temp_dir: str
    resources: dict[str, float]
    pids: list[int] = field(default_factory=list)


@dataclass
class ClusterState:
    """What ``cluster up`` recorded; read by ``attach`` and ``down``."""

    cluster_id: str
    address: str
    gcs_port: int
    token_path: str
    started_at: float
    nodes: list[NodeState]
    spec: dict
    loopback_only: bool

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def pids(self) -> list[int]:
        return [pid for node in self.nodes for pid in node.pids]


# ----------------------------------------------------------------------------- state file


def state_path() -> Path:
    return paths.cluster_dir() / STATE_FILE


def read_state() -> ClusterState | None:
    """The recorded state of our cluster, or None when none was started."""
    path = state_path()
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        raw["nodes"] = [NodeState(**n) for n in raw["nodes"]]
        return ClusterState(**raw)
    except (ValueError, TypeError, KeyError) as exc:
        raise ClusterError(
            f"the cluster state file {path} is unreadable ({exc}); run `rlinf-nb cluster down` to clear it"
        ) from None


def _write_state(state: ClusterState) -> None:
    path = state_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)


def token_path() -> Path:
    """Our own Ray auth token file (created with mode 0600 on first use)."""
    path = paths.cluster_dir() / TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path


def auth_env(token: Path | str) -> dict[str, str]:
    """Environment variables that make a Ray process use our token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


# ----------------------------------------------------------------------------- probes


def gcs_answers(address: str, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at ``host:port``."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_up(state: ClusterState | None = None) -> bool:
    """True when our recorded cluster's GCS answers."""
    state = state if state is not None else read_state()
    return state is not None and gcs_answers(state.address)


# ----------------------------------------------------------------------------- processes


def _ray_bin() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else (shutil.which("ray") or "ray")


def our_processes(state: ClusterState) -> list:
    """Every live process of our cluster: by environment marker, recorded PID, and descent.

    Collected in full before anything is signalled: once a raylet dies its agents are
    re-parented to PID 1 and could no longer be found through it.
    """
    import psutil

    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(CLUSTER_ID_ENV) == state.cluster_id:
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for pid in state.pids:
        try:
            proc = psutil.Process(pid)
            env = proc.environ()
            cmd = " ".join(proc.cmdline())
            ours = env.get(CLUSTER_ID_ENV) == state.cluster_id or any(n.temp_dir in cmd for n in state.nodes)
            if ours:
                found[pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                if child.pid != me:
                    found.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return list(found.values())


def _stop_stage(proc) -> int:
    """When ``proc`` gets its SIGTERM: raylets first, GCS servers last, everything else between.

    This is ``ray stop``'s order. A raylet signalled together with everything else waits ~10 s for the
    GCS and its agents before exiting; signalled first it exits in ~1.5 s and its agents follow it.
    """
    import psutil

    try:
        exe = " ".join(proc.cmdline()[:1])
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 1
    if exe.endswith("/raylet"):
        return 0
    return 2 if exe.endswith("/gcs_server") else 1


def _terminate(procs: list, grace_per_stage: float = 5.0) -> int:
    """SIGTERM ``procs`` stage by stage (:func:`_stop_stage`), SIGKILL what outlives a stage's grace."""
    import psutil

    stages = [_stop_stage(proc) for proc in procs]  # read before anything exits
    for stage in (0, 1, 2):
        group = [proc for proc, s in zip(procs, stages, strict=True) if s == stage]
        for proc in group:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(group, timeout=grace_per_stage)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
    return len(procs)


# ----------------------------------------------------------------------------- up / down


def _node_cmd(
    group: NodeGroupSpec, spec: ClusterSpec, ip: str, temp_dir: Path, head_address: str | None, gcs_port: int
) -> list[str]:
    store = parse_bytes(group.object_store_memory or spec.object_store_memory)
    cmd = [
        _ray_bin(), "start",
        f"--node-ip-address={ip}",
        f"--num-cpus={group.num_cpus:g}",
        f"--num-gpus={group.num_gpus:g}",
        f"--resources={json.dumps(group.node_resources())}",
        f"--object-store-memory={store}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    if head_address is None:
        cmd += [
            "--head",
            f"--port={gcs_port}",
            f"--ray-client-server-port={free_port()}",
            f"--include-dashboard={'true' if spec.include_dashboard else 'false'}",
        ]
        if spec.include_dashboard:
            cmd += ["--dashboard-host=127.0.0.1", f"--dashboard-port={free_port()}"]
    else:
        cmd += [f"--address={head_address}"]
    return cmd


def _new_pids(before: set[int], cluster_id: str) -> list[int]:
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in before:
            continue
        try:
            if proc.environ().get(CLUSTER_ID_ENV) == cluster_id:
                pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return pids


# Ray's session dir holds unix sockets, whose paths may not exceed 107 bytes; Ray appends
# about 60 characters (session_<date>_<pid>/sockets/plasma_store) to its temp dir.
_MAX_TEMP_DIR_LEN = 44


def _short_temp_dir(temp: Path) -> Path:
    """``temp`` itself, or a short symlink to it in /tmp when its path is too long for sockets.

    The files stay under our home; only the name Ray sees is short.
    """
    import hashlib
    import tempfile

    temp.mkdir(parents=True, exist_ok=True)
    if len(str(temp)) <= _MAX_TEMP_DIR_LEN:
        return temp
    digest = hashlib.sha1(str(temp).encode()).hexdigest()[:12]
    link = Path(tempfile.gettempdir()) / f"rlinf-nb-{digest}"
    if link.is_symlink() and Path(os.readlink(link)) != temp:
        link.unlink()
    if not link.exists():
        link.symlink_to(temp, target_is_directory=True)
    return link


# Ray's raylet waits a hard-coded ~15 s for its Python agents to write their port files
# (ray-project/ray#65983). On a busy 2-core machine their imports take longer and the
# node dies with "timed out during startup". When we may, we start the node at a raised
# priority and hand its processes back the normal one once it is up.
_STARTUP_NICE = -10


def _raise_priority() -> None:
    try:
        os.nice(_STARTUP_NICE)
    except OSError:
        pass


def _restore_priority(pids: list[int]) -> None:
    import psutil

    for pid in pids:
        try:
            psutil.Process(pid).nice(0)
        except (psutil.Error, OSError):
            continue


def _start_node(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> None:
    boost = _raise_priority if os.geteuid() == 0 else None
    with log.open("ab") as out:
        try:
            proc = subprocess.run(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, preexec_fn=boost
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"`ray start` did not finish in {timeout:.0f} s; see {log}") from None
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise ClusterError(f"`ray start` failed (exit {proc.returncode}); last lines of {log}:\n{tail}")


def up(
    config: str | Path | None = None, *, echo=print, timeout: float = 120.0, attempts: int = 2
) -> tuple[ClusterState, bool]:
    """Start our cluster (head plus the YAML's worker nodes); returns ``(state, started)``.

    When ours is already up this returns its state with ``started=False``. On a
    loaded 2-core machine Ray's own start-up can time out; it is retried once.
    """
    spec = load_cluster_spec(config)
    for attempt in range(1, attempts + 1):
        try:
            return _up(spec, echo=echo, timeout=timeout)
        except ClusterError as exc:
            if attempt == attempts:
                raise
            echo(f"[rlinf-nb] cluster start failed ({str(exc).splitlines()[0]}); retrying")
    raise AssertionError("unreachable")


def _up(spec: ClusterSpec, *, echo, timeout: float) -> tuple[ClusterState, bool]:
    import psutil

    state = read_state()
    if state is not None and is_up(state):
        return state, False
    if state is not None:
        echo(
            f"[rlinf-nb] clearing stale cluster state (started {time.ctime(state.started_at)}, no longer answering)"
        )
        _terminate(our_processes(state))
        state_path().unlink(missing_ok=True)

    cluster_id = uuid.uuid4().hex
    token = token_path()
    loopback_only = not spec.multi_node
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(auth_env(token))
    env[CLUSTER_ID_ENV] = cluster_id
    # Ray runs its workers at niceness 15 by default; here the workers *are* the product (training
    # runs), and at 15 they lose every core to a browser or a notebook cell. Run them at normal priority.
    env["RAY_worker_niceness"] = "0"
    if loopback_only:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    cdir = paths.cluster_dir()
    log = cdir / "ray-start.log"
    log.write_text("")

    nodes: list[NodeState] = []
    head_ip = "127.0.0.1" if loopback_only else "127.0.0.2"
    gcs_port = free_port()
    address = f"{head_ip}:{gcs_port}"
    before = {p.pid for p in psutil.process_iter(["pid"])}
    index = 0
    try:
        for group in spec.node_groups:
            for i in range(group.num_nodes):
                head = index == 0
                ip = head_ip if head else f"127.0.0.{2 + index}"
                temp = _short_temp_dir(cdir / ("ray" if head else f"ray-n{index}"))
                name = f"{group.label}-{i}"
                echo(f"[rlinf-nb] starting {'head' if head else 'worker'} node {name} at {ip} ...")
                cmd = _node_cmd(group, spec, ip, temp, None if head else address, gcs_port)
                _start_node(cmd, env, log, timeout)
                pids = _new_pids(before, cluster_id)
                _restore_priority(pids)
                before |= set(pids)
                nodes.append(NodeState(name, group.label, ip, head, str(temp), group.node_resources(), pids))
                index += 1
    except BaseException:
        partial = ClusterState(
            cluster_id, address, gcs_port, str(token), time.time(), nodes, to_dict(spec), loopback_only
        )
        _terminate(our_processes(partial))
        raise
    state = ClusterState(
        cluster_id, address, gcs_port, str(token), time.time(), nodes, to_dict(spec), loopback_only
    )
    _write_state(state)
    deadline = time.time() + 10
    while not gcs_answers(address) and time.time() < deadline:
        time.sleep(0.2)
    return state, True


def down(*, echo=print) -> int:
    """Stop our cluster's processes (only ours) and clear the state file; returns how many."""
    state = read_state()
    if state is None:
        echo("[rlinf-nb] no local cluster is recorded; nothing to stop")
        return 0
    procs = our_processes(state)
    count = _terminate(procs)
    state_path().unlink(missing_ok=True)
    echo(f"[rlinf-nb] cluster {state.address} stopped ({count} processes)")
    return count
