"""``Robot``: a tree of components addressed by path, built from a spec.

robot = make_robot("mock_arm")
with robot:
    arm = robot.component("arm")          # a SafeArm around the driver's arm
    sent = arm.send(arm.joint_positions() + 0.05)
    image = robot.component("cams/front").image()
    robot.tick()                          # one control period: clock, watchdogs, teleop buttons
    robot.estop()                         # latched: every actuator holds until clear_estop()
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rlinf_nb.robots.clock import Clock, make_clock
from rlinf_nb.robots.components import Actuator, Arm, Component, Device, Feature, Teleop, TeleopState
from rlinf_nb.robots.errors import SpecError
from rlinf_nb.robots.registry import build_config, device_class, driver_class
from rlinf_nb.robots.safety import EStop, SafeArm, SafetyConfig
from rlinf_nb.robots.spec import RobotSpec, load_spec

logger = logging.getLogger(__name__)


class Robot:
    """Components by path, shared devices, one clock and one latched e-stop."""

    def __init__(
        self,
        spec: RobotSpec,
        components: Mapping[str, Component],
        devices: Mapping[str, Device],
        clock: Clock,
        estop: EStop,
    ):
        self.spec = spec
        self.name = spec.name
        self.clock = clock
        self.estop_latch = estop
        self._components = dict(components)
        self._devices = dict(devices)
        self._deadline: float | None = None  # next control-period boundary (real clock)

    def __repr__(self) -> str:
        return f"<Robot {self.name!r}: {', '.join(self._components)}>"

    # -- the tree ---------------------------------------------------------------------------
    @property
    def paths(self) -> list[str]:
        return list(self._components)

    def component(self, path: str) -> Component:
        """The component at ``path`` (``arm``, ``left/arm``, ``cams/wrist``)."""
        try:
            return self._components[path]
        except KeyError:
            raise ValueError(
                f"robot {self.name!r}: no component at path {path!r}; paths: {', '.join(self._components)}"
            ) from None

    __getitem__ = component

    def __contains__(self, path: str) -> bool:
        return path in self._components

    def components(self, kind: str | None = None, under: str | None = None) -> dict[str, Component]:
        """Components by path, optionally of one ``kind`` and/or below a folder ``under``."""
        prefix = None if under is None else under.rstrip("/") + "/"
        return {
            p: c
            for p, c in self._components.items()
            if (kind is None or c.kind == kind) and (prefix is None or p.startswith(prefix))
        }

    def arm(self, path: str | None = None) -> SafeArm:
        """The arm at ``path``, or the only arm when ``path`` is None."""
        if path is not None:
            comp = self.component(path)
            if not isinstance(comp, SafeArm):
                raise ValueError(f"robot {self.name!r}: {path!r} is a {comp.kind}, not an arm")
            return comp
        arms = self.components("arm")
        if len(arms) != 1:
            raise ValueError(
                f"robot {self.name!r}: {len(arms)} arms ({', '.join(arms) or 'none'}); name one by path"
            )
        return next(iter(arms.values()))  # type: ignore[return-value]

    def features(self) -> dict[str, dict[str, Feature]]:
        """Every component's features by path (readable while disconnected)."""
        return {p: c.features for p, c in self._components.items()}

    def tree(self) -> str:
        """The component tree as indented text."""
        lines = [f"{self.name}"]
        seen: set[str] = set()
        for path, comp in self._components.items():
            parts = path.split("/")
            for depth in range(len(parts) - 1):
                folder = "/".join(parts[: depth + 1])
                if folder not in seen:
                    seen.add(folder)
                    lines.append("  " * (depth + 1) + parts[depth] + "/")
            lines.append("  " * len(parts) + f"{parts[-1]}  [{comp.kind}, {comp.driver_name}]")
        return "\n".join(lines)

    # -- connection -------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return all(c.is_connected for c in self._components.values())

    def connect(self) -> None:
        """Connect every component in spec order; on a failure, disconnect those already connected."""
        done: list[Component] = []
        try:
            for comp in self._components.values():
                if not comp.is_connected:
                    comp.connect()
                    done.append(comp)
        except BaseException:
            for comp in reversed(done):
                try:
                    comp.disconnect()
                except Exception:  # keep the original error
                    logger.exception("disconnecting %s after a failed connect", comp.path)
            raise

    def disconnect(self) -> None:
        """Disconnect every component (reverse order); safe to call twice."""
        errors = []
        for comp in reversed(list(self._components.values())):
            try:
                comp.disconnect()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Robot:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    # -- e-stop -----------------------------------------------------------------------------
    @property
    def estopped(self) -> bool:
        return self.estop_latch.engaged

    def estop(self, reason: str = "code") -> None:
        """Latch the e-stop and bring every actuator to rest now."""
        self.estop_latch.engage(reason)
        for comp in self._components.values():
            if isinstance(comp, Actuator) and comp.is_connected:
                try:
                    comp.stop()
                except Exception:
                    logger.exception("e-stop: stopping %s failed", comp.path)

    def clear_estop(self) -> None:
        """Clear the latched e-stop (the only way to)."""
        self.estop_latch.clear()

    # -- time -------------------------------------------------------------------------------
    @property
    def control_dt(self) -> float:
        return 1.0 / self.spec.control_hz

    def tick(self, dt: float | None = None) -> dict[str, TeleopState]:
        """One control period: let time pass, run the watchdogs, read teleop devices.

        A teleop's e-stop button latches the e-stop here. Returns each teleop's state by path.
        """
        dt = self.control_dt if dt is None else dt
        if self.clock.simulated:
            self.clock.sleep(dt)
        else:  # keep the rate: sleep to the next period boundary, not a full period after the work
            now = self.clock.now()
            deadline = (self._deadline if self._deadline is not None else now) + dt
            self._deadline = deadline if deadline > now else now
            self.clock.sleep(deadline - now)
        for device in self._devices.values():
            if device.is_open:
                device.advance(dt)
        for comp in self._components.values():
            if isinstance(comp, SafeArm) and comp.is_connected:
                comp.poll()
        return self.poll_teleop()

    def poll_teleop(self) -> dict[str, TeleopState]:
        states = {}
        for path, comp in self._components.items():
            if isinstance(comp, Teleop) and comp.is_connected:
                state = comp.poll()
                states[path] = state
                if state.estop and not self.estopped:
                    self.estop(f"teleop {path}")
        return states

    def observe(self) -> dict[str, np.ndarray]:
        """Every sensor reading, keyed ``"<path>/<feature>"`` (teleop devices excluded)."""
        out: dict[str, np.ndarray] = {}
        for path, comp in self._components.items():
            if isinstance(comp, Teleop):
                continue
            for key, value in comp.read().items():
                out[f"{path}/{key}"] = value
        return out


