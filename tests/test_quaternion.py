"""Batched wxyz quaternion helpers of the scripted controllers, against SciPy's rotations."""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from rlinf_nb.envs import quaternion as Q


def _random(n, seed):
    xyzw = Rotation.random(n, random_state=seed).as_quat()
    return xyzw[:, [3, 0, 1, 2]], Rotation.from_quat(xyzw)


def test_product_inverse_rotation_and_rotvec_match_scipy():
    a, ra = _random(50, 0)
    b, rb = _random(50, 1)
    v = np.random.default_rng(2).standard_normal((50, 3))
    ab = Q.mul(a, b)
    np.testing.assert_allclose(Q.rotate(ab, v), (ra * rb).apply(v), atol=1e-9)  # b first, then a
    np.testing.assert_allclose(Q.rotate(Q.conj(a), Q.rotate(a, v)), v, atol=1e-9)
    np.testing.assert_allclose(Q.rotvec(ab), (ra * rb).as_rotvec(), atol=1e-9)
    np.testing.assert_allclose(Q.rotvec(-ab), (ra * rb).as_rotvec(), atol=1e-9)  # q and -q: one rotation
    np.testing.assert_allclose(Q.angle(ab), (ra * rb).magnitude(), atol=1e-9)


def test_yaw_and_small_angles():
    theta = np.array([0.0, 0.3, -1.2, np.pi])
    np.testing.assert_allclose(Q.rotate(Q.yaw_quat(theta), [1.0, 0.0, 0.0])[:, :2],
                               np.stack([np.cos(theta), np.sin(theta)], 1), atol=1e-12)  # fmt: skip
    tiny = Rotation.from_rotvec([[1e-9, -2e-9, 3e-9]])
    xyzw = tiny.as_quat()
    np.testing.assert_allclose(Q.rotvec(xyzw[:, [3, 0, 1, 2]]), tiny.as_rotvec(), atol=1e-15)
    assert Q.angle(np.array([[1.0, 0.0, 0.0, 0.0]]))[0] == 0.0
