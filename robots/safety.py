"""Safety on every arm: limits, rate limits, a watchdog and a latched e-stop.

Every arm a :class:`~rlinf_nb.robots.robot.Robot` hands out is a :class:`SafeArm`
around the driver's arm. ``send(q)`` applies, in order:

1. **e-stop** (latched): while engaged, the only command that goes out is "hold here";
2. **joint limits**: clip to the intersection of the driver's and the config's limits;
3. **max change per step**: ``|q - q_now| <= max_delta`` per joint;
4. **velocity limit**: ``|q - q_now| <= max_velocity * dt`` (``dt`` since the last command);
5. **EE workspace box**: if the target's end effector leaves the box, go only as far
   along the step as stays inside (or, from outside, as does not go further out);

and returns what was actually sent (``last_report`` says which rules clipped).
``poll()`` runs the **watchdog**: no command for ``watchdog_ms`` → hold the present
position (a real-clock robot polls from a background thread; simulated ones on every tick).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from rlinf_nb.robots.clock import Clock, RealClock
from rlinf_nb.robots.components import Arm, Feature
from rlinf_nb.robots.errors import EStopLatchedError, SpecError
from rlinf_nb.robots.kinematics import box_violation

logger = logging.getLogger(__name__)


@dataclass
class SafetyConfig:
    """Per-arm safety limits (spec key ``safety:`` of an arm), in the arm's joint unit."""

    joint_limits: list[list[float]] | None = None
    """``[[low, high], ...]`` per joint; intersected with the driver's hard limits. None: driver's only."""
    workspace_low: list[float] | None = None
    """``[x, y, z]`` lower corner (m) of the box the end effector must stay in (needs kinematics)."""
    workspace_high: list[float] | None = None
    """``[x, y, z]`` upper corner (m) of the workspace box."""
    max_delta: float | list[float] | None = None
    """Largest change of each joint target per command (joint unit), scalar or per joint. None: off."""
    max_velocity: float | list[float] | None = None
    """Largest joint speed (joint unit per second), scalar or per joint. None: off."""
    watchdog_ms: float | None = 500.0
    """No command for this long → hold the present position. None: off."""
    watchdog_thread: bool = True
    """Run the watchdog in a background thread (real-clock robots only; simulated ones poll per tick)."""
    first_command_dt: float = 0.05
    """Seconds assumed before the first command (and after a hold) for the velocity limit."""

    def __post_init__(self) -> None:
        if (self.workspace_low is None) != (self.workspace_high is None):
            raise SpecError(
                "safety: give both workspace_low and workspace_high (or neither), got "
                f"workspace_low={self.workspace_low}, workspace_high={self.workspace_high}"
            )
        if self.workspace_low is not None:
            low, high = np.asarray(self.workspace_low, float), np.asarray(self.workspace_high, float)
            if low.shape != (3,) or high.shape != (3,):
                raise SpecError(
                    f"safety.workspace_low/high: expected [x, y, z] each, got {self.workspace_low}, "
                    f"{self.workspace_high}"
                )
            if np.any(low >= high):
                raise SpecError(
                    f"safety.workspace_low must be below workspace_high on every axis, got "
                    f"{self.workspace_low} vs {self.workspace_high}"
                )
        for name in ("max_delta", "max_velocity"):
            value = getattr(self, name)
            if value is not None and np.any(np.asarray(value, float) <= 0):
                raise SpecError(f"safety.{name} must be > 0 (or null to switch it off), got {value}")
        if self.watchdog_ms is not None and self.watchdog_ms <= 0:
            raise SpecError(
                f"safety.watchdog_ms must be > 0 (or null to switch it off), got {self.watchdog_ms}"
            )
        if self.first_command_dt <= 0:
            raise SpecError(f"safety.first_command_dt must be > 0, got {self.first_command_dt}")


@dataclass
class SafetyReport:
    """What happened to the last command."""

    requested: np.ndarray
    """The target the caller asked for."""
    sent: np.ndarray
    """The target that went to the driver."""
    clipped: tuple[str, ...] = ()
    """Rules that changed it: ``joint_limits``, ``max_delta``, ``max_velocity``, ``workspace``, ``estop``."""
    time: float = 0.0
    """Clock time of the command."""


class EStop:
    """A latched emergency stop shared by the arms of one robot. Cleared only by ``clear()``."""

    def __init__(self) -> None:
        self.engaged = False
        self.reason = ""
        self.count = 0

    def engage(self, reason: str = "code") -> None:
        if not self.engaged:
            self.count += 1
            logger.warning("e-stop engaged (%s)", reason)
        self.engaged = True
        self.reason = reason

    def clear(self) -> None:
        self.engaged = False
        self.reason = ""


