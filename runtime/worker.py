"""Workers and worker groups on Ray actors.

A worker class is a plain Python class defined at module level inside the package
(so every Ray worker can import it) that subclasses :class:`Worker`. A
:class:`WorkerGroup` starts ``count`` of them as Ray actors, placed by node-group
label and resources, and calls a method on all of them at once: the call returns
a :class:`GroupFuture`, and a failure carries the worker's rank and traceback.
A :class:`LocalWorkerGroup` holds one worker in the calling process behind the same
interface (``placement.learner: controller``).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import ray

from .cluster_spec import NODE_GROUP_RESOURCE
from .trace import SpanLog

LABEL_SHARE = 0.001  # how much of a node-group label resource one worker asks for


class WorkerError(RuntimeError):
    """A worker's method raised: names the group, the rank and carries its traceback."""

    def __init__(self, group: str, rank: int, method: str, detail: str):
        self.group, self.rank, self.method, self.detail = group, rank, method, detail
        super().__init__(f"{group}[{rank}].{method} failed:\n{detail}")

    def __reduce__(self):
        return (WorkerError, (self.group, self.rank, self.method, self.detail))


class PeerLost(RuntimeError):
    """A worker lost the actor it was calling (killed, or being restarted by Ray) in the middle of its work.

    Raised inside a worker (e.g. an env worker whose rollout worker died); :meth:`Worker._invoke` reports it
    as ``lost_peer: <group>``, so the caller can recover that group and repeat the work instead of failing.
    """

    def __init__(self, group: str, detail: str):
        self.group, self.detail = group, detail
        super().__init__(f"lost a {group} worker: {detail}")

    def __reduce__(self):
        return (PeerLost, (self.group, self.detail))


class PlacementError(RuntimeError):
    """A worker group cannot be placed on this cluster; the message names what is missing."""


class Worker:
    """Base class of every worker actor.

    Calls run through :meth:`_invoke` on the actor's default thread, one at a time. ``ping`` runs on a
    ``control`` thread of its own, so a worker busy in a long call (a rollout, a channel-mode ``serve``, an
    update) still answers ``run.health()`` and the cluster view. A subclass that adds concurrency groups
    keeps this one: ``concurrency_groups = {**Worker.concurrency_groups, "name": n}``.
    """

    concurrency_groups: dict[str, int] = {"control": 1}

    def __init__(self, rank: int, world_size: int, group: str):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        # which start of this worker: a worker Ray restarted reports another one
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"
        self.spans = SpanLog()  # every group call, for the run's timeline (``run.trace()``)
        self.span_args: dict[str, Any] = {}  # what the running call adds to its span (e.g. a rollout's env_s)

    def _invoke(self, method: str, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Run ``method`` and report its result, timing, or traceback (never raises); kept as a span."""
        t0, start_ns = time.perf_counter(), time.time_ns()
        self.span_args = {}
        try:
            # Arguments travel inside a tuple, so Ray leaves ObjectRefs unresolved: resolve them here.
            args = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
            kwargs = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in kwargs.items()}
            result = getattr(self, method)(*args, **kwargs)
            report = {"ok": True, "result": result, "elapsed": time.perf_counter() - t0}
        except Exception as exc:  # noqa: BLE001 - shipped to the caller with its traceback
            report = {"ok": False, "error": traceback.format_exc(), "elapsed": time.perf_counter() - t0}
            if isinstance(exc, PeerLost):
                report["lost_peer"] = exc.group
        self.spans.record(method, start_ns, time.time_ns() - start_ns, report["ok"], **self.span_args)
        return report

    @ray.method(concurrency_group="control")
    def ping(self) -> dict[str, Any]:
        return {"rank": self.rank, "group": self.group, "pid": os.getpid(), "host": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "incarnation": self.incarnation}  # fmt: skip

    @ray.method(concurrency_group="control")
    def trace_spans(self, since_ns: int = 0) -> list[dict[str, Any]]:
        """This worker's kept calls that started at or after ``since_ns`` (see :mod:`.trace`)."""
        return self.spans.since(since_ns)


@dataclass
class GroupPlacement:
    """Where and how big each worker of a group is."""

    count: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    node_group: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    rank_resources: list[dict[str, float]] = field(default_factory=list)
    """Extra resources of worker ``rank`` on top of ``resources`` (e.g. its ``robot:<name>``); [] = none."""

    def __post_init__(self) -> None:
        if self.rank_resources and len(self.rank_resources) != self.count:
            raise ValueError(
                f"GroupPlacement: rank_resources has {len(self.rank_resources)} entries for {self.count} workers"
            )

    def actor_resources(self, rank: int | None = None) -> dict[str, float]:
        """What worker ``rank`` asks Ray for besides CPUs and GPUs (``None``: what every worker asks)."""
        res = dict(self.resources)
        if rank is not None and self.rank_resources:
            res.update(self.rank_resources[rank])
        if self.node_group:
            res[NODE_GROUP_RESOURCE.format(label=self.node_group)] = LABEL_SHARE
        return res

    def worker_needs(self, rank: int) -> dict[str, float]:
        """Everything worker ``rank`` needs of one node: CPUs, GPUs and its resources (only those > 0)."""
        need = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.actor_resources(rank)}
        return {k: v for k, v in need.items() if v > 0}


