"""Robots as cluster resources: each env worker of a run claims one named robot.

A robot node group of the cluster YAML advertises ``robot:<name>: 1`` on its node (see
:mod:`.cluster_spec`). A run's ``placement.env.robots: [arm0, arm1]`` gives env worker ``i``
the robot ``robots[i]``: the worker asks Ray for ``robot:<robots[i]>: 1`` on top of its
group's resources (so it lands on that robot's node), learns its robot's name, and an
``env.id`` with ``{robot}`` in it becomes that worker's own env id (per-robot spec files).

Exactly one env worker holds a robot. Ray's accounting already allows one holder, but a
second claim would wait in Ray forever; so before its workers start, a run *claims* its
robots in a small registry (:class:`RobotClaims`, one detached named actor per cluster,
one call at a time). A claim that cannot be met fails at once with a :class:`RobotClaimError`
naming the robot and what is wrong: no node advertises it (the cluster YAML), or which run
and env worker holds it. A run releases its robots when it ends, after its env workers are
gone; the claim of a run whose controller vanished is stale and taken over.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from .cluster import NAMESPACE
from .cluster_spec import NODE_GROUP_RESOURCE, ROBOT_RESOURCE
from .worker import PlacementError

REGISTRY_NAME = "robot_claims"
ROBOT_PLACEHOLDER = "{robot}"  # in env.id: replaced by each env worker's robot name
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
FREE_WAIT_S = 15.0  # how long a claim waits for a just-released robot's resource to come back
POLL_S = 0.1


class RobotClaimError(PlacementError):
    """A robot cannot be claimed: it is unknown to the cluster, or another env worker holds it."""


# ---------------------------------------------------------------------------- pure helpers


def resource_of(robot: str) -> str:
    """``"arm0"`` -> ``"robot:arm0"``, the Ray resource its node advertises."""
    return ROBOT_RESOURCE.format(name=robot)


def robot_of(robots: Sequence[str] | None, rank: int) -> str | None:
    """The robot of env worker ``rank`` (None when the run claims no robots)."""
    return robots[rank] if robots else None


def env_id_for(env_id: str, robot: str | None) -> str:
    """``env_id`` with ``{robot}`` replaced by ``robot`` (unchanged without a placeholder)."""
    if robot is None:
        return env_id
    return env_id.replace(ROBOT_PLACEHOLDER, robot)


def rank_resources(robots: Sequence[str] | None) -> list[dict[str, float]]:
    """The extra Ray resources of each env worker: ``[{"robot:arm0": 1.0}, ...]`` (``[]``: none)."""
    return [{resource_of(r): 1.0} for r in robots or ()]


def robot_problems(robots: Sequence[str], num_workers: int) -> tuple[Any, str] | None:
    """What is wrong with ``placement.env.robots`` (the bad value and what is allowed), or None."""
    if not robots:
        return None
    bad = [r for r in robots if not isinstance(r, str) or not NAME_RE.match(r)]
    if bad:
        return bad, "robot names are non-empty and use letters, digits, '-' or '_'"
    dupes = sorted({r for r in robots if list(robots).count(r) > 1})
    if dupes:
        return list(robots), (
            f"{', '.join(map(repr, dupes))} listed more than once; each robot is held by exactly one env worker, "
            "so list every robot once"
        )
    if len(robots) != num_workers:
        return list(robots), (
            f"one robot per env worker: {len(robots)} robots for placement.env.num_workers={num_workers}; "
            f"allowed: a list of {num_workers} distinct names, or [] for no robots"
        )
    return None


def describe_holder(robot: str, holder: dict[str, Any]) -> str:
    return f"robot {robot!r} is held by run {holder['run']!r}, env worker {holder['rank']}"


# ---------------------------------------------------------------------------- the registry


class RobotClaimsImpl:
    """Who holds which robot: ``{robot: {"run", "rank", "since"}}``; wrapped as :data:`RobotClaims`."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def claim(self, run: str, robots: list[str], evict: list[str] | None = None) -> dict[str, Any]:
        """Give ``robots[i]`` to env worker ``i`` of ``run``, all or none.

        ``evict`` names runs whose claims are stale (their controller is gone): theirs go first.
        Returns ``{"ok": True}`` or ``{"ok": False, "held": {robot: holder}}`` (nothing claimed).
        """
        for robot, holder in list(self.claims.items()):
            if holder["run"] in (evict or ()):
                del self.claims[robot]
        held = {r: self.claims[r] for r in robots if r in self.claims and self.claims[r]["run"] != run}
        if held:
            return {"ok": False, "held": held}
        self.release(run)  # a run that claims again (resumed) holds only its new list
        now = time.time()
        for rank, robot in enumerate(robots):
            self.claims[robot] = {"run": run, "rank": rank, "since": now}
        return {"ok": True}

    def release(self, run: str) -> list[str]:
        """Drop every claim of ``run``; returns the robots released."""
        mine = sorted(r for r, h in self.claims.items() if h["run"] == run)
        for robot in mine:
            del self.claims[robot]
        return mine

    def holders(self) -> dict[str, dict[str, Any]]:
        return {r: dict(h) for r, h in self.claims.items()}


RobotClaims = ray.remote(num_cpus=0, max_concurrency=1)(RobotClaimsImpl)


