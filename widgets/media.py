"""The rollout / camera tile: the newest frame of each env worker as an ``ipywidgets.Image``.

Frames come from ``run.latest_frames()`` (the run keeps only the newest per env worker and
drops the rest), are encoded to JPEG in the kernel and set as the Image's ``bytes`` value,
which ipywidgets sends as a binary buffer (never base64). A frame is sent only when it is
new; the caption shows the frame rate seen here and how old the shown frame is.
"""

from __future__ import annotations

import io
import time
from typing import Any

import ipywidgets as widgets
import numpy as np

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def encode_frame(frame: np.ndarray, fmt: str = "jpeg", quality: int = 80, max_width: int = 480) -> bytes:
    """HxWx3 (or HxW) uint8 -> JPEG/PNG bytes, downscaled to ``max_width``."""
    from PIL import Image

    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        arr = np.clip(arr * (255.0 if arr.dtype.kind == "f" and arr.max() <= 1.0 else 1.0), 0, 255).astype(
            np.uint8
        )
    if arr.ndim == 3 and arr.shape[-1] == 4:
        arr = arr[..., :3]
    img = Image.fromarray(arr)
    if img.width > max_width:
        img = img.resize((max_width, max(1, round(img.height * max_width / img.width))))
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, format="PNG", optimize=False)
    else:
        img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class _Tile:
    """One env worker's view."""

    def __init__(self, rank: int, fmt: str, width: str):
        self.rank = rank
        self.image = widgets.Image(format=fmt, layout=widgets.Layout(width=width, height="auto"))
        self.caption = widgets.HTML(f"<small>env {rank}: waiting for a frame</small>")
        self.box = widgets.VBox([self.image, self.caption])
        self.key: Any = None  # env_steps of the shown frame
        self.shown_at: float | None = None
        self.fps = 0.0
        self.frames = 0

    def caption_html(self, now: float) -> str:
        age = now - self.shown_at if self.shown_at is not None else float("nan")
        return (f"<small>env {self.rank} · {self.fps:.1f} fps · frame age {age:.1f} s · "
                f"env step {self.key}</small>")  # fmt: skip


class RolloutTile(widgets.VBox):
    """Newest frames of a run's env workers."""

    def __init__(self, fmt: str = "jpeg", width: str = "320px", max_tiles: int = 4, enabled: bool = True):
        self.fmt = fmt
        self.width = width
        self.max_tiles = max_tiles
        self.enabled = enabled
        self.tiles: dict[int, _Tile] = {}
        self.hint = widgets.HTML(
            "<small><i>no frames: launch with <code>env__render_every=N</code> (an env with an rgb_array "
            "render, e.g. <code>rlinf_nb.widgets.CARTPOLE_WITH_FRAMES</code>)</i></small>"
        )
        self.grid = widgets.HBox([], layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__([widgets.HTML("<b>rollout</b>"), self.grid, self.hint])

    def update(self, frames: dict[int, dict[str, Any]], now: float | None = None) -> bool:
        """Show new frames; True when an image went to the page."""
        now = time.monotonic() if now is None else now
        sent = False
        for rank in sorted(frames)[: self.max_tiles]:
            item = frames[rank]
            tile = self.tiles.get(rank)
            if tile is None:
                tile = self.tiles[rank] = _Tile(rank, self.fmt, self.width)
                self.grid.children = [t.box for t in self.tiles.values()]
                self.hint.value = ""
            key = item.get("env_steps")
            if key == tile.key and tile.image.value:
                continue
            tile.image.value = encode_frame(item["frame"], self.fmt)
            if tile.shown_at is not None:
                dt = max(now - tile.shown_at, 1e-3)
                tile.fps = 0.8 * tile.fps + 0.2 * (1.0 / dt) if tile.frames > 1 else 1.0 / dt
            tile.key, tile.shown_at = key, now
            tile.frames += 1
            sent = True
        for tile in self.tiles.values():
            if tile.shown_at is not None and now - tile.shown_at > 2.0:
                tile.fps = 0.0
            tile.caption.value = tile.caption_html(now) if tile.shown_at is not None else tile.caption.value
        return sent

    @property
    def image(self) -> widgets.Image | None:
        """The first env worker's Image (None before any frame)."""
        return self.tiles[min(self.tiles)].image if self.tiles else None

    def close(self) -> None:
        for t in self.tiles.values():
            for w in (t.image, t.caption, t.box):
                w.close()
        for w in (self.hint, self.grid, *self.children):
            w.close()
        super().close()


__all__ = ["JPEG_MAGIC", "PNG_MAGIC", "RolloutTile", "encode_frame"]
