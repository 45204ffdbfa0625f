"""The client API: ``launch``, ``get_run``, ``list_runs`` and the :class:`Run` handle.

A :class:`Run` is a thin handle: every call goes to the run's controller actor on
the cluster (or, for a run whose controller is gone, to its directory). Nothing
heavy happens in the kernel; restarting it never touches a run.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rlinf_nb import recipes
from rlinf_nb.config import ConfigError, build, deep_merge, nest_dotted, to_dict
from rlinf_nb.connection import ensure_attached
from rlinf_nb.run_config import ALIASES, RunConfig
from rlinf_nb.runtime import cluster
from rlinf_nb.runtime.controller import actor_name
from rlinf_nb.runtime.controller_actor import RunController, source_of
from rlinf_nb.runtime.rundir import RunDir, dedupe_steps
from rlinf_nb.runtime.setup_progress import setup_text

FINAL_STATES = ("finished", "stopped", "failed", "lost")


def resolve_config(config_or_recipe: str | Mapping[str, Any] | RunConfig, **overrides: Any) -> RunConfig:
    """A validated :class:`RunConfig` from a recipe name, dict or config, plus overrides.

    Overrides use dotted or double-underscore paths (``algo__lr=3e-4``) or the short
    aliases ``num_envs``, ``env_workers``, ``env_id``.
    """
    if isinstance(config_or_recipe, str):
        base = recipes.load(config_or_recipe)
    elif isinstance(config_or_recipe, RunConfig):
        base = to_dict(config_or_recipe)
    elif isinstance(config_or_recipe, Mapping):
        base = dict(config_or_recipe)
    else:
        raise TypeError(
            f"launch() takes a recipe name, a dict or a RunConfig, not {type(config_or_recipe).__name__}"
        )
    # Start from the defaults as a dict, so a partial section (placement.actor.node_group only) keeps
    # the section's own defaults (the actor's num_cpus) rather than the generic field defaults.
    defaults = {k: v for k, v in to_dict(RunConfig()).items() if k != "algo"}
    merged = deep_merge(deep_merge(defaults, base), nested_overrides(overrides))
    return build(RunConfig, merged)


def nested_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``launch``'s keyword overrides (``algo__lr``, ``budget.total_env_steps``, aliases) as a nested dict."""
    return nest_dotted({ALIASES.get(k, k): v for k, v in overrides.items()})


def _default_name(cfg: RunConfig) -> str:
    env = cfg.env.id.split(":")[-1].split("-")[0].lower()
    env = re.sub(r"[^a-z0-9_.]+", "_", env).strip("_.") or "env"  # robot:mock_arm/reach -> mock_arm_reach
    return f"{cfg.algorithm}_{env}_{_dt.datetime.now().strftime('%Y%m%d_%H%M%S')}"


