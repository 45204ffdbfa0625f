"""Clocks: real time for hardware, simulated time for mock and sim robots.

Safety (velocity limits, watchdog) reads time only through a clock, so tests and the
mock driver are deterministic: a :class:`SimClock` moves only when told to.
"""

from __future__ import annotations

import time


class Clock:
    """Monotonic seconds, plus ``sleep`` that a simulated clock turns into "advance"."""

    simulated: bool = False

    def now(self) -> float:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def __call__(self) -> float:
        return self.now()


class RealClock(Clock):
    """Wall-clock time (``time.monotonic``)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock(Clock):
    """Simulated time starting at ``start``; ``sleep(dt)`` (or ``advance(dt)``) moves it forward."""

    simulated = True

    def __init__(self, start: float = 0.0):
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"SimClock.advance: seconds must be >= 0, got {seconds}")
        self._t += seconds

    sleep = advance


def make_clock(name: str) -> Clock:
    if name == "sim":
        return SimClock()
    if name == "real":
        return RealClock()
    raise ValueError(f"clock: unknown clock {name!r}; allowed: 'sim', 'real'")
