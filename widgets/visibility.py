"""Whether a part of the dashboard is on screen: an invisible widget the page reports on.

Put a :class:`Visibility` inside a box; each view of it on a page watches that box
(``IntersectionObserver``, and whether the browser tab is hidden) and says when it comes on or
goes off screen. The kernel then skips work nobody could see (encoding and sending frames).
Until a page reports, and while any view is on screen, :attr:`Visibility.visible` is True.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget

__all__ = ["Visibility"]


class Visibility(anywidget.AnyWidget):
    """On-screen state of the box holding this widget, as the page's views report it."""

    _esm = (Path(__file__).parent / "visibility.js").read_text()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._views: dict[str, bool] = {}  # view id -> on screen
        self._callbacks: list[Callable[[bool], None]] = []
        self.on_msg(self._on_msg)

    @property
    def visible(self) -> bool:
        """True while any view is on screen, or no view has reported yet (no page: assume seen)."""
        with self._lock:
            return not self._views or any(self._views.values())

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(visible)`` whenever :attr:`visible` changes."""
        self._callbacks.append(callback)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or "view" not in content:
            return
        before = self.visible
        with self._lock:
            if content.get("gone"):
                self._views.pop(str(content["view"]), None)
            else:
                self._views[str(content["view"])] = bool(content.get("visible"))
        after = self.visible
        if after != before:
            for callback in list(self._callbacks):
                callback(after)