def launch(config_or_recipe: str | Mapping[str, Any] | RunConfig, name: str | None = None,
           resume: bool = False, paused: bool = False, **overrides: Any) -> Run:  # fmt: skip
    """Start a run on the cluster (attaching first if needed) and return its handle.

    Args:
        config_or_recipe: a packaged recipe name (``rl.recipes.names()``), a dict or a RunConfig.
        name: the run's name (its directory under ``runs/``); default: algorithm_env_timestamp.
        resume: continue the existing run ``name`` from its newest complete checkpoint; ``overrides``
            apply on top of the config saved with it (``budget__total_env_steps=...`` extends a run).
        paused: set the run up, then wait before its first stage (``run.step()`` from the very first
            rollout, or ``run.resume()``).
        **overrides: config values, e.g. ``num_envs=16``, ``seed=1``, ``algo__lr=3e-4``.

    Raises:
        ConfigError: a bad key or value (names the key path, the value, what is allowed).
        ValueError: ``name`` exists and ``resume`` is false, or it is still running.
    """
    import ray

    ensure_attached()
    run_dir = RunDir(name) if name else None
    if resume:
        if run_dir is None or not run_dir.exists:
            raise ValueError(f"resume=True needs the name of an existing run; {name!r} has no run directory")
        saved = run_dir.read_config()
        cfg = resolve_config(saved, **overrides)
    else:
        cfg = resolve_config(config_or_recipe, **overrides)
        check_at_launch = getattr(cfg.algo, "check_at_launch", None)  # e.g. algo.init_from has a checkpoint
        if check_at_launch is not None:
            check_at_launch()
        name = name or _default_name(cfg)
        if RunDir(name).exists:
            raise ValueError(f"a run named {name!r} already exists; pick another name or pass resume=True")
    _check_name(name)
    existing = _find_actor(name)
    if existing is not None:
        status = ray.get(existing.status.remote(), timeout=30)
        if status["state"] not in FINAL_STATES:
            raise ValueError(
                f"run {name!r} is still {status['state']}; stop it first (rl.get_run({name!r}).stop())"
            )
        ray.kill(existing)
        _wait_gone(name)
    algorithm = _shippable_algorithm(cfg.algorithm)
    obs_features = _shippable_obs_features(cfg)
    RunController.options(name=actor_name(name), namespace=cluster.NAMESPACE, lifetime="detached",
                          max_restarts=0).remote(name, to_dict(cfg), resume, algorithm, paused,
                                                 nested_overrides(overrides) if resume else None,
                                                 obs_features)  # fmt: skip
    run = Run(name)
    run._wait_started()
    return run


def _shippable_algorithm(name: str) -> bytes:
    """The registered algorithm ``name``, cloudpickled: the controller installs this copy, so an
    algorithm defined in a notebook cell (pickled by value) runs on the cluster. Bytes, not the object:
    the controller unpickles it (importing the algorithm's modules, torch) once its env workers start."""
    from rlinf_nb.algorithms.registry import get_algorithm
    from rlinf_nb.shipping import ship

    return ship(get_algorithm(name), f"algorithm {name!r}", "its config class, stages or learner")


def _shippable_obs_features(cfg: RunConfig) -> bytes | None:
    """The feature set ``env.kwargs.obs_features`` names, cloudpickled for the run's workers (see
    :mod:`rlinf_nb.envs.obs_features`): one registered in a notebook cell works on the cluster."""
    name = cfg.env.kwargs.get("obs_features")
    if name is None:
        return None
    from rlinf_nb.envs.obs_features import obs_feature_names, shippable_obs_features

    if name not in obs_feature_names():
        raise ConfigError(
            "env.kwargs.obs_features", name,
            f"allowed values: {', '.join(obs_feature_names())} (or one registered in this process with "
            "rlinf_nb.envs.obs_features.register_obs_features)",
        )  # fmt: skip
    return shippable_obs_features(name)


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith(".") or len(name) > 120:
        raise ConfigError("name", name, "run names are non-empty, have no '/', do not start with '.'")


def _find_actor(name: str) -> Any | None:
    import ray

    try:
        return ray.get_actor(actor_name(name), namespace=cluster.NAMESPACE)
    except ValueError:
        return None


