"""The RunController's loop: one detached named actor per run (:mod:`.controller_actor`) runs it.

Training runs in a thread of the actor; the control API (``pause``, ``step``,
``set_hparams``, ``metrics_since``, ...) runs on the actor's event loop, so control
calls stay fast while a stage is busy. The loop is the algorithm's list of named
stages; before each stage the *gate* applies pending hyperparameter changes and
honours pause / step / stop. Everything that matters is written to the run
directory, from which a crashed controller is rebuilt (``resume=True``).

:class:`RunControllerImpl` holds the run's state, its setup, the loop, checkpoints and status; its
other jobs are mixins in their own modules: collecting rollouts (:mod:`.collection`), recovering from
lost workers (:mod:`.recovery`), step-through and live tuning (:mod:`.run_control`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import traceback
from typing import Any

import cloudpickle
import numpy as np
import ray

from rlinf_nb.algorithms.init_from import newest_checkpoint_of_run
from rlinf_nb.algorithms.registry import Algorithm, Stage, get_algorithm, install_algorithm
from rlinf_nb.config import build, deep_merge, to_dict
from rlinf_nb.run_config import PlacementConfig, RunConfig, live_params

from .channel import MAX_WAITERS, Channel
from .collection import Collection
from .recovery import RECOVERABLE, WorkerRecovery
from .robot_claims import claim_robots, rank_resources, release_robots
from .robot_control import RobotFleet
from .run_control import RunControl, get_path
from .rundir import RunDir, dedupe_steps
from .setup_progress import SetupReporter
from .stage_context import StageContext
from .trace import SpanLog, chrome_trace
from .worker import (
    GroupPlacement,
    LocalWorkerGroup,
    WorkerGroup,
    check_placement,
    node_totals,
    route_env_to_rollout,
)
from .workers import EnvWorker, LearnerWorker, RolloutWorker

ACTOR_PREFIX = "run:"


def actor_name(run_name: str) -> str:
    return f"{ACTOR_PREFIX}{run_name}"


class RunControllerImpl(Collection, WorkerRecovery, RunControl):
    """The loop and its state; wrapped as a Ray actor by :data:`.controller_actor.RunController`."""

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
        # the last segment's seconds stepping envs and asking the policy (mean over env workers): time/rollout_*
        self.rollout_times: dict[str, float] = {}
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
        self.final_trace: dict[str, Any] | None = None  # the timeline kept when the workers were released
        self.spans = SpanLog()  # the stages (and setup) as run, for the run's timeline (``run.trace()``)
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

    # ------------------------------------------------------------------ stage context services (rollouts: .collection)

    def learner_update(self, keys: list[str]) -> dict[str, Any]:
        batch = {k: self.ctx.batch[k] for k in keys + ["versions"] if k in self.ctx.batch}
        out = self.groups["actor"].call("update", batch, self.cfg.algo, self.ctx.progress).get()[0]
        self._check_learner_version(out.get("policy_version"), self.update_step + 1, "update")
        with self.lock:
            self.update_step += 1
        return out

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

    def _run_stage(self, stage: Stage) -> dict[str, Any]:
        fn = self.overrides.get(stage.name, (stage.fn,))[0]
        t0 = time.perf_counter()
        with self.spans.span(stage.name, iteration=self.update_step, overridden=stage.name in self.overrides):
            summary = fn(self.ctx) or {}
        self.stage_times[stage.name] = time.perf_counter() - t0
        return summary

    def trace_processes(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """``[(label, spans)]`` for :func:`.trace.chrome_trace`: this controller's stages, then every worker's
        calls (``env 0``, ``rollout 0``, ``actor 0``; a learner in this process is ``actor 0 (in controller)``)."""
        processes = [(f"controller {self.name}", self.spans.since())]
        for name, group in list(self.groups.items()):
            local = isinstance(group, LocalWorkerGroup)
            for rank, spans in enumerate(group.trace_spans()):
                label = f"{name} {rank}" + (" (in controller)" if local else "")
                processes.append((label if spans is not None else f"{label} (not answering)", spans or []))
        return processes

    def _main(self) -> None:
        try:
            with self.spans.span("setup"):
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
        row.update(self.rollout_times)
        for key in live_params(self.cfg, self.link_streams):
            row[f"hp/{key}"] = get_path(self.cfg, key)
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
        if reason != "end":  # the end's timeline is written as the workers are released, right after
            self._write_trace()
        return path.name

    def _release_workers(self) -> None:
        """Kill the workers and channels, then release the run's robots (once; called again in ``finally``)."""
        if self.released:
            return
        self.released = True
        self.final_trace = self._write_trace()
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

    def _write_trace(self) -> dict[str, Any] | None:
        """Gather the timeline and write it (atomically) to the run directory: after each checkpoint, so a
        killed controller leaves a recent one, and at the end, while the workers still hold their spans."""
        try:
            trace = chrome_trace(self.trace_processes())
            if self.run_dir.path.exists():
                self.run_dir.write_trace(trace)
            return trace
        except Exception:  # noqa: BLE001 - a timeline is a convenience: it never fails a run
            traceback.print_exc()
            return None

    def env_worker_rows(self) -> list[dict[str, Any]]:
        """Per env worker: its rank, robot (placement.env.robots), Ray node, env steps and episodes."""
        where = {p["rank"]: p for p in self.placement_info if p.get("group") == "env"}
        return [
            {"rank": rank, "robot": where.get(rank, {}).get("robot"), "node_id": where.get(rank, {}).get("node_id"),
             "env_steps": self.worker_env_steps[rank], "episodes": self.worker_episodes[rank]}
            for rank in range(self.cfg.placement.env.num_workers)
        ]  # fmt: skip

    # ------------------------------------------------------------------ status (the control API: .run_control)

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


def _run_alive(run: str) -> bool:
    """Whether run ``run``'s controller actor exists (a robot claim of a gone run is stale)."""
    from .cluster import NAMESPACE

    try:
        ray.get_actor(actor_name(run), namespace=NAMESPACE)
        return True
    except ValueError:
        return False


__all__ = ["RunControllerImpl", "actor_name", "group_placements"]
