"""CartPole with a numpy renderer, so the rollout tile has frames without pygame.

gymnasium draws CartPole with pygame, which is not a dependency here; ``render_every > 0``
with plain ``CartPole-v1`` fails in the env worker. ``CartPoleSketch-v1`` is the same env
(same dynamics, time limit and reward) whose ``rgb_array`` frames are drawn with numpy::

    run = rl.launch("ppo_cartpole", env__id=CARTPOLE_WITH_FRAMES, env__render_every=64)

The env worker imports this module through gymnasium's ``"module:EnvId"`` ids
(``CARTPOLE_WITH_FRAMES`` names it), so nothing has to register it beforehand.
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.registration import register, registry

ENV_ID = "CartPoleSketch-v1"
CARTPOLE_WITH_FRAMES = f"gym:{__name__}:{ENV_ID}"

WIDTH, HEIGHT = 300, 200
_SKY = np.array([250, 250, 250], np.uint8)
_TRACK = np.array([60, 60, 60], np.uint8)
_CART = np.array([40, 40, 40], np.uint8)
_POLE = np.array([202, 152, 101], np.uint8)
_AXLE = np.array([129, 132, 203], np.uint8)


def draw_cartpole(x: float, theta: float, x_threshold: float = 2.4, pole_half_length: float = 0.5,
                  width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:  # fmt: skip
    """An HxWx3 uint8 picture of a cart at ``x`` with its pole at angle ``theta`` (radians)."""
    img = np.empty((height, width, 3), np.uint8)
    img[:] = _SKY
    scale = width / (2 * x_threshold)
    track_y = int(height * 0.75)
    img[track_y : track_y + 2, :] = _TRACK
    cx = int(round(x * scale + width / 2))
    cart_w, cart_h = int(width / 12), int(height / 13)
    x0, x1 = max(cx - cart_w // 2, 0), min(cx + cart_w // 2, width)
    y0, y1 = max(track_y - cart_h, 0), track_y
    if x0 < x1:
        img[y0:y1, x0:x1] = _CART
    # The pole: a thick segment from the axle, sampled densely.
    axle_y = y0 + cart_h // 4
    length = scale * 2 * pole_half_length
    t = np.linspace(0.0, 1.0, int(length) * 2 + 2)
    px = cx + np.sin(theta) * length * t
    py = axle_y - np.cos(theta) * length * t
    half = max(1, width // 120)
    for dx in range(-half, half + 1):
        xs = np.clip(np.round(px + dx).astype(int), 0, width - 1)
        ys = np.clip(np.round(py).astype(int), 0, height - 1)
        img[ys, xs] = _POLE
    r = half + 1
    ax0, ax1 = max(cx - r, 0), min(cx + r + 1, width)
    if ax0 < ax1:
        img[max(axle_y - r, 0) : axle_y + r + 1, ax0:ax1] = _AXLE
    return img


class CartPoleSketchEnv(CartPoleEnv):
    """``CartPole-v1`` whose ``rgb_array`` render is drawn with numpy (no pygame)."""

    def render(self):  # noqa: D102 - see the class docstring
        if self.render_mode != "rgb_array" or self.state is None:
            return super().render() if self.render_mode == "human" else None
        x, _, theta, _ = (float(v) for v in self.state)
        return draw_cartpole(x, theta, self.x_threshold, self.length)


if ENV_ID not in registry:
    register(
        id=ENV_ID,
        entry_point=f"{__name__}:CartPoleSketchEnv",
        max_episode_steps=500,
        reward_threshold=475.0,
    )

__all__ = ["CARTPOLE_WITH_FRAMES", "CartPoleSketchEnv", "draw_cartpole"]
