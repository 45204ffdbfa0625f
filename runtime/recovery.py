"""Losing a worker mid-run, and coming back: the rollout repeated, the learner restored from a checkpoint.

:class:`WorkerRecovery` is mixed into :class:`~.controller.RunControllerImpl` and works on its state
(``groups``, ``channels``, ``run_dir``, the counters); :data:`RECOVERABLE` names the failures it handles.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from rlinf_nb.config import to_dict

from .worker import GroupFuture, WorkerGroup
from .workers import ABORT


class WorkerLost(RuntimeError):
    """A worker of ``group`` died (or Ray is restarting it) during a rollout: recover the group and repeat it."""

    def __init__(self, group: str, detail: str):
        self.group, self.detail = group, detail
        super().__init__(f"a {group} worker was lost during the rollout: {detail}")


RECOVERABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, WorkerLost)


def ended_badly(ref: ray.ObjectRef) -> bool:
    """Whether a finished worker call failed: its report says so, or its actor died under it."""
    try:
        return not ray.get(ref)["ok"]
    except Exception:  # noqa: BLE001 - a lost actor, a cancelled call: all failures
        return True


class WorkerRecovery:
    """Detect a lost worker, abort its rollout, wait for Ray's restart and put the run back on its feet."""

    def _abort_rollout(self) -> None:
        n_env = len(self.groups["env"])
        for key in range(n_env):
            for name in ("obs", "actions"):
                if name not in self.channels:
                    continue
                try:
                    self.channels[name].put_async(key, {ABORT: True}, timeout=5)
                except Exception:  # noqa: BLE001 - best effort
                    pass

    def _note_env_restarts(self, incarnations: list[str | None]) -> None:
        """Record env workers that Ray restarted between two rollouts (no call failed, so nothing else says so)."""
        for rank, now in enumerate(incarnations):
            before = self.env_incarnations[rank] if rank < len(self.env_incarnations) else None
            if before is not None and now is not None and now != before:
                self.event("recovery", group="env", rank=rank, action="restarted",
                           note="the env worker was restarted by Ray between rollouts; its envs started afresh")  # fmt: skip
        self.env_incarnations = list(incarnations)

    def _recover_lost_worker(self, exc: BaseException) -> None:
        """After a worker died during a rollout: wait until Ray has restarted it, reset the envs, record it.

        The caller then repeats the rollout; a restarted rollout worker gets the synced weights again first
        (:meth:`_resync_restarted_rollout_workers`).
        """
        lost = exc.group if isinstance(exc, WorkerLost) else "env"
        for name in ("env", "rollout"):
            if name not in self.groups:
                continue
            health = self._wait_until_alive(self.groups[name], exc)
            if name == "env":
                self.env_incarnations = [h.get("incarnation") for h in health]  # recorded below
        for ch in self.channels.values():
            ch.clear()
        self.groups["env"].call("reset").get(timeout=120)
        note = {"env": "the env worker was restarted by Ray; the rollout was repeated",
                "rollout": "the rollout worker was lost mid-rollout and restarted by Ray; the envs were reset "
                           "and the rollout was repeated"}.get(lost, "the rollout was repeated")  # fmt: skip
        detail = exc.detail if isinstance(exc, WorkerLost) else str(exc)
        self.event("recovery", group=lost, action="restarted", detail=f"{type(exc).__name__}: {detail[:300]}",
                   note=note)  # fmt: skip

    @staticmethod
    def _wait_until_alive(group: Any, exc: BaseException, timeout: float = 120.0) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        health = group.health(timeout=2)
        while not all(h["alive"] for h in health) and time.time() < deadline:
            time.sleep(1.0)
            health = group.health(timeout=2)
        if not all(h["alive"] for h in health):
            raise RuntimeError(f"{group.name} workers did not come back after a failure: {health}") from exc
        return health

    def _recover_lost_learner(self, exc: BaseException) -> bool:
        """After the learner worker died: restore it from the newest complete checkpoint and roll the run back.

        Returns False when the learner is not what was lost (the caller re-raises ``exc``). Ray restarts the
        learner with its initial state; it gets its demos/dataset again, then the checkpoint's state, and the
        run's counters go back to the checkpoint (like ``resume=True``, with the live config kept). The
        steps after it run again: their metrics rows are replaced, so ``step`` stays gap-free.

        Raises:
            RuntimeError: the learner was lost and the run has no complete checkpoint to restore.
        """
        group = self.groups.get("actor")
        if not isinstance(group, WorkerGroup):
            return False  # a learner in this process dies with the controller: resume=True restores it
        if isinstance(exc, WorkerLost):
            lost = exc.group == "actor"
        else:  # a call to the learner failed (it may be back already, restarted), or it does not answer
            learner_ids = {a._actor_id.hex() for a in group.actors}
            lost = getattr(exc, "actor_id", None) in learner_ids or not all(
                h["alive"] for h in group.health(timeout=5)
            )
        if not lost:
            return False
        info = self.run_dir.latest_checkpoint()
        if info is None:
            raise RuntimeError(
                "the learner worker was lost and this run has no complete checkpoint to restore it from "
                f"(checkpoint.every: {self.cfg.checkpoint.every}); launch with checkpoint.every > 0 to recover "
                "from a lost learner"
            ) from exc
        self._wait_until_alive(group, exc)
        self._drop_segment_in_flight()
        for ch in self.channels.values():
            ch.clear()
        self._prepare_learner(self.cfg, to_dict(self.cfg.env))
        dropped = self._load_checkpoint(info, config=False)
        synced = self.sync_weights()
        if self.colocated:  # a colocated policy loads only newer weights by itself: these are older
            refs, version = self.latest_weights
            for offer in [a.offer_weights.remote(refs[0], version, True) for a in self.groups["env"].actors]:
                ray.get(offer, timeout=120)
        detail = exc.detail if isinstance(exc, WorkerLost) else str(exc)
        self.event("recovery", group="actor", action="restored", checkpoint=info.path.name, from_step=info.step,
                   discarded_rows=dropped, weights_version=synced["weights_version"],
                   detail=f"{type(exc).__name__}: {detail[:300]}",
                   note="the learner worker was lost; Ray restarted it and the run went back to its newest "
                        "complete checkpoint")  # fmt: skip
        return True

    def _await_beside_segment(self, fut: GroupFuture, timeout: float = 120.0) -> list[Any]:
        """``fut``'s results, where its workers may first have to finish the off-policy segment in flight.

        The segment takes as long as it needs (an e-stopped env waits in its reset, and the channel reads of
        the rollout workers wait with it); ``timeout`` counts only once no segment worker is still working.
        A segment worker that failed or died leaves its peers waiting for it: the rollout is aborted, which
        wakes them, and the next collect stage reports the failure (and recovers from it).
        """
        seg_refs = [r for f in self._segment for r in f.refs] if self._segment is not None else []
        deadline, aborted = time.monotonic() + timeout, False
        while True:
            done, _ = ray.wait(fut.refs, num_returns=len(fut.refs), timeout=0.5)
            if len(done) == len(fut.refs):
                return fut.get()
            ended, running = (
                ray.wait(seg_refs, num_returns=len(seg_refs), timeout=0) if seg_refs else ([], [])
            )
            if not aborted and any(ended_badly(r) for r in ended):
                self._abort_rollout()
                aborted = True
            if running:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise TimeoutError(
                    f"{fut.method} on the {fut.group.name} workers: no answer within {timeout:g} s"
                )

    def _drop_segment_in_flight(self) -> None:
        """Wait for an off-policy collection segment still running (its data belongs to the lost steps), drop it."""
        segment, self._segment = self._segment, None
        if segment is None:
            return
        refs = [r for fut in segment for r in getattr(fut, "refs", [])]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=120)

    def _check_learner_version(self, version: int | None, expected: int, call: str) -> None:
        """A learner whose weights version is not the run's update count lost its state: Ray restarted it."""
        if version is not None and version != expected:
            raise WorkerLost("actor", f"its {call} answered with weights version {version}, not {expected}: "
                                      "Ray restarted it with its initial state")  # fmt: skip