@dataclass
class _State:
    last_time: float | None = None  # time of the last forwarded command; None: next one is "first"
    armed: bool = False  # watchdog armed (a command is in flight)
    watchdog_trips: int = 0


def _per_joint(value: Any, n: int, name: str) -> np.ndarray | None:
    if value is None:
        return None
    arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)) if np.ndim(value) == 0 else None
    if arr is None:
        arr = np.asarray(value, dtype=np.float64)
        if arr.shape != (n,):
            raise SpecError(f"safety.{name}: expected a scalar or {n} values (one per joint), got {value}")
    return np.array(arr)


class SafeArm(Arm):
    """The safety layer around a driver's arm; see the module docstring for the rules."""

    _handles_estop = True

    def __init__(
        self,
        inner: Arm,
        config: SafetyConfig | None = None,
        clock: Clock | None = None,
        estop: EStop | None = None,
    ):
        super().__init__(config or SafetyConfig(), None)
        self.inner = inner
        self.clock = clock or RealClock()
        self.estop_latch: EStop = estop or EStop()
        self.driver_name = inner.driver_name
        self.joint_unit = inner.joint_unit
        self.last_report: SafetyReport | None = None
        self._state = _State()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop_thread = threading.Event()
        cfg: SafetyConfig = self.config
        n = len(inner.joint_names)
        hard = np.asarray(inner.joint_limits, dtype=np.float64)
        limits = hard.copy()
        if cfg.joint_limits is not None:
            user = np.asarray(cfg.joint_limits, dtype=np.float64)
            if user.shape != (n, 2) or np.any(user[:, 0] >= user[:, 1]):
                raise SpecError(
                    f"safety.joint_limits: expected {n} pairs [low, high] with low < high "
                    f"(joints {list(inner.joint_names)}), got {cfg.joint_limits}"
                )
            limits[:, 0] = np.maximum(hard[:, 0], user[:, 0])
            limits[:, 1] = np.minimum(hard[:, 1], user[:, 1])
        self._limits = limits
        self._max_delta = _per_joint(cfg.max_delta, n, "max_delta")
        self._max_velocity = _per_joint(cfg.max_velocity, n, "max_velocity")
        self._box = None
        if cfg.workspace_low is not None:
            if not inner.has_kinematics:
                raise SpecError(
                    f"safety.workspace_low/high: the {inner.driver_name!r} arm has no forward kinematics, "
                    "so an end-effector box cannot be enforced; remove them and use safety.joint_limits"
                )
            self._box = (np.asarray(cfg.workspace_low, float), np.asarray(cfg.workspace_high, float))

    # -- delegation -------------------------------------------------------------------------
    @property
    def joint_names(self) -> tuple[str, ...]:
        return self.inner.joint_names

    @property
    def joint_limits(self) -> np.ndarray:
        return self._limits.copy()

    @property
    def workspace(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self._box is None else (self._box[0].copy(), self._box[1].copy())

    @property
    def max_delta(self) -> np.ndarray | None:
        """Per-joint cap on the change per command (None: off)."""
        return None if self._max_delta is None else self._max_delta.copy()

    @property
    def has_kinematics(self) -> bool:
        return self.inner.has_kinematics

    def forward_kinematics(self, q: np.ndarray) -> np.ndarray:
        return self.inner.forward_kinematics(q)

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        return self.inner.jacobian(q)

    @property
    def features(self) -> dict[str, Feature]:
        return self.inner.features | {
            k: v for k, v in super().features.items() if k in ("joint_pos", "action")
        }

    @property
    def can_teleport(self) -> bool:
        return self.inner.can_teleport

    @property
    def estopped(self) -> bool:
        return self.estop_latch.engaged

    @property
    def watchdog_trips(self) -> int:
        return self._state.watchdog_trips

    def __setattr__(self, name: str, value: Any) -> None:
        # the Robot sets .path on us; keep the driver's arm labelled the same for its messages
        super().__setattr__(name, value)
        if name == "path" and "inner" in self.__dict__:
            self.inner.path = value

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> None:
        self.inner.connect()
        self._state = _State()
        cfg: SafetyConfig = self.config
        if cfg.watchdog_ms is not None and cfg.watchdog_thread and not self.clock.simulated:
            self._stop_thread.clear()
            self._thread = threading.Thread(
                target=self._watchdog_loop, name=f"watchdog:{self.path}", daemon=True
            )
            self._thread.start()

    def _disconnect(self) -> None:
        self._stop_thread.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        self.inner.disconnect()

    def _watchdog_loop(self) -> None:
        period = self.config.watchdog_ms / 4000.0
        while not self._stop_thread.wait(period):
            try:
                self.poll()
            except Exception:  # a failing bus in the watchdog latches the e-stop
                logger.exception("watchdog of %s failed; engaging e-stop", self.path)
                self.estop_latch.engage(f"watchdog error on {self.path}")
                return

    def _read(self) -> dict[str, np.ndarray]:
        return self.inner.read()

    def joint_positions(self) -> np.ndarray:
        self._require_connected("read")
        return self.inner.joint_positions()

    # -- the rules --------------------------------------------------------------------------
    def _send(self, target: np.ndarray) -> np.ndarray:
        with self._lock:
            now = self.clock.now()
            requested = np.array(target, dtype=np.float64)
            current = self.inner.joint_positions()
            if self.estop_latch.engaged:
                sent = self.inner.send(current)
                self._state.armed = False
                self.last_report = SafetyReport(requested, sent, ("estop",), now)
                return sent
            clipped: list[str] = []
            q = np.clip(requested, self._limits[:, 0], self._limits[:, 1])
            if not np.allclose(q, requested, rtol=0, atol=1e-12):
                clipped.append("joint_limits")
            step = q - current
            if self._max_delta is not None:
                limited = np.clip(step, -self._max_delta, self._max_delta)
                if not np.array_equal(limited, step):
                    clipped.append("max_delta")
                step = limited
            if self._max_velocity is not None:
                last = self._state.last_time
                dt = self.config.first_command_dt if last is None else max(now - last, 0.0)
                cap = self._max_velocity * dt
                limited = np.clip(step, -cap, cap)
                if not np.array_equal(limited, step):
                    clipped.append("max_velocity")
                step = limited
            if self._box is not None:
                fraction = self._workspace_fraction(current, step)
                if fraction < 1.0:
                    clipped.append("workspace")
                    step = step * fraction
            sent = self.inner.send(current + step)
            self._state.last_time = now
            self._state.armed = True
            self.last_report = SafetyReport(requested, sent, tuple(clipped), now)
            return sent

    def _workspace_fraction(self, current: np.ndarray, step: np.ndarray) -> float:
        low, high = self._box
        allowed = box_violation(self.forward_kinematics(current), low, high)

        def ok(t: float) -> bool:
            return box_violation(self.forward_kinematics(current + t * step), low, high) <= allowed + 1e-12

        if ok(1.0):
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    # -- watchdog and e-stop ----------------------------------------------------------------
    def poll(self) -> bool:
        """Run the watchdog once; returns True when it just held the arm."""
        cfg: SafetyConfig = self.config
        if cfg.watchdog_ms is None or not self._connected:
            return False
        with self._lock:
            last = self._state.last_time
            if not self._state.armed or last is None:
                return False
            if (self.clock.now() - last) * 1000.0 < cfg.watchdog_ms:
                return False
            here = self.inner.joint_positions()
            self.inner.send(here)
            self._state.armed = False
            self._state.last_time = None
            self._state.watchdog_trips += 1
            logger.warning("watchdog: no command to %s for %.0f ms; holding", self.path, cfg.watchdog_ms)
            return True

    def estop(self, reason: str = "code") -> None:
        """Latch the e-stop and hold the arm where it is now."""
        with self._lock:
            self.estop_latch.engage(reason)
            self._state.armed = False
            self._state.last_time = None
            if self._connected:
                self.inner.send(self.inner.joint_positions())

    def clear_estop(self) -> None:
        """Clear the latch (the only way to)."""
        with self._lock:
            self.estop_latch.clear()

    def teleport(self, q: np.ndarray) -> None:
        if self.estop_latch.engaged:
            raise EStopLatchedError(f"arm {self.path!r}: e-stop is latched; call robot.clear_estop() first")
        q = np.clip(np.asarray(q, dtype=np.float64), self._limits[:, 0], self._limits[:, 1])
        with self._lock:
            self.inner.teleport(q)
            self._state.last_time = None
            self._state.armed = False

    def stop(self) -> None:
        if self._connected:
            with self._lock:
                self.inner.send(self.inner.joint_positions())
                self._state.armed = False
                self._state.last_time = None


__all__ = ["EStop", "SafeArm", "SafetyConfig", "SafetyReport"]
