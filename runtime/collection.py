"""Collecting env steps: one segment of rollouts over every env worker, read back into ``ctx.batch``.

:class:`Collection` is mixed into :class:`~.controller.RunControllerImpl`. A segment runs on the env workers
(``colocated``: each with its own policy), served per step by the rollout workers (``direct`` calls or the
obs/actions ``channel``s); its trajectories come back through the ``trajectories`` channel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from rlinf_nb import tree
from rlinf_nb.config import to_dict

from .channel import DEFAULT
from .links import LinkDelays
from .recovery import RECOVERABLE, WorkerLost
from .worker import GroupFuture
from .workers import rollout_rounds


class Collection:
    """On-policy rollouts (``collect_rollout``) and off-policy segments in flight beside training (``collect_async``)."""

    def collect_rollout(
        self, steps: int, reset_seeds: list[int] | None = None, acting: str = "sample"
    ) -> dict[str, Any]:
        for attempt in range(4):
            try:
                return self._collect_rollout_once(steps, reset_seeds, acting)
            except RECOVERABLE as exc:
                if attempt == 3:
                    raise
                self._recover_lost_worker(exc)
        raise AssertionError("unreachable")

    def _collect_rollout_once(
        self, steps: int, reset_seeds: list[int] | None = None, acting: str = "sample"
    ) -> dict[str, Any]:
        if reset_seeds is not None:
            self._reset_envs(reset_seeds)
        segment = self._start_segment(steps, transitions=False, acting=acting)
        return self._finish_segment(segment)

    def _reset_envs(self, seeds: list[int]) -> None:
        """Reset every env worker's envs, env ``i`` of worker ``r`` with ``seeds[r * num_envs + i]``."""
        n, group = self.cfg.env.num_envs, self.groups["env"]
        if len(seeds) != n * len(group):
            raise ValueError(f"reset_seeds: got {len(seeds)} seeds for {n * len(group)} envs")
        group.call("reset", rank_args=[(list(seeds[r * n : (r + 1) * n]),) for r in range(len(group))]).get(
            timeout=300
        )

    def _start_segment(self, steps: int, transitions: bool, acting: str = "sample") -> tuple[Any, Any]:
        """Start ``steps`` env steps on every env worker, served by the rollout workers (non-blocking).

        With action chunks (``policy.chunk = k``) the policy answers once per ``k`` steps. ``acting``:
        ``sample`` or ``mode`` (see :data:`.inference.ACTING_MODES`); the off-policy warm-up of
        ``algo.random_steps`` makes it ``random``.
        """
        from rlinf_nb.algorithms.chunks import check_chunk_steps

        ch = self.channels
        chunk, prefetch = self.cfg.policy.chunk, self.cfg.policy.chunk_prefetch
        decisions = check_chunk_steps(steps, chunk, "rollout steps")
        # off-policy warm-up: uniform random actions until algo.random_steps env steps are collected
        if transitions and self._in_random_warmup():
            acting = "random"
        if self.colocated:
            env_fut = self.groups["env"].call(
                "rollout_colocated", steps, ch["trajectories"], ch.get("frames"), transitions, chunk=chunk,
                weights=self.latest_weights, acting=acting, prefetch=prefetch,
            )  # fmt: skip
            return env_fut, GroupFuture(self.groups["env"], "rollout_colocated", [])
        self._resync_restarted_rollout_workers()
        if self.env_to_rollout == "direct":
            policies = self.groups["rollout"].actors
            n_roll = len(policies)
            links = self.cfg.placement.links  # the launch's linked streams, as retuned since (maybe zeroed)
            direct = {k: to_dict(getattr(links, k)) for k in self.link_streams if k != "trajectories"}
            env_fut = self.groups["env"].call(
                "rollout_direct", steps, ch["trajectories"], ch.get("frames"), transitions, chunk=chunk,
                rank_args=[(policies[r % n_roll],) for r in range(len(self.groups["env"]))],
                **({"links": direct} if direct else {}), acting=acting, prefetch=prefetch,
            )  # fmt: skip
            return env_fut, GroupFuture(self.groups["rollout"], "infer", [])
        env_fut = self.groups["env"].call(
            "rollout",
            steps,
            ch["obs"],
            ch["actions"],
            ch["trajectories"],
            ch.get("frames"),
            transitions,
            chunk=chunk,
            acting=acting,
            prefetch=prefetch,
        )
        rounds = rollout_rounds(decisions, prefetch, value_round=not transitions)
        roll_fut = self.groups["rollout"].call(
            "serve", rank_args=[(rounds, ranks, ch["obs"], ch["actions"]) for ranks in self.env_ranks_of]
        )
        return env_fut, roll_fut

    def _resync_restarted_rollout_workers(self) -> None:
        """Send the last synced weights to rollout workers that do not have them, and record it.

        A rollout worker that Ray restarted (killed, OOM) comes back with its initial weights: without
        this it would act with them until the next sync, and an on-policy batch would mix two policies.
        """
        if self.latest_weights is None:
            return
        refs, version = self.latest_weights
        group = self.groups["rollout"]
        stale = [rank for rank, v in enumerate(group.call("weights_version").get(timeout=120)) if v < version]
        if not stale:
            return
        for rank in stale:
            group.call_one(rank, "set_weights", refs[0], version).get(timeout=120)
        self.event("recovery", group="rollout", ranks=stale, action="weights_resent", version=version,
                   note="rollout worker(s) restarted by Ray had lost the synced weights; sent again")  # fmt: skip

    def _in_random_warmup(self) -> bool:
        """Whether the next segment still belongs to ``algo.random_steps`` (an event marks its end)."""
        random_steps = getattr(self.cfg.algo, "random_steps", 0) or 0
        if self.env_steps < random_steps:
            return True
        if random_steps and not self.random_warmup_done:
            self.random_warmup_done = True
            self.event("random_steps_done", random_steps=random_steps)
        return False

    def _finish_segment(self, segment: tuple[Any, Any]) -> dict[str, Any]:
        """Wait for a segment, read its trajectories into ``ctx.batch`` ([T, N] arrays) and count them."""
        env_fut, roll_fut = segment
        ch = self.channels
        self._await_segment(env_fut, roll_fut)
        env_results = env_fut.get()
        roll_fut.get()
        self._note_env_restarts([r.get("incarnation") for r in env_results])
        n_env = len(self.groups["env"])
        # Every env worker has put its segment (a blocking put) before its rollout returned: only a linked
        # stream holds it back, until its simulated delivery time, however long the link's latency is.
        wait = None if "trajectories" in self.link_streams else DEFAULT  # placement.channel_timeout_s
        trajs = ch["trajectories"].get_batch(list(range(n_env)), timeout=wait, as_torch=False)
        if self.link_streams:
            self._measure_links(env_results)
        batch = {  # [T, N] along the envs of all workers; dict obs concatenate leaf by leaf
            k: tree.concatenate([t["batch"][k] for t in trajs], axis=1)
            for k in trajs[0]["batch"]
            if k != "last_values"
        }
        if "last_values" in trajs[0]["batch"]:
            batch["last_values"] = np.concatenate([t["batch"]["last_values"] for t in trajs])
        self.ctx.batch = batch
        new_steps = sum(t["env_steps"] for t in trajs)
        returns = [r for t in trajs for r in t["episode_returns"]]
        with self.lock:
            for rank, t in enumerate(trajs):  # trajectories come in rank order
                self.worker_env_steps[rank] += t["env_steps"]
                self.worker_episodes[rank] += len(t["episode_returns"])
            self.env_steps += new_steps
            self.episodes += len(returns)
            self.returns_window.extend(returns)
            self.lengths_window.extend(x for t in trajs for x in t["episode_lengths"])
            self.success_window.extend(x for t in trajs for x in t["successes"])
        codec = [t["obs_codec"] for t in trajs if t.get("obs_codec")]
        if codec:  # cumulative per worker: bytes sent / raw bytes of the compressed observations
            raw = sum(c["raw_bytes"] for c in codec)
            self.obs_compression = sum(c["sent_bytes"] for c in codec) / raw if raw else None
        human = [t["human"] for t in trajs if "human" in t]
        if human:
            self._record_human(human, new_steps)
        timed = [r for r in env_results if "env_s" in r]
        if timed:  # where the segment's time went, mean over the env workers
            self.rollout_times = {"time/rollout_env": float(np.mean([r["env_s"] for r in timed])),
                                  "time/rollout_policy": float(np.mean([r["policy_s"] for r in timed]))}  # fmt: skip
        stale = [r["stale_chunks"] for r in env_results if "stale_chunks" in r]
        if stale:  # prefetched chunks that started in a new episode from the old one's last observation
            self.stale_chunk_rate = sum(stale) / max(1, new_steps // self.cfg.policy.chunk)
        return {"env_steps": new_steps, "episodes": len(returns),
                "episode_return_mean": float(np.mean(returns)) if returns else None}  # fmt: skip

    def _await_segment(self, env_fut: GroupFuture, roll_fut: GroupFuture) -> None:
        """Wait until every worker of a segment has returned; raise the first failure seen.

        When a worker dies or raises, the others are told to abort. A peer that cannot take the abort yet
        (an e-stopped env waits in its reset until it is cleared) is waited for, however long the e-stop is
        held; meanwhile ``status()["failing"]`` says what will end the rollout, and a ``worker_failed``
        event records it.
        """
        pending = env_fut.refs + roll_fut.refs
        failure: BaseException | None = None
        noted = False  # the failure was checked against a held env
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=600)
                if not done and self.robots.any_estopped_now():
                    continue  # an e-stopped env waits for its clear: not a hung worker
                if not done:
                    failure = TimeoutError("rollout: no worker finished within 600 s")
                    self._abort_rollout()
                    break
                try:
                    report = ray.get(done[0])
                    if not report["ok"] and failure is None:
                        if report.get("lost_peer"):  # e.g. an env worker whose rollout worker died under it
                            failure = WorkerLost(report["lost_peer"], report["error"][-600:])
                        else:
                            failure = RuntimeError(f"rollout worker failed:\n{report['error']}")
                        self._abort_rollout()
                except RECOVERABLE as exc:
                    if failure is None or not isinstance(failure, RECOVERABLE):
                        group = "rollout" if done[0] in roll_fut.refs else "env"
                        failure = WorkerLost(group, f"{type(exc).__name__}: {str(exc)[:300]}")
                    self._abort_rollout()
                if failure is not None and pending and not noted:
                    noted = True
                    self._note_failing(failure)
            if failure is not None:
                raise failure
        finally:
            with self.lock:
                self.failing = None

    def _note_failing(self, failure: BaseException) -> None:
        """A failure that must wait for an e-stopped env's clear: ``status()["failing"]`` and an event."""
        if not self.robots.any_estopped_now(timeout=5.0):  # 5 s: a lost env worker may be slow to answer
            return  # the other workers take the abort at once
        lines = [line for line in str(failure).splitlines() if line.strip()] or [type(failure).__name__]
        # a lost worker's message leads with who was lost; a raised error's traceback ends with what it was
        text = (lines[0] if isinstance(failure, WorkerLost) else lines[-1])[:300]
        with self.lock:
            self.failing = text
        self.event("worker_failed", detail=text,
                   note="the rollout is aborted; it ends once the e-stopped env(s) are cleared (an e-stopped env "
                        "waits in its reset), and then the run recovers or fails")  # fmt: skip

    def _measure_links(self, env_results: list[dict[str, Any]]) -> None:
        """``link_delay_ms`` of the segment: the linked channels' new delays plus the direct path's."""
        delays = LinkDelays()
        for r in env_results:
            delays.merge(r.get("link_delays") or {})
        for name in self.link_streams:
            if name not in self.channels:  # direct path: its delays come with the env workers' results
                continue
            m = self.channels[name].metrics()
            total = (m.get("link_delay_s", 0.0), m.get("link_messages", 0))
            seen = self.link_seen.get(name, (0.0, 0))
            if total[1] > seen[1]:
                delays.add(name, total[0] - seen[0], total[1] - seen[1])
            self.link_seen[name] = total
        self.link_metrics = delays.metrics()

    def _record_human(self, tallies: list[dict[str, Any]], new_steps: int) -> None:
        """Intervention metrics of one segment, and an ``intervention`` event when a human took over."""
        steps = sum(h["intervened_steps"] for h in tallies)
        takeovers = sum(h["takeovers"] for h in tallies)
        arm_steps: dict[str, int] = {}  # multi-arm robots: steps a human drove each arm
        for h in tallies:
            for path, n in h.get("arm_steps", {}).items():
                arm_steps[path] = arm_steps.get(path, 0) + n
        with self.lock:
            self.intervention_rate = steps / max(1, new_steps)
            if len(arm_steps) > 1:
                self.arm_intervention_rates = {p: n / max(1, new_steps) for p, n in arm_steps.items()}
            self.clean_success_window.extend(x for h in tallies for x in h["clean_successes"])
        if takeovers:
            per_arm = {f"intervened_steps/{p}": n for p, n in arm_steps.items()} if len(arm_steps) > 1 else {}
            self.event("intervention", takeovers=takeovers, intervened_steps=steps, **per_arm)

    def collect_async(self, steps: int, block: bool) -> dict[str, Any]:
        """Off-policy collection that runs while the learner trains.

        A segment of ``steps`` env steps per env is always in flight. When it has finished (or
        ``block`` is true and it is waited for), its transitions become ``ctx.batch`` and the next
        segment starts at once; otherwise ``ctx.batch`` is empty and nothing is counted.
        """
        for attempt in range(4):
            try:
                if self._segment is None:
                    self._segment = self._start_segment(steps, transitions=True)
                if not block and not (self._segment[0].ready() and self._segment[1].ready()):
                    self.ctx.batch = {}
                    return {"env_steps": 0}
                segment, self._segment = self._segment, None
                summary = self._finish_segment(segment)
                batch = self.ctx.batch
                self._segment = self._start_segment(steps, transitions=True)  # collect during the update
                self.ctx.batch = batch
                return summary
            except RECOVERABLE as exc:
                self._segment = None
                if attempt == 3:
                    raise
                self._recover_lost_worker(exc)
        raise AssertionError("unreachable")