def _alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _totals_of(nodes: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [dict(n.get("Resources", {})) for n in nodes]


def node_totals() -> list[dict[str, float]]:
    """Each alive node's total resources (one dict per node)."""
    return _totals_of(_alive_nodes())


def check_placement(groups: dict[str, GroupPlacement]) -> None:
    """Fail fast, naming the group and resource, when the cluster cannot host ``groups``.

    Checks per-node feasibility (a worker must fit on one node that carries its label)
    and totals over all groups; Ray itself would leave such actors pending forever.
    """
    nodes = _alive_nodes()
    totals = _totals_of(nodes)
    try:  # what other runs left free, per node
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
        remaining = [dict(free.get(n["NodeID"], n.get("Resources", {}))) for n in nodes]
    except Exception:  # noqa: BLE001 - an internal API: fall back to totals
        remaining = [dict(t) for t in totals]
    problem = placement_problem(groups, totals, remaining)
    if problem is not None:
        raise PlacementError(problem)


def _fits(have: dict[str, float], k: str, v: float) -> bool:
    return have.get(k, 0.0) + 1e-9 >= v


def placement_problem(
    groups: dict[str, GroupPlacement], totals: list[dict[str, float]], remaining: list[dict[str, float]]
) -> str | None:
    """Why ``groups`` cannot be placed on nodes with resources ``totals`` of which ``remaining`` are free
    (one dict per node, same order), or None when every worker fits. Pure: ``remaining`` is not changed.

    The message names the group, the worker, what it needs and the resource that blocks it: one no node
    provides, one other runs or groups hold, or, when each resource exists somewhere but no node has
    all of them, what the closest node (one of its node group's nodes, if it has a label) lacks.
    """
    remaining = [dict(r) for r in remaining]
    cluster: dict[str, float] = {}
    for res in totals:
        for k, v in res.items():
            cluster[k] = cluster.get(k, 0.0) + v
    for name, placement in groups.items():
        for i in range(placement.count):
            need = placement.worker_needs(i)
            fit = next((r for r in remaining if all(_fits(r, k, v) for k, v in need.items())), None)
            if fit is not None:
                for k, v in need.items():
                    fit[k] = fit.get(k, 0.0) - v
                continue
            who = f"worker group {name!r}: worker {i + 1} of {placement.count} needs {need}, but "
            missing = [k for k, v in need.items() if cluster.get(k, 0.0) < v]
            short = [k for k, v in need.items() if not any(_fits(r, k, v) for r in remaining)]
            if missing or short:
                what = (missing or short)[0]
                why = "no node provides it" if missing else "other runs or groups hold the rest"
                return (
                    f"{who}no node has enough {what!r} left ({why}; cluster total {cluster.get(what, 0.0):g}). "
                    f"Lower the group's num_workers or num_cpus, stop another run, or start a cluster whose "
                    f"YAML provides {what!r} (rlinf-nb cluster up --config ...)."
                )
            return who + _closest_node_lacks(placement, need, totals, remaining)
    return None


def _closest_node_lacks(placement: GroupPlacement, need: dict[str, float], totals: list[dict[str, float]],
                        remaining: list[dict[str, float]]) -> str:  # fmt: skip
    """The message's end when each needed resource exists somewhere but no one node has all of them."""
    label = NODE_GROUP_RESOURCE.format(label=placement.node_group) if placement.node_group else None
    nodes = [j for j, t in enumerate(totals) if label is None or t.get(label, 0.0) > 0] or list(
        range(len(totals))
    )
    best = max(nodes, key=lambda j: sum(_fits(remaining[j], k, v) for k, v in need.items()))
    lacking = [k for k, v in need.items() if not _fits(remaining[best], k, v)]
    never = [k for k in lacking if not _fits(totals[best], k, need[k])]
    where = f"the nodes of node group {placement.node_group!r}" if label else "the closest node"
    if never:
        fix = (f"give node group {placement.node_group!r} {never} in the cluster YAML, or place the group on a "
               "node group that has them" if label else "start a cluster with a node that has all of them")  # fmt: skip
        return f"no single node has all of it: {where} {'lack' if label else 'lacks'} {never}. Fix: {fix}."
    return (f"no single node has all of it free: {where} {'have' if label else 'has'} no {lacking} left "
            "(other runs or groups hold it). Stop another run or lower the group's num_workers or num_cpus.")  # fmt: skip


def candidate_nodes(placement: GroupPlacement, totals: list[dict[str, float]]) -> set[int]:
    """The nodes (indices into ``totals``) that could host some worker of ``placement``: each node that has
    everything one of its workers asks for (label, CPUs, GPUs, its own resources). Pure."""
    out: set[int] = set()
    for rank in range(placement.count):
        need = placement.worker_needs(rank)
        out.update(j for j, have in enumerate(totals) if all(_fits(have, k, v) for k, v in need.items()))
    return out


def route_env_to_rollout(
    mode: str, groups: dict[str, GroupPlacement], totals: list[dict[str, float]], lanes: bool
) -> str:
    """``placement.env_to_rollout`` as a run uses it. Any mode but ``auto`` is kept. Pure.

    ``auto`` becomes ``channel`` when the obs/actions streams may ride shared-memory lanes (``lanes``: lanes
    on, neither stream linked) and one node is the only one that could host any env or rollout worker, so
    every env/rollout pair shares it. Otherwise ``direct``: Ray places the workers and they may land on
    different nodes, where a lane cannot go, and a brokered channel costs more hops per step than a call.
    """
    if mode != "auto":
        return mode
    if not lanes:
        return "direct"
    nodes = candidate_nodes(groups["env"], totals) | candidate_nodes(groups["rollout"], totals)
    return "channel" if len(nodes) == 1 else "direct"


class GroupFuture:
    """Results of one call on every worker of a group."""

    def __init__(self, group: WorkerGroup, method: str, refs: list[ray.ObjectRef]):
        self.group, self.method, self.refs = group, method, refs

    def _reports(self, timeout: float | None) -> list[dict[str, Any]]:
        return ray.get(self.refs, timeout=timeout)

    def get(self, timeout: float | None = None) -> list[Any]:
        """Each rank's result, in rank order; raises :class:`WorkerError` for the first failure."""
        reports = self._reports(timeout)
        results = []
        for rank, rep in enumerate(reports):
            if not rep["ok"]:
                raise WorkerError(self.group.name, rank, self.method, rep["error"])
            results.append(rep["result"])
        self.group.last_timings[self.method] = [rep["elapsed"] for rep in reports]
        return results

    def ready(self) -> bool:
        if not self.refs:
            return True
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(done) == len(self.refs)


class WorkerGroup:
    """``count`` actors of one worker class, called together."""

    def __init__(
        self,
        name: str,
        worker_cls: type[Worker],
        placement: GroupPlacement,
        init_args: tuple = (),
        init_kwargs: dict | None = None,
        max_restarts: int = 0,
    ):
        self.name = name
        self.placement = placement
        self.last_timings: dict[str, list[float]] = {}
        remote_cls = ray.remote(concurrency_groups=worker_cls.concurrency_groups)(worker_cls)
        self.actors = [
            remote_cls.options(
                num_cpus=placement.num_cpus,
                num_gpus=placement.num_gpus,
                resources=placement.actor_resources(rank) or None,
                max_restarts=max_restarts,
                max_task_retries=0,
            ).remote(rank, placement.count, name, *init_args, **(init_kwargs or {}))
            for rank in range(placement.count)
        ]

    def __len__(self) -> int:
        return len(self.actors)

    def call(
        self, method: str, *args: Any, rank_args: list[tuple] | None = None, **kwargs: Any
    ) -> GroupFuture:
        """Call ``method(*args, **kwargs)`` on every worker (``rank_args[r]`` prepended per rank)."""
        refs = []
        for rank, actor in enumerate(self.actors):
            extra = tuple(rank_args[rank]) if rank_args is not None else ()
            refs.append(actor._invoke.remote(method, extra + args, kwargs))
        return GroupFuture(self, method, refs)

    def call_one(self, rank: int, method: str, *args: Any, **kwargs: Any) -> GroupFuture:
        fut = GroupFuture(self, method, [self.actors[rank]._invoke.remote(method, args, kwargs)])
        return fut

    def health(self, timeout: float = 2.0) -> list[dict[str, Any]]:
        """Ping every worker: ``{"rank", "alive", "pid"?, "error"?}``."""
        refs = [a.ping.remote() for a in self.actors]
        out = []
        for rank, ref in enumerate(refs):
            try:
                out.append({"alive": True, **ray.get(ref, timeout=timeout)})
            except Exception as exc:  # noqa: BLE001 - health is a report, not a failure
                out.append({"rank": rank, "alive": False, "error": type(exc).__name__})
        return out

    def trace_spans(self, timeout: float = 10.0) -> list[list[dict[str, Any]] | None]:
        """Every worker's kept calls (see :mod:`.trace`), by rank; None for a worker that did not answer."""
        refs = [a.trace_spans.remote() for a in self.actors]
        out: list[list[dict[str, Any]] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=timeout))
            except Exception:  # noqa: BLE001 - a lost worker's calls are gone with it
                out.append(None)
        return out

    def kill(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass


class DoneFuture(GroupFuture):
    """A :class:`GroupFuture` over reports that are already here (a :class:`LocalWorkerGroup` call)."""

    def __init__(self, group: Any, method: str, reports: list[dict[str, Any]]):
        super().__init__(group, method, [])
        self.reports = reports

    def _reports(self, timeout: float | None) -> list[dict[str, Any]]:
        return self.reports

    def ready(self) -> bool:
        return True


class LocalWorkerGroup:
    """One worker in this process, called like a :class:`WorkerGroup` of one (calls run at once, here).

    What ``placement.learner: controller`` uses: the learner lives in the run controller's process,
    so a run starts one process fewer and an update is a method call, not a Ray call.
    """

    def __init__(
        self, name: str, worker_cls: type[Worker], init_args: tuple = (), init_kwargs: dict | None = None
    ):
        self.name = name
        self.placement = None
        self.last_timings: dict[str, list[float]] = {}
        self.actors: list[Any] = []  # no Ray actor: callers use call / call_one
        self.worker: Worker | None = worker_cls(0, 1, name, *init_args, **(init_kwargs or {}))

    def __len__(self) -> int:
        return 1

    def _run(self, method: str, args: tuple, kwargs: dict) -> DoneFuture:
        if self.worker is None:
            report = {"ok": False, "error": f"the {self.name} worker was released", "elapsed": 0.0}
        else:
            report = self.worker._invoke(method, args, kwargs)
        return DoneFuture(self, method, [report])

    def call(
        self, method: str, *args: Any, rank_args: list[tuple] | None = None, **kwargs: Any
    ) -> DoneFuture:
        extra = tuple(rank_args[0]) if rank_args is not None else ()
        return self._run(method, extra + args, kwargs)

    def call_one(self, rank: int, method: str, *args: Any, **kwargs: Any) -> DoneFuture:
        if rank != 0:
            raise IndexError(f"{self.name}: a local group has rank 0 only, got {rank}")
        return self._run(method, args, kwargs)

    def health(self, timeout: float = 2.0) -> list[dict[str, Any]]:
        if self.worker is None:
            return [{"rank": 0, "alive": False, "error": "released"}]
        return [{"alive": True, **self.worker.ping(), "in_process": True}]

    def trace_spans(self, timeout: float = 10.0) -> list[list[dict[str, Any]] | None]:
        return [None if self.worker is None else self.worker.spans.since()]

    def kill(self) -> None:
        self.worker = None
