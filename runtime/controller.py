"""The RunController: one detached named actor per run, owning the loop.

Training runs in a thread of the actor; the control API (``pause``, ``step``,
``set_hparams``, ``metrics_since``, ...) runs on the actor's event loop, so control
calls stay fast while a stage is busy. The loop is the algorithm's list of named
stages; before each stage the *gate* applies pending hyperparameter changes and
honours pause / step / stop. Everything that matters is written to the run
directory, from which a crashed controller is rebuilt (``resume=True``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import inspect
import os
import threading
import time
import traceback
from typing import Any

import cloudpickle
import numpy as np
import ray

from rlinf_nb import tree
from rlinf_nb.algorithms.init_from import newest_checkpoint_of_run
from rlinf_nb.algorithms.registry import Algorithm, Stage, get_algorithm, install_algorithm
from rlinf_nb.config import ConfigError, build, deep_merge, to_dict
from rlinf_nb.run_config import PlacementConfig, RunConfig, live_params, resolve_key

from .channel import DEFAULT, MAX_WAITERS, Channel
from .links import LinkDelays
from .robot_claims import claim_robots, rank_resources, release_robots
from .robot_control import RobotFleet
from .rundir import RunDir, dedupe_steps
from .setup_progress import SetupReporter
from .worker import (
    GroupFuture,
    GroupPlacement,
    LocalWorkerGroup,
    WorkerGroup,
    check_placement,
    node_totals,
    route_env_to_rollout,
)
from .workers import ABORT, EnvWorker, LearnerWorker, RolloutWorker, rollout_rounds

ACTOR_PREFIX = "run:"


class WorkerLost(RuntimeError):
    """A worker of ``group`` died (or Ray is restarting it) during a rollout: recover the group and repeat it."""

    def __init__(self, group: str, detail: str):
        self.group, self.detail = group, detail
        super().__init__(f"a {group} worker was lost during the rollout: {detail}")


RECOVERABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, WorkerLost)


def actor_name(run_name: str) -> str:
    return f"{ACTOR_PREFIX}{run_name}"


def summarize_batch(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """Key, shape, dtype and simple statistics of every array in a batch (dict obs: ``obs/<key>`` rows)."""
    rows = []
    for key, arr in tree.items(batch):
        arr = np.asarray(arr)
        row: dict[str, Any] = {"key": key, "shape": tuple(arr.shape), "dtype": str(arr.dtype)}
        if arr.size and np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
            a = arr.astype(np.float64)
            row.update(mean=float(a.mean()), std=float(a.std()), min=float(a.min()), max=float(a.max()))
        rows.append(row)
    return rows


class StageContext:
    """What a stage function sees (see :mod:`rlinf_nb.algorithms.stages`)."""

    def __init__(self, controller: RunControllerImpl):
        self._c = controller
        self.batch: dict[str, Any] = {}
        self.state: dict[str, Any] = {}  # what stages keep between calls (counters, schedules)

    @property
    def cfg(self) -> RunConfig:
        return self._c.cfg

    @property
    def hp(self) -> Any:
        return self._c.cfg.algo

    @property
    def progress(self) -> float:
        return min(1.0, self._c.env_steps / max(1, self._c.cfg.budget.total_env_steps))

    def collect_rollout(
        self, steps: int, reset_seeds: list[int] | None = None, acting: str = "sample"
    ) -> dict[str, Any]:
        """``steps`` env steps per env; ``reset_seeds`` (one per env over all env workers, in rank
        order) first resets every env with its seed (GRPO's groups); ``acting``: ``sample`` from the
        policy, or its ``mode`` (evaluation)."""
        return self._c.collect_rollout(steps, reset_seeds, acting)

    @property
    def env_steps(self) -> int:
        return self._c.env_steps

    @property
    def update_step(self) -> int:
        return self._c.update_step

    def collect_async(self, steps: int, block: bool = False) -> dict[str, Any]:
        return self._c.collect_async(steps, block)

    def learner_update(self, keys: list[str]) -> dict[str, Any]:
        return self._c.learner_update(keys)

    def sync_weights(self) -> dict[str, Any]:
        return self._c.sync_weights()


class RunControllerImpl:
    """The loop and its state; wrapped as a Ray actor by :data:`RunController`."""

    def __init__(self, name: str, config: dict[str, Any], resume: bool = False,
                 algorithm: bytes | None = None, paused: bool = False,
                 resume_overrides: dict[str, Any] | None = None, obs_features: bytes | None = None):  # fmt: skip
        """``resume_overrides``: the nested overrides a ``resume=True`` launch was given; they apply on top
        of the restored checkpoint's config (which carries the live changes made before it was saved).
        ``obs_features``: the feature set ``env.kwargs.obs_features`` names, shipped by the client; the env
        workers and the learner (which records demos) install it before they build envs."""
        self.created_at = time.perf_counter()
        self.name = name
        self.run_dir = RunDir(name)
        self.groups: dict[str, WorkerGroup | LocalWorkerGroup] = {}
        self.channels: dict[str, Channel] = {}
        self.claimed_robots: list[str] = []  # placement.env.robots, once claimed (released when the run ends)
        # The env workers start first, from the config dict alone: their start overlaps the import of
        # the algorithm (torch) below. What goes wrong there is raised by setup() (the run fails).
        self.env_start_error: BaseException | None = None
        # placement.env_to_rollout as this run uses it (``auto`` resolved by where the workers can go)
        self.env_to_rollout: str = str(config["placement"].get("env_to_rollout", "direct"))
        self.obs_features = obs_features
        self.placements = self._start_env_workers(config)
        env_requested = time.perf_counter()
        if algorithm is not None:  # shipped by the client (cloudpickled): may be defined in a notebook cell
            install_algorithm(cloudpickle.loads(algorithm))
        self.cfg: RunConfig = build(RunConfig, config)
        # the placement.links streams linked at launch: their latency and bandwidth are live hparams
        self.link_streams = tuple(self.cfg.placement.links.active())
        # setup_*_s of the start event: seconds from this __init__ (the env workers' start comes first)
        self.setup_timings: dict[str, float] = {
            "setup_env_requested_s": env_requested - self.created_at,
            "setup_config_s": time.perf_counter() - self.created_at,  # the algorithm imported, config built
        }
        self.algo: Algorithm = get_algorithm(self.cfg.algorithm)
        self.stages: list[Stage] = list(self.algo.stages)
        # placement.env_to_rollout: colocated -> no rollout workers; each env worker runs the policy itself
        self.colocated = self.cfg.placement.env_to_rollout == "colocated"
        self.ctx = StageContext(self)
        self.overrides: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.mode = "pause" if paused else "run"  # run | pause | step; paused: wait before the first stage
        self.state = "starting"  # starting | running | paused | finished | stopped | failed
        self.setup_progress: dict[str, Any] | None = None  # long setup work, reported by the learner
        self.error: str | None = None
        # a worker failed mid-rollout while an e-stopped env holds the rollout (it waits in its reset): what
        # will end the rollout at the clear, and then fail or recover the run; None otherwise
        self.failing: str | None = None
        self.stop_requested = False
        self.step_target: str | None = None  # step mode: run until this stage (or "__next__") completes
        self.step_allowed = False
        self.stages_done = 0
        self.last_stage_summary: dict[str, Any] = {}
        self.current_stage: str | None = None
        self.pending_hparams: dict[str, Any] = {}
        self.update_step = 0
        self.env_steps = 0
        self.episodes = 0
        self.returns_window: collections.deque = collections.deque(maxlen=self.cfg.metrics_window)
        self.lengths_window: collections.deque = collections.deque(maxlen=self.cfg.metrics_window)
        self.success_window: collections.deque = collections.deque(maxlen=self.cfg.metrics_window)
        # Human in the loop (robot envs with a human): per-episode clean successes, last segment's rate
        self.clean_success_window: collections.deque = collections.deque(maxlen=self.cfg.metrics_window)
        self.intervention_rate: float | None = None
        self.arm_intervention_rates: dict[str, float] = {}  # multi-arm robots: per arm path
        self.robots = RobotFleet(self)  # robot envs: e-stop commands and their last state
        self.stage_times: dict[str, float] = {}
        self.recordings_closed = False
        self.obs_compression: float | None = None  # compression.obs: bytes sent / raw, so far
        self.stale_chunk_rate: float | None = None  # policy.chunk_prefetch: of the last segment's decisions
        self.link_metrics: dict[str, float] = {}  # placement.links: link_delay_ms of the last segment
        self.link_seen: dict[str, tuple[float, int]] = {}  # per linked channel: its delay totals so far
        self.metrics_rows: list[dict[str, Any]] = []
        self.event_rows: list[dict[str, Any]] = []
        self.started_at = time.time()
        self.iter_started = time.perf_counter()
        self.resume = resume
        self.resume_overrides = resume_overrides or {}
        self.placement_info: list[dict[str, Any]] = []
        self.released = False
        self.worker_env_steps: collections.Counter = collections.Counter()  # env steps per env worker rank
        self.worker_episodes: collections.Counter = collections.Counter()  # episodes per env worker rank
        self.resumed_from: int | None = None
        self.ended_at: float | None = None
        self._segment: tuple[Any, Any] | None = None  # off-policy: the collection segment in flight
        # ([ref], version) of the last sync: colocated rollout calls carry it; rollout workers that Ray
        # restarted (back at their initial weights) get it again before the next segment
        self.latest_weights: tuple[list[Any], int] | None = None
        self.random_warmup_done = False  # algo.random_steps collected (the event is written once)
        self.env_incarnations: list[str | None] = []  # per env worker rank: which start of it (restarts)
        self.thread = threading.Thread(target=self._main, name=f"run-{name}", daemon=True)

    # ------------------------------------------------------------------ logs

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        row = {
            "time": time.time(),
            "step": self.update_step,
            "env_steps": self.env_steps,
            "kind": kind,
            **data,
        }
        with self.lock:
            self.event_rows.append(row)
        self.run_dir.events.append(row)
        return row

    # ------------------------------------------------------------------ setup

    def _start_env_workers(self, config: dict[str, Any]) -> dict[str, GroupPlacement]:
        """Claim the robots, check the whole placement, start the env workers; the groups' placements.

        Reads only the run's config dict (resolved by the client) and torch-free config classes, so it
        runs before the algorithm is imported. A failure is kept in ``env_start_error`` for setup().
        """
        try:
            p = build(PlacementConfig, config["placement"])
            placements = group_placements(p)
            # Robots first: a held or unknown robot fails here, naming it (and who holds it).
            claim_robots(self.name, p.env.robots, run_alive=_run_alive, node_group=p.env.node_group)
            self.claimed_robots = list(p.env.robots)
            check_placement(placements)
            lanes = p.lanes and not any(p.links.channel_link(k) for k in ("obs", "actions"))
            self.env_to_rollout = route_env_to_rollout(p.env_to_rollout, placements, node_totals(), lanes)
            # the channel actors boot alongside the env workers, so the first rollout need not wait for them
            self.channels = self._create_channels(p, config["env"]["render_every"])
            colocated = p.env_to_rollout == "colocated"  # each env worker runs its own copy of the policy
            self.groups["env"] = WorkerGroup(
                "env", EnvWorker, placements["env"], (config["env"], config["seed"]),
                {"record": _record_section(config["record"], self.run_dir),
                 "compression": config["compression"], "robots": p.env.robots,
                 **({"policy": config["policy"]} if colocated else {}),
                 **({"obs_features": self.obs_features} if self.obs_features else {})},
                max_restarts=3,
            )  # fmt: skip
            return placements
        except Exception as exc:  # noqa: BLE001 - raised again by setup(), where a run's failures are reported
            self.env_start_error = exc
            return {}

    def _create_channels(self, p: PlacementConfig, render_every: int) -> dict[str, Channel]:
        """The run's channels, each an actor to start: obs/actions only where actions travel through
        them (``channel`` mode), frames only where the env workers render (``env.render_every``)."""
        links = p.links  # placement.links: simulated latency/bandwidth per stream (None = no link)
        # a waiting get or put holds one of a channel's call threads: one per worker, the controller's, an abort
        waiters = max(MAX_WAITERS, p.env.num_workers + p.rollout.num_workers + 4)
        per_step = ("obs", "actions") if self.env_to_rollout == "channel" else ()
        channels = {
            name: Channel.create(
                f"{self.name}/{name}", 2, link=links.channel_link(name), max_waiters=waiters,
                lanes=p.lanes and links.channel_link(name) is None, default_timeout_s=p.channel_timeout_s,
            )
            for name in (*per_step, "trajectories")
        }  # fmt: skip
        if render_every:
            channels["frames"] = Channel.create(
                f"{self.name}/frames", 1, drop_oldest=True, max_waiters=waiters,
                default_timeout_s=p.channel_timeout_s,
            )  # fmt: skip
        return channels

    def setup(self) -> None:
        cfg = self.cfg
        t_setup = self.created_at  # the start event's setup_*_s count from the controller's __init__
        timings = {**self.setup_timings, "setup_begin_s": time.perf_counter() - t_setup}
        if self.resume and self.run_dir.exists:
            self.metrics_rows = dedupe_steps(self.run_dir.metrics.read())
            self.event_rows = self.run_dir.events.read()
            self.random_warmup_done = any(r.get("kind") == "random_steps_done" for r in self.event_rows)
        elif not self.run_dir.exists:
            self.run_dir.create(to_dict(cfg))
        if self.env_start_error is not None:
            raise self.env_start_error
        p = cfg.placement
        placements = self.placements
        n_env = p.env.num_workers
        links = p.links  # placement.links: simulated latency/bandwidth per stream (None = no link)
        if links.active():
            self.event("links", env_to_rollout=self.env_to_rollout, **links.describe())
        env_dict = to_dict(cfg.env)
        policy_dict = to_dict(cfg.policy)
        # The rollout and learner workers start now and read the spaces once env worker 0 has them.
        spaces = [self.groups["env"].actors[0].spaces.remote()]
        # Held for the run's life: a restarted rollout/learner worker reads the spaces again from this
        # nested ref, and Ray frees a nested ref once its owner (here) drops it (session 17's flake).
        self.spaces_ref = spaces
        if not self.colocated:  # colocated: each env worker runs its own copy of the policy
            self.groups["rollout"] = WorkerGroup("rollout", RolloutWorker, placements["rollout"],
                                                 (policy_dict, spaces, cfg.seed), max_restarts=3)  # fmt: skip
        learner_args = (self.algo, self._learner_start_config(cfg.algo), policy_dict, spaces, cfg.seed)
        if p.learner == "controller":  # built here, its imports overlapping the env workers' start
            try:
                self.groups["actor"] = LocalWorkerGroup("actor", LearnerWorker, learner_args)
            except Exception:
                self.groups["env"].call_one(0, "spaces").get(timeout=300)  # an env that failed says so first
                raise
        else:
            self.groups["actor"] = WorkerGroup(
                "actor", LearnerWorker, placements["actor"], learner_args, max_restarts=3
            )  # a lost learner is restored from a checkpoint
        self.groups["env"].call_one(0, "spaces").get(timeout=300)  # an env that fails to build says so here
        timings["setup_env_s"] = time.perf_counter() - t_setup
        self.env_ranks_of = [[r for r in range(n_env) if r % p.rollout.num_workers == j]
                             for j in range(p.rollout.num_workers)]  # fmt: skip
        for g in self.groups.values():
            self.placement_info += g.health(timeout=300)
        self.env_incarnations = [h.get("incarnation") for h in self.placement_info if h.get("group") == "env"]
        timings["setup_workers_s"] = time.perf_counter() - t_setup
        self._prepare_learner(cfg, env_dict)
        if self.resume:
            self._restore()
        self.sync_weights()
        timings["setup_s"] = time.perf_counter() - t_setup
        self.setup_timings = {k: round(v, 3) for k, v in timings.items()}

    def _prepare_learner(self, cfg: RunConfig, env_dict: dict[str, Any]) -> None:
        """The learner's setup work after it is built: a demo buffer (``algo.demos``), a dataset (``algo.dataset``).

        Run at setup and again for a learner that Ray restarted (:meth:`_recover_lost_learner`).
        """
        demos = getattr(cfg.algo, "demos", None)
        if demos:  # a resumed run's checkpoint replaces the demo buffer with its own copy
            progress = self._setup_reporter(f"playing demos ({demos})")
            stats = (
                self.groups["actor"]
                .call("load_demos", demos, env_dict, cfg.seed, progress, self.obs_features)
                .get(timeout=900)[0]
            )
            self.event("demos", source=demos, **stats)
        dataset = getattr(cfg.algo, "dataset", None)
        if dataset:  # an offline learner's dataset (BC): loaded on the learner, recorded on first use
            progress = self._setup_reporter(f"recording dataset ({dataset})")
            stats = (
                self.groups["actor"]
                .call("load_dataset", dataset, env_dict, cfg.seed, cfg.algo, progress, self.obs_features)
                .get(timeout=1800)[0]
            )
            self.event("dataset", source=dataset, **stats)

    def _setup_reporter(self, task: str) -> SetupReporter | None:
        """A progress callback for the learner's setup work, reporting to this run's controller actor."""
        try:
            return SetupReporter(ray.get_runtime_context().current_actor, task)
        except RuntimeError:  # not inside an actor (a controller built in-process): no reports
            return None

    def report_setup(self, task: str, done: int, total: int) -> None:
        """Keep the newest report; :meth:`status` shows it only while the run is starting."""
        with self.lock:
            self.setup_progress = {"task": task, "done": done, "total": total}

    def _learner_start_config(self, algo_cfg: Any) -> Any:
        """``algo_cfg`` as the learner is built with: a run restoring its own checkpoint skips ``init_from``.

        So resuming a fine-tune never reads (or needs) the run it started from; a fresh start records
        which checkpoint of that run it loads (event ``init_from``).
        """
        if not getattr(algo_cfg, "init_from", None):
            return algo_cfg
        if self.resume and self.run_dir.latest_checkpoint() is not None:
            return dataclasses.replace(algo_cfg, init_from=None)  # the checkpoint replaces the policy
        _, source = newest_checkpoint_of_run(algo_cfg.init_from)
        self.event("init_from", run=algo_cfg.init_from, checkpoint=source.path.name, from_step=source.step)
        return algo_cfg

    def _close_recordings(self) -> None:
        """Finalize every env worker's open recording shard before the workers go (an event says what was kept)."""
        if not self.cfg.record.enabled or "env" not in self.groups or self.recordings_closed:
            return
        self.recordings_closed = True
        try:
            results = self.groups["env"].call("close_recording").get(timeout=180)
        except Exception as exc:  # noqa: BLE001 - finalized shards are safe; say what happened
            self.event("recording", error=str(exc)[-2000:])
            return
        done = [r for r in results if r]
        self.event("recording", episodes=sum(r["episodes"] for r in done), skipped=sum(r["skipped"] for r in done),
                   roots=[r["root"] for r in done])  # fmt: skip

    def _restore(self) -> None:
        info = self.run_dir.latest_checkpoint()
        if info is None:
            self.event("resume", checkpoint=None, note="no complete checkpoint: starting fresh")
            self.metrics_rows = []
            return
        dropped = self._load_checkpoint(info, config=True)
        self.resumed_from = info.step
        self.event("resume", checkpoint=info.path.name, from_step=info.step, discarded_rows=dropped,
                   overrides=self.resume_overrides)  # fmt: skip

    def _load_checkpoint(self, info: Any, config: bool) -> int:
        """Load checkpoint ``info`` into the learner and roll the run's counters back to it.

        ``config``: also take the checkpoint's config (a resume: the live changes made before the checkpoint,
        then the launch's overrides); a learner restored in place keeps the live config. Returns how many
        metrics rows after the checkpoint were dropped (their steps are run again).
        """
        state = self.run_dir.load_checkpoint(info)
        self.groups["actor"].call("load_state_dict", state["learner"]).get(timeout=120)
        with self.lock:
            self.update_step = state["update_step"]
            self.env_steps = state["env_steps"]
            self.episodes = state["episodes"]
            for window, key in ((self.returns_window, "returns_window"), (self.lengths_window, "lengths_window"),
                                (self.success_window, "success_window")):  # fmt: skip
                window.clear()
                window.extend(state.get(key, []))
            # per env worker (checkpoints written before session 17 lack them: they start at 0)
            self.worker_env_steps = collections.Counter(state.get("worker_env_steps", {}))
            self.worker_episodes = collections.Counter(state.get("worker_episodes", {}))
            dropped = sum(1 for r in self.metrics_rows if r["step"] > self.update_step)
            self.metrics_rows = [r for r in self.metrics_rows if r["step"] <= self.update_step]
        if config and state.get("config"):
            self.cfg = build(RunConfig, deep_merge(state["config"], self.resume_overrides))
        np.random.set_state(state["numpy_rng"])
        return dropped

    # ------------------------------------------------------------------ stage context services

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
            if not aborted and any(_ended_badly(r) for r in ended):
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

    def learner_update(self, keys: list[str]) -> dict[str, Any]:
        batch = {k: self.ctx.batch[k] for k in keys + ["versions"] if k in self.ctx.batch}
        out = self.groups["actor"].call("update", batch, self.cfg.algo, self.ctx.progress).get()[0]
        self._check_learner_version(out.get("policy_version"), self.update_step + 1, "update")
        with self.lock:
            self.update_step += 1
        return out

    def _check_learner_version(self, version: int | None, expected: int, call: str) -> None:
        """A learner whose weights version is not the run's update count lost its state: Ray restarted it."""
        if version is not None and version != expected:
            raise WorkerLost("actor", f"its {call} answered with weights version {version}, not {expected}: "
                                      "Ray restarted it with its initial state")  # fmt: skip

    def sync_weights(self) -> dict[str, Any]:
        weights, version = self.groups["actor"].call_one(0, "get_weights").get()[0]
        self._check_learner_version(version, self.update_step, "get_weights")
        ref = ray.put(weights)
        self.latest_weights = ([ref], version)
        if self.colocated:  # every colocated rollout call carries the latest weights: loaded first
            # A collection in flight (off-policy) gets them now, parked and loaded before its next decision;
            # between on-policy rollouts the next rollout call brings them (one round trip fewer).
            in_flight = self._segment is not None
            offers = (
                [a.offer_weights.remote(ref, version) for a in self.groups["env"].actors] if in_flight else []
            )
            for offer in offers:
                try:
                    ray.get(offer, timeout=120)
                except RECOVERABLE:  # a dead or restarting env worker loads them at its next rollout
                    pass
        else:  # a rollout worker answers after the serve call of an off-policy segment in flight
            self._await_beside_segment(self.groups["rollout"].call("set_weights", ref, version))
        return {
            "weights_version": version,
            "weights_bytes": int(sum(np.asarray(v).nbytes for v in weights.values())),
        }

    # ------------------------------------------------------------------ the loop

    def _gate(self, stage: str) -> bool:
        """Block before ``stage`` as the mode demands; False when the run must stop."""
        with self.cond:
            while True:
                self._apply_pending_hparams()
                if self.stop_requested:
                    return False
                if self.mode == "run":
                    self.state = "running"
                    break
                if self.mode == "step" and self.step_allowed:
                    self.state = "stepping"
                    if self.step_target == "__next__":
                        self.step_allowed = False
                    break
                self.state = "paused"
                self.current_stage = stage
                self.cond.wait(0.5)
            self.current_stage = stage
        return True

    def _apply_pending_hparams(self) -> None:
        if not self.pending_hparams:
            return
        changes, self.pending_hparams = self.pending_hparams, {}
        old = {k: _get_path(self.cfg, k) for k in changes}
        merged = to_dict(self.cfg)
        for key, value in changes.items():
            _set_path(merged, key, value)
        self.cfg = build(RunConfig, merged)
        for name in self.link_streams:  # a retuned link of a channel: its actor applies it from now on
            if name in self.channels and any(k.startswith(f"placement.links.{name}.") for k in changes):
                self.channels[name].set_link(self.cfg.placement.links.stream_link(name))
        self.event("hparams", changes={k: {"old": old[k], "new": v} for k, v in changes.items()})

    def _run_stage(self, stage: Stage) -> dict[str, Any]:
        fn = self.overrides.get(stage.name, (stage.fn,))[0]
        t0 = time.perf_counter()
        summary = fn(self.ctx) or {}
        self.stage_times[stage.name] = time.perf_counter() - t0
        return summary

    def _main(self) -> None:
        try:
            self.setup()
            self.event("start", resumed_from=self.resumed_from, algorithm=self.cfg.algorithm,
                       paused=self.mode == "pause", env_to_rollout=self.env_to_rollout,
                       **self.setup_timings)  # fmt: skip
            self.run_dir.write_status(self.status())
            while True:
                try:
                    while not self._budget_done():
                        if not self._iteration():
                            break  # stop requested inside the iteration
                    self.save_checkpoint(reason="end")
                    break
                except RECOVERABLE as exc:  # a lost learner, during an iteration or the end checkpoint
                    if not self._recover_lost_learner(exc):
                        raise
                    with self.cond:  # the iteration starts over from the checkpoint's state
                        self.current_stage = self.stages[0].name
                        self.cond.notify_all()
            self._close_recordings()  # before the state says finished: a waiting client then reads it all
            self._release_workers()  # likewise: a run launched once this one reads stopped can claim its robots
            with self.cond:
                self.state = "stopped" if self.stop_requested else "finished"
                self.current_stage = None
                self.cond.notify_all()
            self.event(self.state)
        except Exception:  # noqa: BLE001 - recorded, and visible in status()
            error = traceback.format_exc()
            self._close_recordings()  # the healthy workers' open shards are kept
            self._release_workers()
            with self.cond:
                self.state = "failed"
                self.error = error
                self.cond.notify_all()
            self.event("failed", error=self.error[-4000:])
        finally:
            self._release_workers()
            self.ended_at = time.time()
            self._write_status_quietly()

    def _iteration(self) -> bool:
        """One pass over the stages (each behind its gate), then the metrics row; False when a stop came first."""
        self.iter_started = time.perf_counter()
        iter_steps = self.env_steps
        update_metrics: dict[str, Any] = {}
        for i, stage in enumerate(self.stages):
            if not self._gate(stage.name):
                return False
            summary = self._run_stage(stage)
            if stage.name == "update":
                update_metrics = summary
            with self.cond:
                self.last_stage_summary = {"stage": stage.name, **summary}
                self.stages_done += 1
                self.current_stage = self.stages[(i + 1) % len(self.stages)].name
                if self.mode == "step" and self.step_target == stage.name:
                    self.step_allowed = False
                self.cond.notify_all()
        self._end_iteration(update_metrics, self.env_steps - iter_steps)
        return True

    def _write_status_quietly(self) -> None:
        try:
            if self.run_dir.path.exists():
                self.run_dir.write_status(self.status())
        except Exception:  # noqa: BLE001 - the status file is a convenience; the logs are the record
            traceback.print_exc()

    def _budget_done(self) -> bool:
        b = self.cfg.budget
        if self.env_steps >= b.total_env_steps:
            return True
        min_episodes = self.cfg.metrics_window if b.stop_min_episodes is None else b.stop_min_episodes
        if b.stop_metric and self.metrics_rows and self.episodes >= min_episodes:
            value = self.metrics_rows[-1].get(b.stop_metric)
            if value is not None and value >= b.stop_value:
                return True
        return False

    def _end_iteration(self, update_metrics: dict[str, Any], new_steps: int) -> None:
        elapsed = time.perf_counter() - self.iter_started
        row: dict[str, Any] = {
            "step": self.update_step,
            "env_steps": self.env_steps,
            "wall_time": time.time(),
            "episode_return_mean": float(np.mean(self.returns_window)) if self.returns_window else None,
            "episode_length_mean": float(np.mean(self.lengths_window)) if self.lengths_window else None,
            "success_rate": float(np.mean(self.success_window)) if self.success_window else None,
            "episodes": self.episodes,
            "steps_per_s": new_steps / elapsed if elapsed > 0 else None,
        }
        if self.obs_compression is not None:
            row["obs_compression"] = self.obs_compression
        row.update(self.link_metrics)  # placement.links: link_delay_ms (+ per stream); {} when off
        if self.stale_chunk_rate is not None:
            row["stale_chunk_rate"] = self.stale_chunk_rate
        if self.intervention_rate is not None:
            row["intervention_rate"] = self.intervention_rate
            cw = self.clean_success_window
            row["success_without_intervention"] = float(np.mean(cw)) if cw else None
            for path, rate in self.arm_intervention_rates.items():
                row[f"intervention_rate/{path}"] = rate
        for key, value in update_metrics.items():
            row[key] = value
        for name, secs in self.stage_times.items():
            row[f"time/{name}"] = secs
        for key in live_params(self.cfg, self.link_streams):
            row[f"hp/{key}"] = _get_path(self.cfg, key)
        with self.lock:
            self.metrics_rows.append(row)
        self.run_dir.metrics.append(row)
        every = self.cfg.checkpoint.every
        if every and self.update_step % every == 0:
            self.save_checkpoint(reason="periodic")

    def save_checkpoint(self, reason: str = "manual") -> str | None:
        if "actor" not in self.groups:
            return None
        learner_state = self.groups["actor"].call("state_dict").get(timeout=300)[0]
        # a learner restarted since the last update must not be saved as this step's state
        self._check_learner_version(learner_state.get("version"), self.update_step, "state_dict")
        state = {
            "learner": learner_state,
            "update_step": self.update_step,
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "worker_env_steps": dict(self.worker_env_steps),
            "worker_episodes": dict(self.worker_episodes),
            "returns_window": list(self.returns_window),
            "lengths_window": list(self.lengths_window),
            "success_window": list(self.success_window),
            "config": to_dict(self.cfg),
            "numpy_rng": np.random.get_state(),
        }
        path = self.run_dir.save_checkpoint(
            self.update_step, self.env_steps, state, keep=self.cfg.checkpoint.keep
        )
        self.event("checkpoint", path=path.name, reason=reason)
        return path.name

    def _release_workers(self) -> None:
        """Kill the workers and channels, then release the run's robots (once; called again in ``finally``)."""
        if self.released:
            return
        self.released = True
        for group in self.groups.values():
            group.kill()
        for ch in self.channels.values():
            try:
                ch.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.claimed_robots:
            try:  # after the kills: the next claimant finds the robots' resources free
                robots = release_robots(self.name, self.claimed_robots)
                self.event("robots_released", robots=robots)
            except Exception:  # noqa: BLE001 - a claim left behind is stale once this controller is gone
                traceback.print_exc()

    def env_worker_rows(self) -> list[dict[str, Any]]:
        """Per env worker: its rank, robot (placement.env.robots), Ray node, env steps and episodes."""
        where = {p["rank"]: p for p in self.placement_info if p.get("group") == "env"}
        return [
            {"rank": rank, "robot": where.get(rank, {}).get("robot"), "node_id": where.get(rank, {}).get("node_id"),
             "env_steps": self.worker_env_steps[rank], "episodes": self.worker_episodes[rank]}
            for rank in range(self.cfg.placement.env.num_workers)
        ]  # fmt: skip

    # ------------------------------------------------------------------ control API (called from the event loop)

    def set_mode(self, mode: str, kind: str) -> dict[str, Any]:
        with self.cond:
            self.mode = mode
            if mode == "run":
                self.step_allowed = False
            self.cond.notify_all()
        self.event(kind)
        return self.status()

    def request_step(self, stage: str | None) -> int:
        names = [s.name for s in self.stages]
        if stage is not None and stage not in names:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(names)}")
        with self.cond:
            if self.state in ("finished", "stopped", "failed"):
                raise RuntimeError(f"run {self.name!r} is {self.state}; it cannot step")
            self.mode = "step"
            self.step_target = stage or "__next__"
            self.step_allowed = True
            start = self.stages_done
            self.cond.notify_all()
        return start

    def wait_step_done(self, start: int, stage: str | None, timeout: float) -> dict[str, Any]:
        deadline = time.time() + timeout
        with self.cond:
            while True:
                if self.state in ("failed", "stopped", "finished"):
                    break
                if self.stages_done > start and not self.step_allowed:
                    break
                if time.time() > deadline:
                    raise TimeoutError(f"step did not finish within {timeout} s (state {self.state})")
                self.cond.wait(0.2)
            return dict(self.last_stage_summary)

    def set_hparams(self, changes: dict[str, Any]) -> dict[str, Any]:
        live = live_params(self.cfg, self.link_streams)
        resolved = {}
        for key, value in changes.items():
            path = resolve_key(self.cfg, key)
            if path not in live:
                allowed = ", ".join(sorted(live))
                raise ConfigError(path, value, f"not a live hyperparameter; live ones: {allowed}")
            resolved[path] = value
        merged = to_dict(self.cfg)
        for path, value in resolved.items():
            _set_path(merged, path, value)
        build(RunConfig, merged)  # validate now: the caller gets the error, not the loop
        with self.cond:
            self.pending_hparams.update(resolved)
            self.cond.notify_all()
        return resolved

    def set_override(self, stage: str, fn: Any, source: str | None) -> None:
        names = [s.name for s in self.stages]
        if stage not in names:
            raise ValueError(f"unknown stage {stage!r}; stages that can be overridden: {', '.join(names)}")
        if not callable(fn):
            raise TypeError(f"override for {stage!r} must be callable, got {type(fn).__name__}")
        with self.lock:
            self.overrides[stage] = (fn, source)
        self.event("override", stage=stage, fn=getattr(fn, "__name__", repr(fn)), source=source)

    def revert(self, stage: str) -> bool:
        with self.lock:
            removed = self.overrides.pop(stage, None) is not None
        if removed:
            self.event("revert", stage=stage)
        return removed

    def status(self) -> dict[str, Any]:
        with self.lock:
            last = self.metrics_rows[-1] if self.metrics_rows else {}
            return {
                "name": self.name,
                "pid": os.getpid(),
                "state": self.state,
                "mode": self.mode,
                "stage": self.current_stage,
                "stages": [s.name for s in self.stages],
                "update_step": self.update_step,
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "steps_per_s": last.get("steps_per_s"),
                "episode_return_mean": last.get("episode_return_mean"),
                "stage_times": dict(self.stage_times),
                # {task, done, total} while setup records demos, else None
                "setup": self.setup_progress if self.state == "starting" else None,
                "overrides": {k: v[1] or getattr(v[0], "__name__", "") for k, v in self.overrides.items()},
                "error": self.error,
                "failing": self.failing,  # see _await_segment: set while a failed rollout waits for a held env
                "started_at": self.started_at,
                "budget": to_dict(self.cfg.budget),
                "ended_at": self.ended_at,
                "env_workers": self.env_worker_rows(),
                "env_to_rollout": self.env_to_rollout,  # the mode in use (placement's 'auto' resolved)
                # the streams linked at launch, as retuned since (live)
                **(
                    {"links": self.cfg.placement.links.describe(self.link_streams)}
                    if self.link_streams
                    else {}
                ),
                **self.robots.status(),
            }


