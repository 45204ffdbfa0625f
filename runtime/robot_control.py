"""E-stop and state of an env worker's robot envs, for the run's control path.

An :class:`~rlinf_nb.runtime.workers.EnvWorker` keeps one :class:`RobotControl` over its
envs. Its commands run on the worker's ``control`` concurrency group, so they reach the
robots while a rollout is stepping them:

* ``estop``: latch the e-stop of every robot env of the worker (or one): the robot layer
  holds each actuator at once, and every later command is replaced by "hold here";
* ``clear_estop``: clear those latches (the only way to);
* ``state``: per env, who drives (``agent`` / ``human`` / ``blending``), whether it is
  e-stopped (and why), whether its worker waits for the clear, and the end effector.

An e-stop ends the env's episode (``truncated``) and a robot env refuses to reset while
latched; in a run the env instead *waits in its reset* until the e-stop is cleared (the
hook :attr:`~rlinf_nb.envs.robot_env.RobotEnv.estop_wait` installed here), so the rollout
pauses rather than fails, whether the e-stop came from the dashboard or a teleop button.
Every env of that worker waits with it (they step in turn).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

WAIT_POLL_S = 0.02  # how often a waiting reset looks at the latch
COMMANDS = ("estop", "clear_estop", "state")


class RobotControl:
    """The robot envs of one env worker (none for other envs): e-stop, clear, state."""

    def __init__(self, vec_env: Any, env_id: str = "?"):
        from rlinf_nb.envs.robot_env import RobotEnv

        self.env_id = env_id
        envs = list(getattr(vec_env, "envs", None) or [])
        self.envs: list[RobotEnv] = envs if envs and all(isinstance(e, RobotEnv) for e in envs) else []
        self.waiting: set[int] = set()  # envs whose reset waits for the clear
        for i, env in enumerate(self.envs):
            env.estop_wait = self._waiter(i)

    @property
    def available(self) -> bool:
        return bool(self.envs)

    def command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """``{"kind": "estop" | "clear_estop" | "state", "env": local index or None, "reason": str}``.

        Returns ``{"ok": True, "state": [per env]}`` or ``{"ok": False, "robot": bool, "error": str}``.
        """
        kind = cmd.get("kind")
        if kind not in COMMANDS:
            return {"ok": False, "robot": self.available,
                    "error": f"robot command {kind!r}: allowed values: {', '.join(COMMANDS)}"}  # fmt: skip
        if not self.available:
            return {"ok": False, "robot": False,
                    "error": f"env {self.env_id!r} is not a robot env, so it has no e-stop "
                             "(robot envs are made with make_env('robot:<spec>/<task>'))"}  # fmt: skip
        index = cmd.get("env")
        if index is not None and not 0 <= int(index) < len(self.envs):
            return {"ok": False, "robot": True,
                    "error": f"env index {index} out of range: this worker has {len(self.envs)} envs"}  # fmt: skip
        targets = self.envs if index is None else [self.envs[int(index)]]
        if kind == "estop":
            reason = str(cmd.get("reason") or "run")
            for env in targets:
                env.robot.estop(reason)
        elif kind == "clear_estop":
            for env in targets:
                env.robot.clear_estop()
        return {"ok": True, "robot": True, "state": self.state()}

    def state(self) -> list[dict[str, Any]]:
        """Per env: ``mode``, ``human`` (has a human in the loop), ``estopped``, ``reason``,
        ``waiting`` (its reset waits for the clear), ``ee`` (end effector of its first arm, m; None
        without kinematics), ``episode_step``, ``human_weight``, and ``arms``: per arm, in the action
        vector's order, ``{"path", "mode", "human_weight", "ee"}`` (a multi-arm env's humans take
        arms over one by one)."""
        from rlinf_nb.envs.human import HumanInTheLoop

        out = []
        for i, env in enumerate(self.envs):
            human = env.intervention if isinstance(env.intervention, HumanInTheLoop) else None
            mode, weight = human.mode() if human is not None else ("agent", 0.0)
            arm_modes = human.arm_modes() if human is not None else {}
            arms: list[dict[str, Any]] = []
            ee_of: dict[int, list[float] | None] = {}  # each arm's end effector read once (a bus round trip)
            for path, arm in env.arms.items():
                arm_mode, arm_weight = arm_modes.get(path, ("agent", 0.0))
                ee_of[id(arm)] = _ee(arm)
                arms.append(
                    {"path": path, "mode": arm_mode, "human_weight": float(arm_weight), "ee": ee_of[id(arm)]}
                )
            ee = ee_of[id(env.arm)] if id(env.arm) in ee_of else _ee(env.arm)
            latch = env.robot.estop_latch
            out.append({"mode": mode, "human": human is not None, "human_weight": float(weight),
                        "estopped": bool(latch.engaged), "reason": latch.reason, "waiting": i in self.waiting,
                        "ee": ee, "episode_step": int(env.episode_step), "arms": arms})  # fmt: skip
        return out

    def _waiter(self, index: int) -> Any:
        def wait(env: Any) -> None:
            """Block the env's reset until its robot's e-stop is cleared."""
            self.waiting.add(index)
            try:
                while env.robot.estopped:
                    time.sleep(WAIT_POLL_S)
            finally:
                self.waiting.discard(index)

        return wait


def _ee(arm: Any) -> list[float] | None:
    """``arm``'s end-effector position (m), or None without kinematics or when the read fails."""
    try:
        return [float(x) for x in arm.ee_position()] if arm.has_kinematics else None
    except Exception:  # noqa: BLE001 - a state read must not fail the control call
        return None


