"""ManiSkill PegInsertionSide-v1 from its state vector: the scene's geometry, the scripted expert, features.

One pure-numpy reading of the 43-dim state (:class:`PegScene`) serves two users:

* :func:`peginsertion_policy`, the package's scripted expert (grasp the peg from above, line it up with
  the hole, push it in), which :mod:`rlinf_nb.envs.scripted` registers for demos;
* :func:`peg_insertion_features`, registered as the ``peg_insertion`` observation features
  (:mod:`rlinf_nb.envs.obs_features`): the same geometry made easy for a network to read.

State layout (43 dims): qpos 0:9, qvel 9:18, TCP pose 18:25, peg pose 25:32, peg half size 32:35 (half
length, radius, radius), box hole pose 35:42 (its x axis: the hole's axis), hole radius 42. Poses are
position then ``wxyz`` quaternion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import quaternion as Q
from .obs_features import register_obs_features

__all__ = ["STATE_DIM", "PegScene", "peg_insertion_features", "peginsertion_policy"]

STATE_DIM = 43
_TOP_DOWN = np.array([0.0, 1.0, 0.0, 0.0])  # the TCP pointing down with its x along the world's (pi about x)
_STANDOFF = 0.04  # the peg's head lines up this far in front of the hole before going in (m)
_HOVER = 0.06  # the TCP comes down onto the grasp point from this far above it (m)


@dataclass
class PegScene:
    """The scene's geometry for a batch of state observations (every array ``[N, ...]``, float64, world frame)."""

    tcp_p: np.ndarray  # TCP position [N, 3]
    tcp_q: np.ndarray  # TCP orientation [N, 4]
    peg_p: np.ndarray  # peg centre [N, 3]
    peg_q: np.ndarray  # peg orientation [N, 4] (its x axis along the peg, towards its head)
    half_len: np.ndarray  # peg half length [N]
    hole_p: np.ndarray  # hole centre [N, 3]
    hole_q: np.ndarray  # hole orientation [N, 4] (its x axis: the hole's axis)
    radius: np.ndarray  # peg radius [N]
    width: np.ndarray  # gap between the fingers [N]
    peg_x: np.ndarray  # the peg's axis [N, 3]
    hole_x: np.ndarray  # the hole's axis [N, 3]
    grasp_p: np.ndarray  # where the expert grasps: halfway between the peg's centre and its tail [N, 3]
    grasp_q: np.ndarray  # TCP orientation for that grasp: pointing down, fingers across the peg [N, 4]
    seated: np.ndarray  # the peg's centre once its head is at the hole's centre [N, 3]
    rel_p: np.ndarray  # the peg's centre in the TCP's frame [N, 3]
    rel_q: np.ndarray  # the peg's orientation in the TCP's frame [N, 4] (w >= 0)
    hold_q: np.ndarray  # TCP orientation that gives the peg the hole's orientation, as held now [N, 4]

    @classmethod
    def from_obs(cls, obs: np.ndarray) -> PegScene:
        """Read ``obs [N, 43]`` (or ``[43]``)."""
        obs = np.asarray(obs, dtype=np.float64).reshape(-1, STATE_DIM)
        n = len(obs)
        tcp_p, tcp_q, peg_p, peg_q = obs[:, 18:21], obs[:, 21:25], obs[:, 25:28], obs[:, 28:32]
        half_len, hole_p, hole_q, radius = obs[:, 32], obs[:, 35:38], obs[:, 38:42], obs[:, 42]
        peg_x, hole_x = Q.rotate(peg_q, [1.0, 0.0, 0.0]), Q.rotate(hole_q, [1.0, 0.0, 0.0])
        yaw = np.arctan2(peg_x[:, 1], peg_x[:, 0])
        tcp_x = Q.rotate(tcp_q, [1.0, 0.0, 0.0])
        yaw = np.where(
            tcp_x[:, 0] * np.cos(yaw) + tcp_x[:, 1] * np.sin(yaw) < 0, yaw + np.pi, yaw
        )  # nearer way
        rel_q = Q.mul(Q.conj(tcp_q), peg_q)
        rel_q = np.where(rel_q[:, :1] < 0, -rel_q, rel_q)
        return cls(
            tcp_p=tcp_p, tcp_q=tcp_q, peg_p=peg_p, peg_q=peg_q, half_len=half_len, hole_p=hole_p,
            hole_q=hole_q, radius=radius, width=obs[:, 7] + obs[:, 8], peg_x=peg_x, hole_x=hole_x,
            grasp_p=peg_p - peg_x * (0.5 * half_len)[:, None],
            grasp_q=Q.mul(Q.yaw_quat(yaw), np.broadcast_to(_TOP_DOWN, (n, 4))),
            seated=hole_p - hole_x * half_len[:, None],
            rel_p=Q.rotate(Q.conj(tcp_q), peg_p - tcp_p), rel_q=rel_q,
            hold_q=Q.mul(hole_q, Q.conj(rel_q)),
        )  # fmt: skip

    @property
    def offset(self) -> np.ndarray:
        """The peg's centre minus its seated centre ``[N, 3]`` (zero when fully inserted)."""
        return self.peg_p - self.seated

    @property
    def along(self) -> np.ndarray:
        """How far the peg is along the hole's axis from seated ``[N]`` (negative: in front of the box)."""
        return (self.offset * self.hole_x).sum(1)

    @property
    def lateral(self) -> np.ndarray:
        """The peg centre's distance from the hole's axis ``[N]``."""
        return np.linalg.norm(self.offset - self.along[:, None] * self.hole_x, axis=1)

    @property
    def tilt_rotvec(self) -> np.ndarray:
        """Rotation from the peg's orientation to the hole's ``[N, 3]`` (axis * angle, world frame)."""
        return Q.rotvec(Q.mul(self.hole_q, Q.conj(self.peg_q)))

    @property
    def head_in_hole(self) -> np.ndarray:
        """The peg's head relative to the hole's centre, in the hole's frame ``[N, 3]`` (x along the axis)."""
        head = self.peg_p + self.peg_x * self.half_len[:, None]
        return Q.rotate(Q.conj(self.hole_q), head - self.hole_p)

    @property
    def off_axis(self) -> np.ndarray:
        """The TCP's distance from the peg's axis ``[N]`` (small when the peg is between the fingers)."""
        off = self.tcp_p - self.peg_p
        return np.linalg.norm(off - (off * self.peg_x).sum(1, keepdims=True) * self.peg_x, axis=1)

    def tcp_for(self, peg_target: np.ndarray, tcp_q: np.ndarray) -> np.ndarray:
        """TCP position ``[N, 3]`` that puts the held peg's centre at ``peg_target`` with the TCP at ``tcp_q``."""
        return peg_target - Q.rotate(tcp_q, self.rel_p)


