"""Batched unit quaternions in SAPIEN's ``wxyz`` order, for scripted controllers (pure numpy).

Every function takes ``[N, 4]`` quaternions (and ``[N, 3]`` vectors) and returns arrays of the
same batch size. Rotations compose like matrices: ``mul(a, b)`` rotates by ``b`` first, then ``a``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["angle", "conj", "mul", "rotate", "rotvec", "yaw_quat"]


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of ``[N, 4]`` quaternions."""
    aw, ax, ay, az = np.moveaxis(np.asarray(a, np.float64), -1, 0)
    bw, bx, by, bz = np.moveaxis(np.asarray(b, np.float64), -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def conj(q: np.ndarray) -> np.ndarray:
    """The inverse of unit quaternions ``q``."""
    return np.asarray(q, np.float64) * np.array([1.0, -1.0, -1.0, -1.0])


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectors ``v [N, 3]`` rotated by ``q``."""
    q = np.asarray(q, np.float64)
    v = np.broadcast_to(np.asarray(v, np.float64), (*q.shape[:-1], 3))
    pure = np.concatenate([np.zeros((*v.shape[:-1], 1)), v], axis=-1)
    return mul(mul(q, pure), conj(q))[..., 1:]


def rotvec(q: np.ndarray) -> np.ndarray:
    """Axis * angle ``[N, 3]`` of ``q``, the angle in ``[0, pi]`` (``q`` and ``-q`` give the same)."""
    q = np.asarray(q, np.float64)
    q = np.where(q[..., :1] < 0, -q, q)
    xyz = q[..., 1:]
    norm = np.linalg.norm(xyz, axis=-1, keepdims=True)
    theta = 2.0 * np.arctan2(norm, q[..., :1])
    return np.where(norm > 1e-12, xyz / np.maximum(norm, 1e-12) * theta, 2.0 * xyz)


def angle(q: np.ndarray) -> np.ndarray:
    """Rotation angle ``[N]`` of ``q`` in ``[0, pi]``."""
    return np.linalg.norm(rotvec(q), axis=-1)


def yaw_quat(theta: np.ndarray) -> np.ndarray:
    """Rotations by ``theta [N]`` radians about the world z axis."""
    half = np.asarray(theta, np.float64) / 2.0
    zeros = np.zeros_like(half)
    return np.stack([np.cos(half), zeros, zeros, np.sin(half)], axis=-1)
