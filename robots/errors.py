"""Typed errors of the hardware layer.

Every error a user can act on says what happened, to which component (by path),
and what to do about it. Spec and config mistakes are ``ValueError``s (see
:class:`SpecError`); everything that goes wrong with a device is a :class:`RobotError`.
"""

from __future__ import annotations


class RobotError(RuntimeError):
    """Base class of every hardware-layer error that is not a spec mistake."""


class SpecError(ValueError):
    """A robot spec, component config or safety config is invalid (names field, value and fix)."""


class NotConnectedError(RobotError):
    """A component was read or commanded while disconnected."""


class AlreadyConnectedError(RobotError):
    """``connect()`` was called on a component that is already connected."""


class DriverUnavailableError(RobotError):
    """A driver's SDK, device or port is missing; the message says what to install or plug in."""


class CalibrationRequiredError(RobotError):
    """A device needs a calibration that cannot be done non-interactively here."""


class EStopLatchedError(RobotError):
    """The e-stop is latched; it is cleared only by an explicit ``clear_estop()``."""