def make_robot(
    spec: str | Path | Mapping[str, Any] | RobotSpec,
    overrides: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
) -> Robot:
    """Build (not connect) a robot from a packaged name, YAML path, dict or RobotSpec.

    Raises:
        ValueError (SpecError): for an unknown driver, field or value, naming where and what is allowed.
    """
    spec = load_spec(spec, overrides)
    clock = clock or make_clock(spec.clock)
    estop = EStop()
    devices: dict[str, Device] = {}
    for d in spec.devices:
        where = f"robot spec {spec.source}: devices.{d.name}"
        cls = device_class(d.driver, where)
        device = cls(build_config(getattr(cls, "config_class", None), d.config, f"{where}.config"))
        device.clock = clock
        devices[d.name] = device
    components: dict[str, Component] = {}
    for c in spec.components:
        where = f"robot spec {spec.source}: components.{c.path}"
        cls = driver_class(c.driver, c.kind, f"{where}.driver")
        config = build_config(cls.config_class, c.config, f"{where}.config")
        device = devices.get(c.device) if c.device else None
        wanted = getattr(cls, "device_class", None)
        if wanted is not None and not isinstance(device, wanted):
            raise SpecError(
                f"{where}.device: the {c.driver!r} {c.kind} needs a device with driver "
                f"{wanted.driver_name!r}; add one under 'devices' and name it here"
            )
        comp = cls(config, device)
        if isinstance(comp, Arm):
            comp = SafeArm(comp, build_config(SafetyConfig, c.safety, f"{where}.safety"), clock, estop)
        comp.path = c.path
        if isinstance(comp, Actuator):
            comp.estop_latch = estop
        components[c.path] = comp
    return Robot(spec, components, devices, clock, estop)


__all__ = ["Robot", "make_robot"]