def _wait_gone(name: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while _find_actor(name) is not None and time.time() < deadline:
        time.sleep(0.2)


def get_run(name: str) -> Run:
    """Re-attach to run ``name`` (live or finished) with its full history."""
    ensure_attached()
    run = Run(name)
    if run._actor() is None and not run.run_dir.exists:
        known = ", ".join(r["name"] for r in list_runs()) or "(none)"
        raise ValueError(f"no run named {name!r}; runs: {known}")
    return run


def list_runs() -> list[dict[str, Any]]:
    """Every run directory, with whether its controller is alive."""
    from rlinf_nb import paths

    ensure_attached()
    out = []
    for path in sorted(paths.runs_dir().iterdir()):
        if (path / "config.yaml").exists():
            out.append({"name": path.name, "live": _find_actor(path.name) is not None, "path": str(path)})
    return out


class BatchView:
    """The batch of the stage that ran last: a summary table and the arrays on demand."""

    def __init__(self, run: Run):
        self._run = run
        self.rows: list[dict[str, Any]] = run._call("batch_summary")

    def summary(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def keys(self) -> list[str]:
        return [r["key"] for r in self.rows]

    def to_local(self, keys: list[str] | None = None) -> dict[str, Any]:
        """Copy the arrays (all, or ``keys``) into this process."""
        return self._run._call("batch_arrays", keys)

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()

    def __repr__(self) -> str:
        return repr(self.summary())


class Run:
    """A handle to one run: control, metrics, events."""

    def __init__(self, name: str):
        self.name = name
        self.run_dir = RunDir(name)
        self._handle = None
        self._frames: Any = None  # a FrameReader on the run's frames channel (see latest_frames)

    def __repr__(self) -> str:
        try:
            st = self.status()
            return f"<Run {self.name!r} {st['state']} step={st['update_step']} env_steps={st['env_steps']}>"
        except Exception:  # noqa: BLE001 - repr must not raise
            return f"<Run {self.name!r}>"

    @property
    def path(self) -> Path:
        """The run directory (``RLINF_NB_HOME/runs/<name>``): config, logs, checkpoints, ``data/``."""
        return self.run_dir.path

    def recording(self, out: str | Path | None = None) -> Path:
        """Merge what the run recorded (``record:``, one root per env worker under ``data/``) into
        one LeRobot dataset at ``out`` (default ``<run dir>/dataset``, replaced if it exists)."""
        import shutil

        from rlinf_nb.data import merge

        target = Path(out) if out is not None else self.path / "dataset"
        if out is None and target.exists():
            shutil.rmtree(target)
        return merge(self.path / "data", target)

    # ------------------------------------------------------------------ plumbing

    def _actor(self) -> Any | None:
        if self._handle is None:
            self._handle = _find_actor(self.name)
        return self._handle

    def _call(self, method: str, *args: Any, timeout: float = 60.0, **kwargs: Any) -> Any:
        import ray

        actor = self._actor()
        if actor is None:
            raise RuntimeError(
                f"run {self.name!r} has no live controller (it was stopped, or the cluster restarted); its history "
                f"is still readable with metrics()/events(), and rl.launch(name={self.name!r}, resume=True) continues it"
            )
        try:
            return ray.get(getattr(actor, method).remote(*args, **kwargs), timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            raise cause from None
        except ray.exceptions.RayActorError:
            self._handle = None
            raise

    @property
    def live(self) -> bool:
        return self._actor() is not None

    def _wait_started(self, timeout: float = 600) -> None:
        """Wait until setup is over. Setup work that reports progress (recording demos) shows a tqdm bar,
        and each report it makes restarts the ``timeout``: a long recording is not a hung start."""
        from tqdm.auto import tqdm

        deadline = time.time() + timeout
        bar, last = None, None
        try:
            while time.time() < deadline:
                st = self.status()
                if st["state"] != "starting":
                    if st["state"] == "failed":
                        raise RuntimeError(f"run {self.name!r} failed to start:\n{st['error']}")
                    if bar is not None:  # its last report may have come after the last poll
                        bar.update(bar.total - bar.n)
                    return
                setup = st.get("setup")
                if setup and setup != last:
                    if bar is None or setup["task"] != last["task"]:
                        if bar is not None:
                            bar.close()
                        bar = tqdm(total=setup["total"], desc=f"{self.name}: {setup['task']}", unit="episode")
                    bar.update(setup["done"] - bar.n)
                    last, deadline = setup, time.time() + timeout
                time.sleep(0.2)
            raise TimeoutError(f"run {self.name!r} did not start within {timeout} s")
        finally:
            if bar is not None:
                bar.close()

    # ------------------------------------------------------------------ control

    def status(self) -> dict[str, Any]:
        """The controller's status; once it is gone, the last one it wrote to the run directory.

        A run whose controller vanished without ending (killed, or the cluster went down) reads
        as state ``"lost"``: ``rl.launch(name=..., resume=True)`` continues it.
        """
        return self._live_or_disk("status", self._status_from_disk)

    def _live_or_disk(self, method: str, from_disk: Callable[..., Any], *args: Any) -> Any:
        """Ask the controller; when it is gone (or goes while asked), read the run directory."""
        import ray

        if self._actor() is not None:
            try:
                return self._call(method, *args)
            except ray.exceptions.RayActorError:
                pass  # it went while asked
        return from_disk(*args)

    def _status_from_disk(self) -> dict[str, Any]:
        saved = self.run_dir.read_status()
        if saved is None:
            raise RuntimeError(f"run {self.name!r} has no live controller and no recorded status")
        if saved.get("state") not in FINAL_STATES:
            saved = dict(saved, state="lost", error=saved.get("error") or
                         "the controller is gone without having ended the run; resume=True continues it")  # fmt: skip
        saved["live"] = False
        return saved

    def health(self) -> dict[str, Any]:
        return self._call("health")

    def pause(self) -> dict[str, Any]:
        return self._call("pause")

    def resume(self) -> dict[str, Any]:
        return self._call("resume")

    def stop(self, wait: bool = True, timeout: float = 300) -> dict[str, Any]:
        """Stop the run at the next stage boundary (a run that already ended: its status)."""
        if not self.live:
            return self.status()
        status = self._call("stop")
        if wait:
            deadline = time.time() + timeout
            while status["state"] not in FINAL_STATES and time.time() < deadline:
                time.sleep(0.2)
                status = self.status()
        return status

    def step(self, stage: str | None = None, timeout: float = 600) -> dict[str, Any]:
        """Run the next stage (or up to and including ``stage``) and stay paused; returns its summary."""
        return self._call("step", stage, timeout, timeout=timeout + 30)

    def set_hparams(self, **changes: Any) -> dict[str, Any]:
        """Change live hyperparameters (``lr=3e-4``); applied at the next stage boundary."""
        return self._call("set_hparams", changes)

    def override(self, stage: str, fn: Callable[[Any], dict[str, Any] | None]) -> None:
        """Replace stage ``stage`` with ``fn(ctx)`` (a function defined in a cell is fine)."""
        self._call("override", stage, fn, source_of(fn))

    def revert(self, stage: str) -> bool:
        return self._call("revert", stage)

    # -- human in the loop (robot envs made with a ``human`` kwarg) ---------------------------
    def take_over(self, env: int = 0, arm: str | None = None) -> None:
        """A human takes over env ``env``: until :meth:`hand_back` it applies :meth:`human_action`'s action.

        ``arm`` (a path such as ``"left/arm"``, multi-arm robots): only that arm; the policy keeps the others.
        """
        self._human(env, {"kind": "take_over", **({"arm": arm} if arm is not None else {})})

    def human_action(self, action: Any, env: int = 0, arm: str | None = None) -> None:
        """The human's action for env ``env`` (held until the next one; ee_delta envs: x, y, z in [-1, 1]).

        With ``arm``, ``action`` is that arm's slice only (and takes that arm over)."""
        cmd = {"kind": "action", "action": [float(x) for x in action]}
        self._human(env, {**cmd, **({"arm": arm} if arm is not None else {})})

    def hand_back(self, env: int = 0, arm: str | None = None) -> None:
        """Give env ``env`` (or only its ``arm``) back to the policy (blended over the env's ``blend_steps``)."""
        self._human(env, {"kind": "hand_back", **({"arm": arm} if arm is not None else {})})

    def mark(self, outcome: str, env: int = 0) -> None:
        """End env ``env``'s episode as a ``"success"`` or ``"failure"`` (the human's verdict)."""
        self._human(env, {"kind": "mark", "mark": outcome})

    # -- e-stop (robot envs) ------------------------------------------------------------------
    def estop(self, reason: str = "dashboard", env: int | None = None) -> dict[str, Any]:
        """Latch the e-stop of every robot env of the run (or of env ``env``).

        The robot layer holds each arm at once: from the next control step on, every command
        is replaced by "hold here" until :meth:`clear_estop`. The e-stopped env's episode ends
        and its env worker waits (its rollout pauses, with the other envs of that worker) until
        the e-stop is cleared. Recorded as an ``estop`` event; ``status()["estopped"]`` lists the
        e-stopped envs. Returns ``{"estopped": [...], "robot_envs": [...]}`` (each env's state
        just after engaging: ``ee``, ``episode_step``, ``mode``, ...).

        Raises:
            ValueError: the run's envs are not robot envs, or ``env`` is out of range.
        """
        return self._robot("estop", env, reason=str(reason))

    def clear_estop(self, env: int | None = None) -> dict[str, Any]:
        """Clear the e-stop of every robot env (or env ``env``): waiting envs reset and the rollout goes on."""
        return self._robot("clear_estop", env)

    def _robot(self, method: str, env: int | None, **kwargs: Any) -> dict[str, Any]:
        env = None if env is None else int(env)
        report = self._call(method, env=env, **kwargs)
        if not report["ok"]:
            where = "every env" if env is None else f"env {env}"
            raise ValueError(f"run {self.name!r}: {method} on {where}: {report['error']}")
        return {k: v for k, v in report.items() if k != "ok"}

    def _human(self, env: int, cmd: dict[str, Any]) -> None:
        report = self._call("human", env, cmd)
        if not report["ok"]:
            where = f"env {env}" + (f" arm {cmd['arm']!r}" if "arm" in cmd else "")
            raise ValueError(f"run {self.name!r}: {cmd['kind']} on {where}: {report['error']}")

    def checkpoint(self) -> str | None:
        return self._call("checkpoint_now", timeout=300)

    def trace_events(self) -> dict[str, Any]:
        """The run's timeline in the Trace Event Format: one row per process (the controller's stages, then
        each env, rollout and learner worker's calls), one box per span.

        A live run's is read from its workers (their newest 20,000 calls each). Without a live controller it
        is the one the controller last wrote into the run directory (after each checkpoint, and at the end).
        """
        import ray

        if self._actor() is not None:
            try:
                return self._call("trace", timeout=120)
            except ray.exceptions.RayActorError:  # the controller exited (linger_s) since it was looked up
                pass
        trace = self.run_dir.read_trace()
        if trace is None:
            raise RuntimeError(
                f"run {self.name!r} has no live controller and no timeline on disk ({self.run_dir.trace_path}): "
                "its controller writes one after each checkpoint and at the end, and this one died before either"
            )
        return trace

    def trace(self, path: str | Path | None = None) -> Path:
        """Write :meth:`trace_events` to ``path`` (default ``<run dir>/trace.json``) and return the path:
        open it in https://ui.perfetto.dev or ``chrome://tracing``."""
        from rlinf_nb.runtime.rundir import atomic_write_json

        target = Path(path) if path is not None else self.run_dir.trace_path
        trace = self.trace_events()
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(target, trace)
        return target

    def batch(self) -> BatchView:
        return BatchView(self)

    def latest_frames(self, since: dict[int, int] | None = None) -> dict[int, Any]:
        """Each env worker's newest frames (needs ``env.render_every``): ``{rank: {"cameras": {name: HxWx3
        uint8}, "frame": the first camera's, "env_steps": ..., "time": ...}}``. ``since`` (``{rank:
        env_steps}`` already shown) leaves out the ranks with nothing newer. Read from the run's frames
        channel directly (the controller only hands out the channel)."""
        return self._read_frames("frames", since, {})

    def latest_episode(self, since: str | None = None) -> dict[str, Any] | None:
        """The newest finished episode's sampled frames (env 0 of an env worker, every ``env.render_every``
        env steps, downscaled): ``{"id", "rank", "cameras": {name: [T, h, w, 3] uint8}, "env_steps": [...],
        "episode_return", "episode_length", ...}``; None when there is none yet or its ``id`` is ``since``."""
        return self._read_frames("episode", since, None)

    def _read_frames(self, what: str, since: Any, empty: Any) -> Any:
        import ray

        from rlinf_nb.runtime.frame_reader import FrameReader

        for attempt in range(2):
            if self._frames is None:
                channel, workers = self._call("frames_channel")
                if channel is None:  # the run is still setting up
                    return empty
                self._frames = FrameReader(channel, workers)
            try:
                return getattr(self._frames, what)(since)
            except ray.exceptions.RayActorError:  # a new controller (resumed run): a new channel
                self._frames = None
                if attempt:
                    raise
        return empty

    @property
    def hparams(self) -> dict[str, dict[str, Any]]:
        return self._call("live_params")

    def config(self) -> dict[str, Any]:
        return self._live_or_disk("config", self.run_dir.read_config)

    # ------------------------------------------------------------------ history

    def metrics_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        return self._live_or_disk("metrics_since", self._metrics_from_disk, cursor)

    def _metrics_from_disk(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        rows = dedupe_steps(self.run_dir.metrics.read())
        return rows[cursor:], len(rows)

    def events_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        return self._live_or_disk("events_since", self._events_from_disk, cursor)

    def _events_from_disk(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        rows = self.run_dir.events.read()
        return rows[cursor:], len(rows)

    def metrics(self) -> pd.DataFrame:
        """One row per update: ``step``, ``env_steps``, ``wall_time``, ``episode_return_mean``, losses, ..."""
        return pd.DataFrame(self.metrics_since(0)[0])

    def events(self) -> pd.DataFrame:
        return pd.DataFrame(self.events_since(0)[0])

    def wait(self, until: Mapping[str, float] | Callable[[dict], bool] | str = "done", timeout: float | None = None,
             progress: bool = True, poll: float = 0.5) -> dict[str, Any]:  # fmt: skip
        """Block until the run ends (``"done"``), a metric reaches a value (``{"episode_return_mean": 475}``)
        or ``until(last_metrics_row)`` is true. Shows a tqdm bar over env steps."""
        from tqdm.auto import tqdm

        status = self.status()
        total = status["budget"]["total_env_steps"]
        bar = tqdm(total=total, desc=self.name, unit="step", disable=not progress, leave=True)
        deadline = None if timeout is None else time.time() + timeout
        cursor, last = 0, {}
        try:
            while True:
                rows, cursor = self.metrics_since(cursor)
                if rows:
                    last = rows[-1]
                status = self.status()
                bar.n = min(total, status["env_steps"])
                ret = status.get("episode_return_mean")
                setup = setup_text(status)  # recording demos before the first iteration
                bar.set_postfix(state=setup or status["state"], ret=f"{ret:.1f}" if ret is not None else "-")
                bar.refresh()
                if _reached(until, last, status):
                    return status
                if status["state"] in FINAL_STATES:
                    if until != "done" and status["state"] != "failed":
                        return status
                    if status["state"] == "failed":
                        raise RuntimeError(f"run {self.name!r} failed:\n{status['error']}")
                    return status
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(
                        f"run {self.name!r}: condition {until!r} not reached within {timeout} s"
                    )
                time.sleep(poll)
        finally:
            bar.close()

    def dashboard(self, **kwargs: Any) -> Any:
        from rlinf_nb.widgets import dashboard

        return dashboard(self, **kwargs)


def _reached(until: Any, last: dict[str, Any], status: dict[str, Any]) -> bool:
    if until == "done":
        return status["state"] in FINAL_STATES
    if callable(until):
        return bool(last) and bool(until(last))
    if isinstance(until, Mapping):
        return bool(last) and all(last.get(k) is not None and last[k] >= v for k, v in until.items())
    raise ValueError(f"wait(until=...) takes 'done', a {{metric: value}} dict or a callable, not {until!r}")