def group_placements(p: PlacementConfig) -> dict[str, GroupPlacement]:
    """The worker groups a run places on the cluster: env, rollout (unless colocated), actor (unless the
    learner lives in the controller)."""
    placements = {
        "env": GroupPlacement(p.env.num_workers, p.env.num_cpus, p.env.num_gpus, p.env.node_group,
                              p.env.resources, rank_resources(p.env.robots)),  # worker i also asks for robot:<robots[i]>
    }  # fmt: skip
    if p.env_to_rollout != "colocated":
        r = p.rollout
        placements["rollout"] = GroupPlacement(
            r.num_workers, r.num_cpus, r.num_gpus, r.node_group, r.resources
        )
    if p.learner != "controller":  # in the controller's process: nothing to place
        a = p.actor
        placements["actor"] = GroupPlacement(a.num_workers, a.num_cpus, a.num_gpus, a.node_group, a.resources)
    return placements


def _record_section(record: dict[str, Any], run_dir: RunDir) -> dict[str, Any] | None:
    """The ``record:`` section for the env workers, its root resolved (default: ``<run dir>/data``)."""
    if not record["enabled"]:
        return None
    return {**record, "root": str(record["root"] or run_dir.path / "data")}


def _ended_badly(ref: ray.ObjectRef) -> bool:
    """Whether a finished worker call failed: its report says so, or its actor died under it."""
    try:
        return not ray.get(ref)["ok"]
    except Exception:  # noqa: BLE001 - a lost actor, a cancelled call: all failures
        return True


