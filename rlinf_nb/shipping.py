"""Code a client sends to the cluster by value: a registered algorithm, an observation feature set.

Cloudpickle pickles what a notebook cell defines by value, so the controller and the workers can
install a copy of it; what cannot pickle fails in the client, naming what and what to fix.
"""

from __future__ import annotations

from typing import Any


def ship(obj: Any, what: str, parts: str) -> bytes:
    """``obj`` cloudpickled; ``TypeError`` naming ``what`` (e.g. ``"algorithm 'ppo'"``) and the ``parts``
    that must pickle when it does not."""
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - re-raised with what to fix
        raise TypeError(
            f"{what} cannot be sent to the cluster: {parts} do not pickle ({type(exc).__name__}: {exc}); "
            "keep them free of open files, locks and widgets"
        ) from exc