class RobotFleet:
    """The controller's side: e-stop commands to a run's env workers and their robots' last state.

    ``status()`` gives ``robot_envs`` (one dict per env, in global env order, with its ``env``
    index; None for a run whose envs are not robot envs, or before it is known) and ``estopped``
    (the e-stopped env indices). The state is refreshed by :meth:`refresh` (each status call of a
    live run) and by every command; an e-stop that did not come from the run (a teleop button)
    is recorded as an ``estop`` event with ``source="robot"`` when a refresh first sees it.
    """

    def __init__(self, impl: Any):
        self.impl = impl
        self.robot: bool | None = None  # are the run's envs robot envs (None: not known yet)
        self.by_rank: dict[int, list[dict[str, Any]]] = {}
        self._seq = 0  # replies older than the last adopted one are ignored
        self._adopted: dict[int, int] = {}
        self._lock = threading.Lock()

    # -- what status() shows ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            if not self.robot:
                return {"robot_envs": None, "estopped": []}
            envs = [dict(s) for rank in sorted(self.by_rank) for s in self.by_rank[rank]]
        return {"robot_envs": envs, "estopped": [s["env"] for s in envs if s["estopped"]]}

    # -- commands ---------------------------------------------------------------------------
    async def command(self, kind: str, env: int | None = None, reason: str | None = None) -> dict[str, Any]:
        """``estop`` / ``clear_estop`` every robot env (``env`` None) or env ``env`` (global index)."""
        impl = self.impl
        group = impl.groups.get("env")
        if group is None:
            return {"ok": False, "error": "the run has no env workers yet"}
        per_worker = impl.cfg.env.num_envs
        if env is None:
            targets = [(rank, None) for rank in range(len(group))]
        else:
            rank, local = divmod(int(env), per_worker)
            if not 0 <= rank < len(group) or int(env) < 0:
                return {
                    "ok": False,
                    "error": f"env {env} out of range: the run has {per_worker * len(group)} envs",
                }
            targets = [(rank, local)]
        cmd = {"kind": kind, "reason": reason}
        reports = await self._ask([(rank, {**cmd, "env": local}) for rank, local in targets])
        failed = [r for _rank, r in reports if not r["ok"]]
        if failed:
            return {"ok": False, "error": failed[0]["error"]}
        envs = [rank * per_worker + i for rank, local in targets
                for i in (range(per_worker) if local is None else [local])]  # fmt: skip
        extra: dict[str, Any] = {}
        if kind == "estop":  # where each arm was held: the audit trail of an e-stop
            now = {s["env"]: s for s in self.status()["robot_envs"] or []}
            extra = {"reason": reason, "at": [{"env": i, "ee": now[i]["ee"], "episode_step": now[i]["episode_step"]}
                                              for i in envs if i in now]}  # fmt: skip
        impl.event(kind, envs=envs, **extra)
        return {"ok": True, **self.status()}

    async def refresh(self, timeout: float = 2.0) -> None:
        """Ask every env worker for its robots' state (a live run whose envs may be robot envs)."""
        impl = self.impl
        group = impl.groups.get("env")
        if self.robot is False or group is None or impl.ended_at is not None or impl.state == "starting":
            return
        try:
            await asyncio.wait_for(
                self._ask([(rank, {"kind": "state"}) for rank in range(len(group))]), timeout
            )
        except Exception:  # noqa: BLE001 - a busy or restarting worker: keep the last state
            return

    def any_estopped_now(self, timeout: float = 10.0) -> bool:
        """From the training thread: is any env of the run e-stopped right now?"""
        import ray

        group = self.impl.groups.get("env")
        if self.robot is False or group is None:
            return False
        try:
            reports = ray.get(
                [a.robot_command.remote({"kind": "state"}) for a in group.actors], timeout=timeout
            )
        except Exception:  # noqa: BLE001 - unknown counts as not e-stopped (the caller's timeout stands)
            return False
        return any(s["estopped"] for r in reports if r["ok"] for s in r["state"])

    async def _ask(self, calls: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
        group = self.impl.groups["env"]
        with self._lock:
            self._seq += 1
            seq = self._seq
        refs = [group.actors[rank].robot_command.remote(cmd) for rank, cmd in calls]
        reports = await asyncio.gather(*refs)
        out = list(zip([rank for rank, _ in calls], reports, strict=True))
        for rank, report in out:
            self._adopt(rank, report, seq, from_command=calls[0][1]["kind"] != "state")
        return out

    def _adopt(self, rank: int, report: dict[str, Any], seq: int, from_command: bool) -> None:
        if not report["ok"]:
            if report.get("robot") is False:
                self.robot = False
            return
        per_worker = self.impl.cfg.env.num_envs
        states = [{"env": rank * per_worker + i, **s} for i, s in enumerate(report["state"])]
        with self._lock:
            if seq < self._adopted.get(rank, 0):
                return
            self._adopted[rank] = seq
            before = {s["env"]: s["estopped"] for s in self.by_rank.get(rank, [])}
            self.robot = True
            self.by_rank[rank] = states
        if not from_command:
            for s in states:
                if s["estopped"] and before.get(s["env"]) is False:
                    self.impl.event("estop", envs=[s["env"]], reason=s["reason"], source="robot")


__all__ = ["COMMANDS", "RobotControl", "RobotFleet"]
