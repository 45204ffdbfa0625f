"""The camera tiles: one ``ipywidgets.Image`` per (env worker, camera) with its newest frame.

Frames come from ``run.latest_frames(since)`` (the run keeps only the newest per env worker and
drops the rest; ``since`` leaves out workers whose shown frame is still the newest), are encoded
to JPEG in the kernel and set as the Image's ``bytes`` value, which ipywidgets sends as a binary
buffer (never base64). A frame is sent only when it is new, and the dashboard asks only while the
page keeps up and the tiles are on screen; the caption shows the frame rate seen here and how old
the shown frame is (since the env worker captured it).
"""

from __future__ import annotations

import html
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
    """One camera of one env worker."""

    def __init__(self, rank: int, camera: str, fmt: str, width: str):
        self.rank = rank
        self.camera = camera
        self.image = widgets.Image(format=fmt, layout=widgets.Layout(width=width, height="auto"))
        self.caption = widgets.HTML(f"<small>env {rank} · {html.escape(camera)}: waiting for a frame</small>")
        self.box = widgets.VBox([self.image, self.caption])
        self.key: Any = None  # env_steps of the shown frame
        self.captured: float | None = None  # wall time the env worker captured the shown frame
        self.shown_at: float | None = None
        self.fps = 0.0
        self.frames = 0

    def caption_html(self, now: float, wall: float) -> str:
        age = wall - self.captured if self.captured is not None else now - (self.shown_at or now)
        return (f"<small>env {self.rank} · {html.escape(self.camera)} · {self.fps:.1f} fps · "
                f"frame age {max(age, 0.0):.1f} s · env step {self.key}</small>")  # fmt: skip


class RolloutTile(widgets.VBox):
    """Newest frames of a run's env workers: one tile per (env worker, camera)."""

    def __init__(self, fmt: str = "jpeg", width: str = "320px", max_tiles: int = 8, enabled: bool = True):
        self.fmt = fmt
        self.width = width
        self.max_tiles = max_tiles
        self.enabled = enabled
        self.tiles: dict[tuple[int, str], _Tile] = {}
        self.hint = widgets.HTML(
            "<small><i>no frames: launch with <code>env__render_every=N</code> (an env with an rgb_array "
            "render or cameras, e.g. <code>rlinf_nb.widgets.CARTPOLE_WITH_FRAMES</code>)</i></small>"
        )
        self.grid = widgets.HBox([], layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__([widgets.HTML("<b>cameras</b>"), self.grid, self.hint])

    def since(self) -> dict[int, int]:
        """``{rank: env_steps}`` of the frames shown (what ``run.latest_frames(since)`` may leave out)."""
        out: dict[int, int] = {}
        for (rank, _camera), tile in self.tiles.items():
            if tile.key is not None:
                out[rank] = tile.key if rank not in out else min(out[rank], tile.key)
        return out

    def update(self, frames: dict[int, dict[str, Any]], now: float | None = None) -> bool:
        """Show new frames; True when an image went to the page."""
        now = time.monotonic() if now is None else now
        wall = time.time()
        sent = False
        for rank in sorted(frames):
            item = frames[rank]
            cameras = item.get("cameras") or {"render": item["frame"]}
            for camera, frame in cameras.items():
                tile = self.tiles.get((rank, camera))
                if tile is None:
                    if len(self.tiles) >= self.max_tiles:
                        continue
                    tile = self.tiles[(rank, camera)] = _Tile(rank, camera, self.fmt, self.width)
                    self.grid.children = [t.box for _k, t in sorted(self.tiles.items())]
                    self.hint.value = ""
                key = item.get("env_steps")
                if key == tile.key and tile.image.value:
                    continue  # a stale frame is never resent
                tile.image.value = encode_frame(frame, self.fmt)
                if tile.shown_at is not None:
                    dt = max(now - tile.shown_at, 1e-3)
                    tile.fps = 0.8 * tile.fps + 0.2 * (1.0 / dt) if tile.frames > 1 else 1.0 / dt
                tile.key, tile.shown_at, tile.captured = key, now, item.get("time")
                tile.frames += 1
                sent = True
        for tile in self.tiles.values():
            if tile.shown_at is not None and now - tile.shown_at > 2.0:
                tile.fps = 0.0
            if tile.shown_at is not None:
                tile.caption.value = tile.caption_html(now, wall)
        return sent

    @property
    def image(self) -> widgets.Image | None:
        """The first tile's Image (env worker 0's first camera; None before any frame)."""
        return self.tiles[min(self.tiles)].image if self.tiles else None

    def close(self) -> None:
        for t in self.tiles.values():
            for w in (t.image, t.caption, t.box):
                w.close()
        for w in (self.hint, self.grid, *self.children):
            w.close()
        super().close()


__all__ = ["JPEG_MAGIC", "PNG_MAGIC", "RolloutTile", "encode_frame"]
