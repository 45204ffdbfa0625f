"""``check_robot``: connect, move every arm a little (safely), read every sensor, report.

Used by ``rlinf-nb robot check SPEC``. Each arm makes a small sine motion around where
it stands (half its ``max_delta`` per joint, through its SafeArm), checks that it moved
and came back, and checks that the latched e-stop holds it. Each camera must give a
frame of its declared shape that is not one flat colour.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rlinf_nb.robots.components import Camera, Teleop
from rlinf_nb.robots.errors import RobotError, SpecError
from rlinf_nb.robots.robot import Robot, make_robot
from rlinf_nb.robots.safety import SafeArm


@dataclass
class CheckItem:
    """One line of the report."""

    path: str
    """Component path (or ``spec`` / ``connect`` for whole-robot steps)."""
    ok: bool
    """Whether this part is healthy."""
    message: str
    """What was measured, or what went wrong and what to do."""


@dataclass
class CheckReport:
    """The result of :func:`check_robot`."""

    robot: str
    """Robot name (or the spec as given when it could not be loaded)."""
    items: list[CheckItem] = field(default_factory=list)
    """One line per step and component."""

    @property
    def ok(self) -> bool:
        return bool(self.items) and all(i.ok for i in self.items)

    def add(self, path: str, ok: bool, message: str) -> None:
        self.items.append(CheckItem(path, ok, message))

    def format(self) -> str:
        lines = [f"robot check: {self.robot}"]
        width = max((len(i.path) for i in self.items), default=4)
        for i in self.items:
            lines.append(f"  {'ok  ' if i.ok else 'FAIL'}  {i.path:<{width}}  {i.message}")
        lines.append("healthy" if self.ok else "NOT healthy")
        return "\n".join(lines)


def _check_arm(robot: Robot, path: str, arm: SafeArm, steps: int, report: CheckReport) -> None:
    q0 = arm.joint_positions()
    lim = arm.joint_limits
    span = lim[:, 1] - lim[:, 0]
    step = arm.max_delta if arm.max_delta is not None else 0.02 * span
    amp = 0.5 * step
    # stay inside the limits: bend each joint towards the side with room
    sign = np.where(q0 + amp <= lim[:, 1], 1.0, -1.0)
    moved = 0.0
    for k in range(1, steps + 1):
        target = q0 + sign * amp * np.sin(np.pi * k / steps)
        arm.send(target)
        robot.tick()
        moved = max(moved, float(np.max(np.abs(arm.joint_positions() - q0) / amp)))
    for _ in range(3):
        arm.send(q0)
        robot.tick()
    back = float(np.max(np.abs(arm.joint_positions() - q0) / amp))
    if moved < 0.5:
        report.add(
            path, False, f"did not move: reached {moved:.0%} of a {amp.max():.3g} {arm.joint_unit} motion"
        )
        return
    if back > 0.5:
        report.add(path, False, f"did not return to its start: off by {back:.0%} of the motion amplitude")
        return
    robot.estop("robot check")
    try:
        sent = arm.send(q0 + sign * amp)
        held = arm.last_report is not None and "estop" in arm.last_report.clipped
        if not held or np.max(np.abs(sent - q0) / amp) > 0.5:
            report.add(path, False, "e-stop did not hold the arm")
            return
    finally:
        robot.clear_estop()
    report.add(
        path,
        True,
        f"moved {steps} steps (peak {amp.max():.3g} {arm.joint_unit}), returned, e-stop holds; "
        f"watchdog trips {arm.watchdog_trips}",
    )


def _check_camera(path: str, cam: Camera, report: CheckReport) -> None:
    t0 = time.perf_counter()
    frame = np.asarray(cam.image())
    ms = (time.perf_counter() - t0) * 1e3
    want = cam.image_shape
    if frame.shape != tuple(want) or frame.dtype != np.uint8:
        report.add(path, False, f"frame {frame.shape} {frame.dtype}, expected {tuple(want)} uint8")
    elif float(frame.std()) == 0.0:
        report.add(
            path, False, f"frame is one flat colour ({frame.reshape(-1, 3)[0].tolist()}): lens cap, cable?"
        )
    else:
        report.add(path, True, f"frame {want[1]}x{want[0]} in {ms:.1f} ms")


def check_robot(
    spec: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    steps: int = 10,
) -> CheckReport:
    """Connect to ``spec``'s robot, exercise it briefly and safely, and report (never raises for hardware)."""
    if steps < 2:
        raise ValueError(f"check_robot: steps must be >= 2, got {steps}")
    try:
        robot = make_robot(spec, overrides)
    except SpecError as exc:
        report = CheckReport(str(spec))
        report.add("spec", False, str(exc))
        return report
    report = CheckReport(robot.name)
    try:
        robot.connect()
    except (RobotError, OSError) as exc:
        report.add("connect", False, f"{type(exc).__name__}: {exc}")
        return report
    try:
        report.add("connect", True, f"{len(robot.paths)} components: {', '.join(robot.paths)}")
        for path, comp in robot.components().items():
            try:
                if isinstance(comp, SafeArm):
                    _check_arm(robot, path, comp, steps, report)
                elif isinstance(comp, Camera):
                    _check_camera(path, comp, report)
                elif isinstance(comp, Teleop):
                    comp.poll()
                    report.add(path, True, "polled")
                else:
                    keys = ", ".join(f"{k}{list(np.shape(v))}" for k, v in comp.read().items())
                    report.add(path, True, f"read {keys}")
            except (RobotError, OSError) as exc:
                report.add(path, False, f"{type(exc).__name__}: {exc}")
    finally:
        robot.disconnect()
    return report


__all__ = ["CheckItem", "CheckReport", "check_robot"]
