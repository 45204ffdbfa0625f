"""Fakes for testing robot code without hardware (shipped in the package, like the mock driver).

:func:`patch_lerobot_bus` swaps LeRobot's motor bus class *where the follower module
imports it* for a :class:`FakeMotorsBus` that records every call, so a test can assert
the exact bus traffic of LeRobot's own robot classes::

    with patch_lerobot_bus("so101_follower") as fake:
        with make_robot(spec) as robot:
            robot.component("arm").send(target)
        assert fake.bus.calls[-1] == ("sync_write", "Goal_Position", {...})
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from rlinf_nb.robots.drivers.lerobot import FOLLOWERS


class FakeMotorsBus:
    """Stands in for LeRobot's ``FeetechMotorsBus`` / ``DynamixelMotorsBus``.

    ``calls`` lists ``(method, *args)`` in order. Positions start at ``start_positions``
    (0 by default) and follow ``Goal_Position`` writes at once (ideal servos).
    """

    # set per patch by patch_lerobot_bus
    port_present: bool = True
    calibrated: bool = True
    start_positions: dict[str, float] = {}

    def __init__(self, port: str, motors: dict[str, Any], calibration: dict | None = None, **kwargs: Any):
        self.port = port
        self.motors = motors
        self.calibration = calibration or {}
        self.calls: list[tuple] = []
        self.positions = {m: float(self.start_positions.get(m, 0.0)) for m in motors}
        self._connected = False

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_calibrated(self) -> bool:
        return self.calibrated

    def connect(self, handshake: bool = True) -> None:
        self.calls.append(("connect",))
        if not self.port_present:
            raise ConnectionError(f"\nCould not connect on port '{self.port}'.")
        self._connected = True

    def disconnect(self, disable_torque: bool = True) -> None:
        self.calls.append(("disconnect", disable_torque))
        self._connected = False

    def configure_motors(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("configure_motors",))

    def disable_torque(self, motors: Any = None, num_retry: int = 0) -> None:
        self.calls.append(("disable_torque", motors))

    def enable_torque(self, motors: Any = None, num_retry: int = 0) -> None:
        self.calls.append(("enable_torque", motors))

    @contextlib.contextmanager
    def torque_disabled(self, motors: Any = None) -> Iterator[None]:
        self.disable_torque(motors)
        try:
            yield
        finally:
            self.enable_torque(motors)

    def write(self, data_name: str, motor: str, value: Any, **kwargs: Any) -> None:
        self.calls.append(("write", data_name, motor, value))

    def read(self, data_name: str, motor: str, **kwargs: Any) -> Any:
        self.calls.append(("read", data_name, motor))
        return self.positions[motor]

    def sync_read(self, data_name: str, motors: Any = None, **kwargs: Any) -> dict[str, float]:
        self.calls.append(("sync_read", data_name))
        names = list(self.motors) if motors is None else [motors] if isinstance(motors, str) else list(motors)
        return {m: self.positions[m] for m in names}

    def sync_write(self, data_name: str, values: dict[str, float], **kwargs: Any) -> None:
        self.calls.append(("sync_write", data_name, dict(values)))
        if data_name == "Goal_Position":
            self.positions.update({k: float(v) for k, v in values.items()})

    def write_calibration(self, calibration: dict, cache: bool = True) -> None:
        self.calls.append(("write_calibration", sorted(calibration)))
        self.calibrated = True


@dataclass
class FakeBusHandle:
    """What :func:`patch_lerobot_bus` yields: the fake class and the buses it made."""

    bus_class: type[FakeMotorsBus]
    buses: list[FakeMotorsBus] = field(default_factory=list)

    @property
    def bus(self) -> FakeMotorsBus:
        if not self.buses:
            raise AssertionError("no motor bus was created (the robot never built its LeRobot object)")
        return self.buses[-1]


@contextlib.contextmanager
def patch_lerobot_bus(
    robot_type: str,
    *,
    port_present: bool = True,
    calibrated: bool = True,
    start_positions: dict[str, float] | None = None,
) -> Iterator[FakeBusHandle]:
    """Replace the motor bus class in the LeRobot module of ``robot_type`` by a recording fake.

    Args:
        port_present: False makes ``connect`` fail like a missing serial port.
        calibrated: False makes the motors' calibration differ from the file.
        start_positions: motor name -> starting position (normalised units).
    """
    model = FOLLOWERS[robot_type]
    module = importlib.import_module(model.robot_module)
    handle = FakeBusHandle(bus_class=FakeMotorsBus)

    class _Bus(FakeMotorsBus):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            handle.buses.append(self)

    _Bus.port_present = port_present
    _Bus.calibrated = calibrated
    _Bus.start_positions = dict(start_positions or {})
    handle.bus_class = _Bus
    with mock.patch.object(module, model.bus_class, _Bus):
        yield handle


def write_calibration_file(calibration_dir: str | Path, robot_id: str, motors: list[str]) -> Path:
    """A LeRobot calibration file (``<dir>/<id>.json``) with full-range values for ``motors``."""
    path = Path(calibration_dir) / f"{robot_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        m: {"id": i + 1, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4095}
        for i, m in enumerate(motors)
    }
    path.write_text(json.dumps(data, indent=2))
    return path


__all__ = ["FakeBusHandle", "FakeMotorsBus", "patch_lerobot_bus", "write_calibration_file"]