# ----------------------------------------------------------------------------- the scripted expert


def peginsertion_policy(obs: np.ndarray) -> np.ndarray:
    """Actions ``float32 [N, 7]`` (``pd_ee_delta_pose``: TCP delta xyz, delta rotation, gripper) for
    PegInsertionSide state obs ``[N, 43]``.

    Stateless: grasp the peg from above, halfway between its centre and its tail, fingers across it; once
    held, move it so that it lies on the hole's axis with the hole's orientation, its head ``_STANDOFF``
    in front of the box, and push it in 12 mm per step while it stays on the axis (it backs out to line
    up again when it does not). The peg-in-TCP pose is read from each observation, so a peg that slipped
    in the fingers is still steered right. Gains above 1 offset the arm controller's lag (it covers about
    40% of a commanded delta per step); holes have 3 mm of clearance.
    """
    s = PegScene.from_obs(obs)
    # grasp from above: TCP over the grasp point and turned to it, then down, then close
    holding = (s.off_axis < s.radius + 0.01) & (s.width < 2 * s.radius + 0.006)
    over = (np.linalg.norm(s.tcp_p[:, :2] - s.grasp_p[:, :2], axis=1) < 0.008) & (
        Q.angle(Q.mul(s.grasp_q, Q.conj(s.tcp_q))) < 0.08
    )
    at_grasp = np.linalg.norm(s.tcp_p - s.grasp_p, axis=1) < 0.01
    target_p = np.where(over[:, None], s.grasp_p, s.grasp_p + [0.0, 0.0, _HOVER])

    # held: the peg onto the hole's axis and orientation, then in
    along, lateral = s.along, s.lateral
    tilt = Q.angle(Q.mul(s.hole_q, Q.conj(s.peg_q)))
    start = -(s.half_len + _STANDOFF)
    head_in = s.head_in_hole[:, 0] > -(s.half_len + 0.003)
    inserting = (
        ((lateral < 0.0015) & (tilt < 0.012))
        | ((along > start + 0.004) & (lateral < 0.003) & (tilt < 0.04))  # on its way in: a looser band
        | (head_in & (lateral < 0.004))
    )
    peg_target = s.seated + s.hole_x * np.where(inserting, np.minimum(along + 0.012, 0.02), start)[:, None]
    target_p = np.where(holding[:, None], s.tcp_for(peg_target, s.hold_q), target_p)
    target_q = np.where(holding[:, None], s.hold_q, s.grasp_q)

    gain = np.where(holding, np.where(inserting, 2.0, 2.5), 1.0)[:, None]
    action = np.zeros((len(s.tcp_p), 7), np.float32)
    action[:, :3] = np.clip(gain * (target_p - s.tcp_p) / 0.1, -1.0, 1.0)  # an action of 1 is 0.1 m
    # an action of 1 is 0.1 rad; measured: a positive one turns the TCP the negative way about that world axis
    action[:, 3:6] = np.clip(-gain * Q.rotvec(Q.mul(target_q, Q.conj(s.tcp_q))) / 0.1, -1.0, 1.0)
    action[:, 6] = np.where(at_grasp | holding, -1.0, 1.0)
    return action


