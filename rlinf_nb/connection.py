"""Connect this process (a notebook kernel, a script) to our persistent cluster."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from rlinf_nb import paths
from rlinf_nb.runtime import cluster
from rlinf_nb.runtime.cluster import ClusterError, ClusterState

_ATTACHED: ClusterHandle | None = None


@dataclass(frozen=True)
class ClusterHandle:
    """This process's connection to the local cluster."""

    address: str
    namespace: str
    cluster_id: str
    started_here: bool

    def info(self) -> dict[str, Any]:
        return cluster_info()

    def __repr__(self) -> str:
        how = "started by this attach" if self.started_here else "already running"
        return f"<rlinf-nb cluster {self.address} namespace={self.namespace!r} ({how})>"


def _stale_message(state: ClusterState) -> str:
    return (
        f"the recorded rlinf-nb cluster at {state.address} (started {time.ctime(state.started_at)}) "
        f"does not answer: it was stopped or the machine restarted. Run `rlinf-nb cluster up` to start "
        f"a fresh one (or call rl.attach(start=True))."
    )


def attach(start: bool = True, *, log_to_driver: bool = False, quiet: bool = False) -> ClusterHandle:
    """Connect to our cluster, starting it first when ``start`` and none is up.

    The GCS port is probed with a TCP connect before ``ray.init`` (a dead address
    makes ``ray.init`` hang for minutes). Calling it twice is harmless.

    Raises:
        ClusterError: with ``start=False`` when no cluster is up, saying to run
            ``rlinf-nb cluster up``.
    """
    global _ATTACHED
    say = (lambda *_: None) if quiet else print
    state = cluster.read_state()
    started = False
    if state is None or not cluster.gcs_answers(state.address):
        if not start:
            if state is None:
                raise ClusterError(
                    f"no rlinf-nb cluster is running (none recorded under {paths.cluster_dir()}). "
                    "Run `rlinf-nb cluster up`, or call rl.attach(start=True)."
                )
            raise ClusterError(_stale_message(state))
        say("[rlinf-nb] no cluster is up: starting one (≈20 s) ...")
        state, started = cluster.up(echo=say)

    if _ATTACHED is not None and _ATTACHED.cluster_id == state.cluster_id:
        import ray

        if ray.is_initialized():
            return _ATTACHED

    os.environ.update(cluster.auth_env(state.token_path))
    if state.loopback_only:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if state.loopback_only:
        # Ray reads this flag at import time and, when set, rewrites 127.0.0.1 to the machine's
        # external address, where a loopback-only GCS does not listen. The kernel may have imported
        # ray before attach(); Ray consults the module attribute at call time, so set it here too.
        ray_constants.ENABLE_RAY_CLUSTER = False

    if ray.is_initialized():
        ray.shutdown()
    _reload_ray_auth_config()
    kwargs: dict[str, Any] = {}
    if state.loopback_only:
        kwargs["_node_ip_address"] = state.host
    ray.init(
        address=state.address,
        namespace=cluster.NAMESPACE,
        log_to_driver=log_to_driver,
        logging_level=logging.WARNING,
        configure_logging=True,
        **kwargs,
    )
    _ATTACHED = ClusterHandle(state.address, cluster.NAMESPACE, state.cluster_id, started)
    if started:
        say(f"[rlinf-nb] cluster up at {state.address}; it keeps running after this kernel exits")
    return _ATTACHED


def _reload_ray_auth_config() -> None:
    """Make an already-imported Ray pick up the RAY_AUTH_* variables set just now.

    Ray's C++ config and its token loader read the environment once and cache it; a kernel
    that imported ray before attach() would otherwise connect without our token.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token auth: nothing cached
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ensure_attached() -> ClusterHandle:
    """The current connection, attaching (and starting a cluster) if needed."""
    import ray

    if _ATTACHED is not None and ray.is_initialized():
        return _ATTACHED
    return attach(start=True, quiet=True)


def detach() -> None:
    """Disconnect this process; the cluster and its runs keep going."""
    global _ATTACHED
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _ATTACHED = None


def cluster_info() -> dict[str, Any]:
    """Nodes (address, resources, alive), robots (node and holder), our runs, and our named actors."""
    import ray

    from rlinf_nb.runtime.robot_claims import robot_table

    ensure_attached()
    nodes = [
        {
            "node_id": n["NodeID"],
            "address": n["NodeManagerAddress"],
            "alive": bool(n["Alive"]),
            "resources": dict(n.get("Resources", {})),
        }
        for n in ray.nodes()
    ]
    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == cluster.NAMESPACE
    ]
    runs = sorted(p.name for p in paths.runs_dir().iterdir() if p.is_dir())
    return {
        "address": _ATTACHED.address if _ATTACHED else None,
        "nodes": nodes,
        "runs": runs,
        "actors": sorted(actors),
        "robots": robot_table(),
    }
