"""Image augmentation for off-policy learning from pixels: DrQ's random shift, as pure functions.

DrQ (Kostrikov et al., 2020) and the methods built on it (DrQ-v2; RLPD and SERL from pixels) pad each image
of a training batch by ``pad`` pixels, repeating the edge, and crop it back to its size at a random
offset: a shift of up to ``pad`` pixels in each direction, drawn per image. The critic and the actor
then see slightly moved views of the same state, which regularises the image encoder. Acting is
untouched: the policy acts on the camera's own frames.

Padding with the edge repeated and cropping at offset ``pad + d`` is a clamped shift:
``out[b, i, j] = images[b, clamp(i + dy_b, 0, H - 1), clamp(j + dx_b, 0, W - 1)]``, which is how
:func:`shift_images` computes it (one gather, any dtype: ``uint8`` stays ``uint8``).

Shapes: ``images[B, H, W, C]`` (channels last, as envs and the replay keep them) or ``[B, C, H, W]``
with ``channels_last=False``; ``shifts[B, 2]`` integer ``(dy, dx)`` in ``[-pad, pad]``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["draw_shifts", "random_shift", "shift_images"]


def draw_shifts(rng: np.random.Generator, batch: int, pad: int) -> np.ndarray:
    """``[batch, 2]`` integer ``(dy, dx)`` shifts, each uniform in ``[-pad, pad]``."""
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad}")
    return rng.integers(-pad, pad + 1, size=(batch, 2))


def shift_images(images: Tensor, shifts: Tensor | np.ndarray, channels_last: bool = True) -> Tensor:
    """Each image moved by its own ``(dy, dx)``, the edge pixels repeated (see the module docstring).

    Raises:
        ValueError: ``images`` is not ``[B, H, W, C]`` / ``[B, C, H, W]``, or ``shifts`` is not ``[B, 2]``.
    """
    if images.dim() != 4:
        raise ValueError(f"images must be [B, H, W, C] or [B, C, H, W], got shape {tuple(images.shape)}")
    x = images if channels_last else images.permute(0, 2, 3, 1)
    B, H, W = x.shape[:3]
    s = torch.as_tensor(np.asarray(shifts), dtype=torch.long)
    if tuple(s.shape) != (B, 2):
        raise ValueError(f"shifts must be [{B}, 2] (dy, dx) per image, got shape {tuple(s.shape)}")
    rows = (torch.arange(H)[None, :] + s[:, :1]).clamp_(0, H - 1)  # [B, H]
    cols = (torch.arange(W)[None, :] + s[:, 1:]).clamp_(0, W - 1)  # [B, W]
    out = x[torch.arange(B)[:, None, None], rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    return out if channels_last else out.permute(0, 3, 1, 2).contiguous()


def random_shift(images: Tensor, pad: int, rng: np.random.Generator, channels_last: bool = True) -> Tensor:
    """DrQ's augmentation: every image shifted by up to ``pad`` pixels each way (``pad = 0``: unchanged)."""
    if pad == 0:
        return images
    return shift_images(images, draw_shifts(rng, images.shape[0], pad), channels_last)