# ----------------------------------------------------------------------------- features


def _scales(x: np.ndarray, *scales: float) -> list[np.ndarray]:
    """``clip(x / s, -1, 1)`` for each scale ``s``: coarse copies see far, fine ones resolve millimetres."""
    return [np.clip(x / s, -1.0, 1.0) for s in scales]


def _column(x: np.ndarray) -> np.ndarray:
    return x[:, None]


@register_obs_features("peg_insertion", state_dim=STATE_DIM)
def peg_insertion_features(obs: np.ndarray) -> np.ndarray:
    """Hole-, peg- and TCP-relative geometry of PegInsertionSide-v1 ``[N, 43] -> float32 [N, 83]``.

    Every error the task turns on (the peg's offset from seated, in the world and in the hole's frame; its
    head in the hole's frame; its tilt; the TCP's offset from the grasp point and grasp orientation; the
    TCP move that would line the held peg up with the hole) appears at several clipped scales
    (``clip(x / s, -1, 1)``, ``s`` from 10 cm down to 2 mm, 0.5 rad down to 0.01 rad), so a small MLP
    resolves the millimetres the 3 mm clearance needs. Measured (session 12, NOTES.md): behaviour cloning
    reached 0.875-0.95 success with these features plus the raw state, 0.075 on the raw state alone.

    The grasp point, its hover height and the hold orientation are the scripted expert's sub-goals, so
    these features carry task knowledge: they are what a researcher hand-engineers for a hard insertion,
    not a general encoding.
    """
    s = PegScene.from_obs(obs)
    offset = s.offset
    offset_h = Q.rotate(Q.conj(s.hole_q), offset)  # in the hole's frame
    tilt = s.tilt_rotvec
    grasp_err = s.grasp_p - s.tcp_p
    grasp_rot = Q.rotvec(Q.mul(s.grasp_q, Q.conj(s.tcp_q)))
    hold_corr = s.peg_p - s.tcp_p - Q.rotate(s.hold_q, s.rel_p)  # TCP move that lines the held peg up
    parts = [
        s.peg_x, s.hole_x, Q.rotate(s.tcp_q, [1.0, 0.0, 0.0]), Q.rotate(s.tcp_q, [0.0, 0.0, 1.0]),
        *_scales(offset, 0.1, 0.01, 0.002), *_scales(offset_h, 0.1, 0.01, 0.002),
        *_scales(s.head_in_hole, 0.1, 0.01),
        *_scales(_column(s.along + s.half_len + _STANDOFF), 0.05, 0.005),  # along-axis error at the stand-off
        *_scales(_column(s.lateral), 0.01, 0.002),
        *_scales(tilt, 0.5, 0.05, 0.01), *_scales(_column(np.linalg.norm(tilt, axis=1)), 0.05, 0.01),
        *_scales(grasp_err, 0.1, 0.01), *_scales(grasp_err[:, 2:] + _HOVER, 0.1, 0.01),
        *_scales(grasp_rot, 0.5, 0.08),
        *_scales(_column(s.off_axis - s.radius), 0.02), *_scales(_column(s.width - 2 * s.radius), 0.01),
        s.rel_p * 10.0, s.rel_q, *_scales(hold_corr, 0.05, 0.005),
        _column(s.half_len * 10.0), _column(s.radius * 50.0), _column(s.width * 10.0),
    ]  # fmt: skip
    return np.concatenate(parts, axis=1).astype(np.float32)
