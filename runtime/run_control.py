"""Step-through and live tuning: the gate before each stage, pause/step/run, hyperparameters and overrides.

:class:`RunControl` is mixed into :class:`~.controller.RunControllerImpl`. The control API runs on the
actor's event loop and the stages in the training thread; they meet under ``cond`` (the run's lock).
"""

from __future__ import annotations

import time
from typing import Any

from rlinf_nb.config import ConfigError, build, to_dict
from rlinf_nb.run_config import RunConfig, live_params, resolve_key


def get_path(cfg: Any, path: str) -> Any:
    """The value at dotted ``path`` (``algo.lr``) of a config or a nested dict."""
    obj = cfg
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set dotted ``path`` of nested dict ``d`` to ``value``."""
    parts = path.split(".")
    for part in parts[:-1]:
        d = d[part]
    d[parts[-1]] = value


class RunControl:
    """What a notebook steers while the run goes: the mode (run / pause / step), live hparams, stage overrides."""

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
        old = {k: get_path(self.cfg, k) for k in changes}
        merged = to_dict(self.cfg)
        for key, value in changes.items():
            set_path(merged, key, value)
        self.cfg = build(RunConfig, merged)
        for name in self.link_streams:  # a retuned link of a channel: its actor applies it from now on
            if name in self.channels and any(k.startswith(f"placement.links.{name}.") for k in changes):
                self.channels[name].set_link(self.cfg.placement.links.stream_link(name))
        self.event("hparams", changes={k: {"old": old[k], "new": v} for k, v in changes.items()})

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
            set_path(merged, path, value)
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
