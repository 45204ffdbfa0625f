"""The run's Ray actor: async control methods around :class:`~.controller.RunControllerImpl`.

Control calls run on the actor's event loop, beside the training thread, so they answer while a stage
is busy; ``linger_s`` after the run ended and its last call, the actor exits.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from typing import Any

import numpy as np
import ray

from rlinf_nb import tree
from rlinf_nb.config import to_dict
from rlinf_nb.run_config import live_params

from .channel import Channel
from .controller import RunControllerImpl
from .run_control import get_path
from .stage_context import summarize_batch
from .trace import chrome_trace


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
            out[path] = {"value": get_path(self.impl.cfg, path), "doc": field.metadata.get("doc", ""),
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

    @_touches
    async def trace(self) -> dict[str, Any]:
        """The run's timeline in the Trace Event Format (see :mod:`.trace`): stages, then every worker's calls."""
        if self.impl.final_trace is not None:  # the run ended: its workers (and their spans) are gone
            return self.impl.final_trace
        loop = asyncio.get_running_loop()
        return chrome_trace(await loop.run_in_executor(None, self.impl.trace_processes))


def source_of(fn: Any) -> str | None:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


__all__ = ["RunController", "source_of"]
