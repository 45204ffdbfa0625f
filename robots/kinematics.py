"""Small kinematics helpers shared by drivers, safety and envs (pure numpy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def numeric_jacobian(fk: Callable[[np.ndarray], np.ndarray], q: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``[m, n]`` Jacobian of ``fk`` at ``q`` by central differences."""
    q = np.asarray(q, dtype=np.float64)
    cols = []
    for i in range(q.size):
        dq = np.zeros_like(q)
        dq[i] = eps
        cols.append((np.asarray(fk(q + dq)) - np.asarray(fk(q - dq))) / (2 * eps))
    return np.stack(cols, axis=-1)


def dls_step(jac: np.ndarray, dx: np.ndarray, damping: float = 0.05) -> np.ndarray:
    """Damped least squares: the joint step ``dq`` that moves the end effector by about ``dx``.

    ``dq = J^T (J J^T + damping^2 I)^-1 dx``; well-behaved near singularities.
    """
    jac = np.asarray(jac, dtype=np.float64)
    m = jac.shape[0]
    return jac.T @ np.linalg.solve(jac @ jac.T + damping**2 * np.eye(m), np.asarray(dx, dtype=np.float64))


def box_violation(p: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """Distance of point ``p`` outside the axis-aligned box ``[low, high]`` (0 inside)."""
    return float(np.linalg.norm(np.maximum(low - p, 0.0) + np.maximum(p - high, 0.0)))
