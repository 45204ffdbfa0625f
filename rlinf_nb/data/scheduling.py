"""Keep video encoding from turning the calling thread real-time.

SVT-AV1 (LeRobot's default ``libsvtav1`` encoder, through PyAV) switches the thread that opens an
encoder to ``SCHED_FIFO`` priority 99 when it runs as root, and never switches it back. A Ray env
worker or a test process that then spins starves every other process on the machine (measured here:
load average ~100 on 2 cores, other jobs' ``ray start`` timing out). Every call into LeRobot that
may encode runs inside :func:`normal_scheduling`, which restores the thread's policy afterwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def normal_scheduling() -> Iterator[None]:
    """Run the block, then put this thread back on the scheduling policy it had before."""
    if not hasattr(os, "sched_getscheduler"):  # not Linux
        yield
        return
    policy = os.sched_getscheduler(0)
    param = os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy:
            os.sched_setscheduler(0, policy, param)