def _run_alive(run: str) -> bool:
    """Whether run ``run``'s controller actor exists (a robot claim of a gone run is stale)."""
    from .cluster import NAMESPACE

    try:
        ray.get_actor(actor_name(run), namespace=NAMESPACE)
        return True
    except ValueError:
        return False


def _get_path(cfg: Any, path: str) -> Any:
    obj = cfg
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _set_path(d: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        d = d[part]
    d[parts[-1]] = value


def _touches(method: Any) -> Any:
    """Mark a control method as a use of the controller (it resets the linger clock)."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.last_call = time.time()
        return await method(self, *args, **kwargs)

    return wrapper


@ray.remote(num_cpus=0, max_concurrency=64)
class RunController:
    """The Ray actor: async control methods around :class:`RunControllerImpl`.

    Once the run has ended and nobody has called for ``linger_s`` seconds, the actor exits and
    frees its memory; the client then reads the run's history and last status from its directory.
    """

    def __init__(self, name: str, config: dict[str, Any], resume: bool = False,
                 algorithm: bytes | None = None, paused: bool = False,
                 resume_overrides: dict[str, Any] | None = None, obs_features: bytes | None = None):  # fmt: skip
        self.impl = RunControllerImpl(name, config, resume, algorithm, paused, resume_overrides, obs_features)
        self.last_call = time.time()
        self.impl.thread.start()
        threading.Thread(target=self._linger_watch, name=f"linger-{name}", daemon=True).start()

    def _linger_watch(self) -> None:
        impl = self.impl
        while True:
            time.sleep(1.0)
            if impl.ended_at is None:
                continue
            idle = time.time() - max(self.last_call, impl.ended_at)
            if idle >= impl.cfg.linger_s:
                impl._write_status_quietly()
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return

    @_touches
    async def ping(self) -> str:
        return self.impl.name

    @_touches
    async def status(self) -> dict[str, Any]:
        await self.impl.robots.refresh()
        return self.impl.status()

    async def report_setup(self, task: str, done: int, total: int) -> None:
        """Setup progress from the learner (:class:`.setup_progress.SetupReporter`); not a user's call."""
        self.impl.report_setup(task, done, total)

    @_touches
    async def health(self) -> dict[str, Any]:
        groups = self.impl.groups
        loop = asyncio.get_running_loop()
        out = {}
        for name, group in groups.items():
            out[name] = await loop.run_in_executor(None, group.health, 2.0)
        chans = {}
        for name, ch in self.impl.channels.items():
            try:
                chans[name] = await ch.metrics_async()
            except Exception as exc:  # noqa: BLE001
                chans[name] = {"error": type(exc).__name__}
        return {"groups": out, "channels": chans}

    @_touches
    async def pause(self) -> dict[str, Any]:
        return self.impl.set_mode("pause", "pause")

    @_touches
    async def resume(self) -> dict[str, Any]:
        return self.impl.set_mode("run", "resume")

    @_touches
    async def stop(self) -> dict[str, Any]:
        with self.impl.cond:
            self.impl.stop_requested = True
            self.impl.cond.notify_all()
        self.impl.event("stop_requested")
        return self.impl.status()

    @_touches
    async def step(self, stage: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
        start = self.impl.request_step(stage)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.impl.wait_step_done, start, stage, timeout)

    @_touches
    async def human(self, env: int, cmd: dict[str, Any]) -> dict[str, Any]:
        """A human's command for env ``env`` (global index over all env workers); see :mod:`rlinf_nb.envs.human`."""
        impl = self.impl
        group = impl.groups.get("env")
        if group is None:
            return {"ok": False, "error": "the run has no env workers yet"}
        per_worker = impl.cfg.env.num_envs
        rank, local = divmod(int(env), per_worker)
        if not 0 <= rank < len(group):
            return {
                "ok": False,
                "error": f"env {env} out of range: the run has {per_worker * len(group)} envs",
            }
        report = await group.actors[rank].human_command.remote(local, dict(cmd))
        if report["ok"] and cmd.get("kind") != "action":
            extra = {k: cmd[k] for k in ("mark", "arm") if k in cmd}
            impl.event("human", command=cmd["kind"], env=int(env), **extra)
        return report

    @_touches
    async def estop(self, reason: str = "run", env: int | None = None) -> dict[str, Any]:
        """Latch the e-stop of every robot env (or env ``env``); recorded as an ``estop`` event."""
        return await self.impl.robots.command("estop", env, reason)

    @_touches
    async def clear_estop(self, env: int | None = None) -> dict[str, Any]:
        """Clear the e-stop of every robot env (or env ``env``); its waiting envs reset and go on."""
        return await self.impl.robots.command("clear_estop", env)

    @_touches
    async def set_hparams(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.impl.set_hparams(changes)

    @_touches
    async def override(self, stage: str, fn: Any, source: str | None = None) -> None:
        self.impl.set_override(stage, fn, source)

    @_touches
    async def revert(self, stage: str) -> bool:
        return self.impl.revert(stage)

    @_touches
    async def checkpoint_now(self) -> str | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.impl.save_checkpoint, "manual")

    @_touches
    async def metrics_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        rows = self.impl.metrics_rows
        return rows[cursor:], len(rows)

    @_touches
    async def events_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        rows = self.impl.event_rows
        return rows[cursor:], len(rows)

    @_touches
    async def batch_summary(self) -> list[dict[str, Any]]:
        return summarize_batch(self.impl.ctx.batch)

    @_touches
    async def batch_arrays(self, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        batch = self.impl.ctx.batch
        return {k: tree.map(np.asarray, v) for k, v in batch.items() if keys is None or k in keys}

    @_touches
    async def config(self) -> dict[str, Any]:
        return to_dict(self.impl.cfg)

    @_touches
    async def live_params(self) -> dict[str, dict[str, Any]]:
        out = {}
        for path, field in live_params(self.impl.cfg, self.impl.link_streams).items():
            out[path] = {"value": _get_path(self.impl.cfg, path), "doc": field.metadata.get("doc", ""),
                         "range": field.metadata.get("range"), "choices": field.metadata.get("choices")}  # fmt: skip
        return out

    @_touches
    async def frames_channel(self) -> tuple[Channel | None, int]:
        """The ``frames`` channel (None before setup) and how many env workers feed it.

        Clients read camera frames and episodes from it themselves (``runtime/frame_reader.py``), so a
        dashboard's frame polling never runs in this process, next to the training loop.
        """
        return self.impl.channels.get("frames"), len(self.impl.groups.get("env", []) or [])

    @_touches
    async def placement(self) -> list[dict[str, Any]]:
        return self.impl.placement_info


def source_of(fn: Any) -> str | None:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


__all__ = ["RunController", "RunControllerImpl", "actor_name", "source_of", "summarize_batch"]
