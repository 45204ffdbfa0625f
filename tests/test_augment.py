"""DrQ's random shift (rlinf_nb.algorithms.augment) against a reference: pad with the edge repeated, then crop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf_nb.algorithms.augment import draw_shifts, random_shift, shift_images


def _pad_and_crop(image: np.ndarray, dy: int, dx: int, pad: int) -> np.ndarray:
    """The textbook definition, one [H, W, C] image: np.pad (edge mode) by ``pad``, crop at ``pad + d``."""
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    h, w = image.shape[:2]
    return padded[pad + dy : pad + dy + h, pad + dx : pad + dx + w]


def test_each_image_is_its_own_padded_and_cropped_shift():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 9, 7, 3), dtype=np.uint8)  # H != W: rows and columns not mixed up
    shifts = np.array([[0, 0], [2, -1], [-2, 2], [1, 1], [-1, 0], [2, 2]])
    out = shift_images(torch.as_tensor(images), shifts)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    for b, (dy, dx) in enumerate(shifts):
        np.testing.assert_array_equal(out[b].numpy(), _pad_and_crop(images[b], dy, dx, pad=2), err_msg=str(b))
    np.testing.assert_array_equal(out[0].numpy(), images[0])  # no shift: the image itself


def test_channels_first_images_shift_the_same_pixels():
    images = torch.as_tensor(np.random.default_rng(1).normal(size=(4, 5, 6, 2)).astype(np.float32))
    shifts = draw_shifts(np.random.default_rng(2), 4, 3)
    last = shift_images(images, shifts)
    first = shift_images(images.permute(0, 3, 1, 2), shifts, channels_last=False)
    assert first.shape == (4, 2, 5, 6)
    torch.testing.assert_close(first.permute(0, 2, 3, 1), last)


def test_random_shift_draws_a_shift_per_image_within_pad_and_zero_pad_changes_nothing():
    rng = np.random.default_rng(3)
    shifts = draw_shifts(rng, 2000, 4)
    assert shifts.min() == -4 and shifts.max() == 4 and shifts.shape == (2000, 2)
    assert len({tuple(s) for s in shifts}) == 81  # every (dy, dx) in [-4, 4]^2 occurs
    # a single bright pixel in the middle moves by at most pad, each image on its own
    images = torch.zeros(64, 16, 16, 1, dtype=torch.uint8)
    images[:, 8, 8] = 255
    out = random_shift(images, 2, np.random.default_rng(4))
    where = torch.stack([torch.nonzero(o[..., 0])[0] for o in out])  # each keeps exactly one pixel on
    assert int((out > 0).sum()) == 64
    assert (where - 8).abs().max() <= 2 and len({tuple(w.tolist()) for w in where}) > 10
    assert random_shift(images, 0, np.random.default_rng(4)) is images


def test_bad_shapes_are_refused_with_the_expected_shape():
    with pytest.raises(ValueError, match=r"images must be \[B, H, W, C\]"):
        shift_images(torch.zeros(3, 4, 4), np.zeros((3, 2), int))
    with pytest.raises(ValueError, match=r"shifts must be \[3, 2\]"):
        shift_images(torch.zeros(3, 4, 4, 1), np.zeros((2, 2), int))
    with pytest.raises(ValueError, match="pad must be >= 0"):
        draw_shifts(np.random.default_rng(0), 3, -1)
