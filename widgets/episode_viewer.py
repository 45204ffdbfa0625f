"""The rollout viewer: the latest finished episode's frames, played with a scrubber.

Env workers keep the frames of env 0's episode sampled every ``env.render_every`` env steps
(downscaled, at most ~200; see ``runtime/frames.py``) and publish them when the episode ends;
``run.latest_episode(since)`` returns the newest one. The viewer JPEG-encodes each frame once,
when the episode arrives, and shows one Image per camera; an ``ipywidgets.Play`` linked to an
``IntSlider`` (on the page, ``jslink``) scrubs through them, each move sending only the already
encoded bytes of the frame it lands on.
"""

from __future__ import annotations

import bisect
import html
from typing import Any

import ipywidgets as widgets

from .media import encode_frame

__all__ = ["EpisodeViewer"]


class EpisodeViewer(widgets.VBox):
    """Play + scrubber over the latest finished episode's frames, one Image per camera."""

    def __init__(self, fmt: str = "jpeg", width: str = "320px", interval_ms: int = 100, quality: int = 75):
        self.fmt = fmt
        self.width = width
        self.quality = quality
        self.episode_id: str | None = None
        self.env_steps: list[int] = []
        self.jpegs: dict[str, list[bytes]] = {}  # camera -> its frames, encoded once
        self.camera_steps: dict[str, list[int]] = {}
        self.images: dict[str, widgets.Image] = {}
        # max starts at 1, disabled: the page's slider cannot draw a track with min == max
        self.play = widgets.Play(min=0, max=1, step=1, disabled=True, interval=interval_ms, description="play",
                                 layout=widgets.Layout(width="auto"))  # fmt: skip
        self.slider = widgets.IntSlider(min=0, max=1, disabled=True, description="frame", continuous_update=True,
                                        style={"description_width": "40px"},
                                        layout=widgets.Layout(width="100%"))  # fmt: skip
        self._link = widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.slider.observe(self._on_scrub, "value")
        self.caption = widgets.HTML("<small><i>no finished episode yet</i></small>")
        self.grid = widgets.HBox([], layout=widgets.Layout(flex_flow="row wrap"))
        # the slider on its own row: next to the Play buttons a narrow column leaves its track no room
        controls = widgets.VBox([self.slider, self.play], layout=widgets.Layout(width="100%"))
        super().__init__([widgets.HTML("<b>last episode</b>"), self.grid, controls, self.caption])

    @property
    def frame_count(self) -> int:
        return len(self.env_steps)

    def show(self, episode: dict[str, Any] | None) -> bool:
        """Show ``episode`` (from ``run.latest_episode()``) unless it is the one shown; True when shown."""
        if not episode or episode.get("id") == self.episode_id:
            return False
        cameras = episode.get("cameras") or {}
        if not cameras:
            return False
        jpegs = {
            name: [encode_frame(f, self.fmt, self.quality) for f in frames]
            for name, frames in cameras.items()
        }
        steps = [int(s) for s in episode.get("env_steps") or range(max(len(j) for j in jpegs.values()))]
        cam_steps = episode.get("camera_env_steps") or {}
        self.camera_steps = {name: [int(s) for s in cam_steps.get(name, steps)] for name in jpegs}
        self.jpegs, self.env_steps, self.episode_id = jpegs, steps, episode.get("id")
        for name in jpegs:
            if name not in self.images:
                self.images[name] = widgets.Image(
                    format=self.fmt, layout=widgets.Layout(width=self.width, height="auto")
                )
        self.grid.children = [self._labelled(name) for name in jpegs]
        last = max(len(steps) - 1, 0)
        self.play.value = self.slider.value = 0  # before the max shrinks (which would move it)
        self.slider.max = self.play.max = max(last, 1)  # a one-frame episode: index 1 shows frame 0 too
        self.slider.disabled = self.play.disabled = False
        self._show_index(0)
        self.caption.value = self._caption(episode)
        return True

    def _labelled(self, name: str) -> widgets.Widget:
        return widgets.VBox([self.images[name], widgets.HTML(f"<small>{html.escape(name)}</small>")])

    def _caption(self, ep: dict[str, Any]) -> str:
        bits = [f"episode {html.escape(str(ep.get('id')))} (env worker {ep.get('rank')}, env 0)"]
        if ep.get("episode_return") is not None:
            bits.append(f"return {ep['episode_return']:.3g}")
        if ep.get("episode_length") is not None:
            bits.append(f"{ep['episode_length']} steps")
        if ep.get("success") is not None:
            bits.append("success" if ep["success"] else "no success")
        bits.append(f"{self.frame_count} frames")
        return f"<small>{' · '.join(bits)}</small>"

    def _on_scrub(self, change: dict[str, Any]) -> None:
        self._show_index(int(change["new"]))

    def _show_index(self, i: int) -> None:
        if not self.env_steps:
            return
        i = min(max(i, 0), len(self.env_steps) - 1)
        step = self.env_steps[i]
        for name, frames in self.jpegs.items():
            # a camera sampled less often shows its newest frame at or before this step
            j = max(bisect.bisect_right(self.camera_steps[name], step) - 1, 0)
            self.images[name].value = frames[min(j, len(frames) - 1)]

    def close(self) -> None:
        self._link.close()
        for w in (*self.images.values(), self.play, self.slider, self.caption, self.grid, *self.children):
            w.close()
        super().close()