def registry(create: bool = True) -> Any | None:
    """The cluster's claim registry (created on first use; None when absent and ``create`` is false)."""
    if not create:
        try:
            return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
        except ValueError:
            return None
    return RobotClaims.options(
        name=REGISTRY_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()


def cluster_robots() -> dict[str, str]:
    """Every robot some alive node advertises, with that node's id."""
    out = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for key in node.get("Resources", {}):
                if key.startswith("robot:"):
                    out[key[len("robot:") :]] = node["NodeID"]
    return out


def _free(robots: Sequence[str]) -> list[str]:
    avail = ray.available_resources()
    return [r for r in robots if avail.get(resource_of(r), 0.0) + 1e-9 >= 1.0]


def wait_free(robots: Sequence[str], timeout: float) -> list[str]:
    """Wait until Ray shows each robot's resource free; returns those still in use at ``timeout``."""
    deadline = time.time() + timeout
    busy = [r for r in robots if r not in _free(robots)]
    while busy and time.time() < deadline:
        time.sleep(POLL_S)
        busy = [r for r in busy if r not in _free(busy)]
    return busy


def node_groups_of(node_id: str) -> list[str]:
    """The node-group labels the alive node ``node_id`` advertises."""
    prefix = NODE_GROUP_RESOURCE.format(label="")
    for node in ray.nodes():
        if node.get("Alive") and node["NodeID"] == node_id:
            return sorted(k[len(prefix) :] for k in node.get("Resources", {}) if k.startswith(prefix))
    return []


def claim_robots(run: str, robots: Sequence[str], run_alive: Callable[[str], bool],
                 node_group: str | None = None, free_wait_s: float = FREE_WAIT_S) -> None:  # fmt: skip
    """Claim ``robots`` (env worker ``i`` gets ``robots[i]``) for ``run``, or raise at once.

    ``run_alive(name)`` says whether run ``name``'s controller still exists; a claim held by a
    gone run is stale and taken over. ``node_group`` is ``placement.env.node_group``: each
    robot's node must carry that label.

    Raises:
        RobotClaimError: no node advertises a robot (names it and the cluster's robots), its node
            is outside ``node_group``, another run's env worker holds one (names the run and the
            rank), or its resource stays in use by a worker that did not claim it.
    """
    robots = list(robots)
    if not robots:
        return
    known = cluster_robots()
    unknown = [r for r in robots if r not in known]
    if unknown:
        names = ", ".join(sorted(known)) or "(none)"
        raise RobotClaimError(
            f"placement.env.robots: no node of this cluster advertises {', '.join(resource_of(r) for r in unknown)} "
            f"(robot {unknown[0]!r} is unknown); robots on this cluster: {names}. Add it to a node group's "
            f"`robots:` in the cluster YAML (rlinf-nb cluster up --config ...) or claim one of those."
        )
    if node_group is not None:
        for robot in robots:
            labels = node_groups_of(known[robot])
            if node_group not in labels:
                raise RobotClaimError(
                    f"placement.env.node_group: got {node_group!r}, but robot {robot!r} is on a node of group "
                    f"{', '.join(map(repr, labels)) or '(none)'}; set placement.env.node_group to None (the robots "
                    f"place the env workers) or to their group"
                )
    reg = registry()
    reply = ray.get(reg.claim.remote(run, robots), timeout=60)
    if not reply["ok"]:
        stale = sorted({h["run"] for h in reply["held"].values() if not run_alive(h["run"])})
        if stale:
            reply = ray.get(reg.claim.remote(run, robots, stale), timeout=60)
    if not reply["ok"]:
        held = reply["held"]
        free = sorted(set(known) - set(ray.get(reg.holders.remote(), timeout=60)))
        first = next(iter(held))
        raise RobotClaimError(
            "placement.env.robots: "
            + "; ".join(describe_holder(r, h) for r, h in held.items())
            + f". Stop that run (rl.get_run({held[first]['run']!r}).stop()) or claim another robot; "
            f"free robots: {', '.join(free) or '(none)'}"
        )
    busy = wait_free(robots, free_wait_s)  # a run that just ended may still be letting go of its workers
    if busy:
        ray.get(reg.release.remote(run), timeout=60)
        raise RobotClaimError(
            f"placement.env.robots: {', '.join(resource_of(r) for r in busy)} is in use by a worker that did "
            f"not claim it through placement.env.robots (e.g. a group's `resources: {{{resource_of(busy[0])}: 1}}`); "
            f"stop that worker's run first"
        )


def release_robots(run: str, robots: Sequence[str], free_wait_s: float = FREE_WAIT_S) -> list[str]:
    """Release ``run``'s robots once Ray shows them free (its env workers killed); returns them."""
    if not robots:
        return []
    wait_free(robots, free_wait_s)
    reg = registry(create=False)
    if reg is None:
        return []
    return ray.get(reg.release.remote(run), timeout=60)


def robot_table() -> list[dict[str, Any]]:
    """Every robot of the cluster: ``{"robot", "node_id", "held_by": {"run", "rank", "since"} | None}``."""
    reg = registry(create=False)
    holders = ray.get(reg.holders.remote(), timeout=30) if reg is not None else {}
    return [
        {"robot": r, "node_id": node, "held_by": holders.get(r)}
        for r, node in sorted(cluster_robots().items())
    ]


__all__ = [
    "REGISTRY_NAME",
    "RobotClaimError",
    "RobotClaims",
    "claim_robots",
    "env_id_for",
    "rank_resources",
    "release_robots",
    "robot_of",
    "robot_problems",
    "robot_table",
]
