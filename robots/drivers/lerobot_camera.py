"""``lerobot`` cameras: OpenCV cameras (USB webcams, ``/dev/video*``, video files) through LeRobot's ``OpenCVCamera``.

    cams/wrist: {kind: camera, driver: lerobot, config: {index_or_path: /dev/video0, width: 640, height: 480}}

Features come from the config (``rgb`` is ``[height, width, 3]`` uint8), so they are readable while
disconnected. ``read()`` waits (up to ``timeout_ms``) for the next frame of LeRobot's background
reader, as LeRobot's own robots do (``async_read``). LeRobot checks on connect that the camera took
the requested size and rate. A missing OpenCV or camera raises DriverUnavailableError saying what to
install or plug in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rlinf_nb.robots.components import Camera, Device
from rlinf_nb.robots.drivers.lerobot import import_lerobot
from rlinf_nb.robots.errors import DriverUnavailableError, RobotError, SpecError
from rlinf_nb.robots.registry import register_driver

CAMERA_TYPES = ("opencv",)
COLOR_MODES = ("rgb", "bgr")
ROTATIONS = (0, 90, 180, -90)
_NO_CV2 = (
    "lerobot driver: OpenCV cameras need OpenCV (Python module 'cv2', not installed); "
    "install it with `uv pip install opencv-python-headless`"
)


@dataclass
class LeRobotCameraConfig:
    """One camera through LeRobot's camera classes."""

    index_or_path: int | str = 0
    """Camera index (0, 1, ...) or a device or video file path (``/dev/video0``); list them with
    ``lerobot-find-cameras opencv``."""
    type: str = "opencv"
    """LeRobot camera type; only ``opencv`` so far."""
    fps: int = 30
    """Frames per second asked of the camera (connect fails if it cannot)."""
    width: int = 640
    """Image width in pixels, after ``rotation``."""
    height: int = 480
    """Image height in pixels, after ``rotation``."""
    color_mode: str = "rgb"
    """Channel order of ``read()["rgb"]``: ``rgb`` (converted from OpenCV's BGR) or ``bgr`` (as captured)."""
    rotation: int = 0
    """Rotate frames by 0, 90, 180 or -90 degrees (90 and -90 swap the captured width and height)."""
    warmup_s: int = 1
    """Seconds of frames read on connect before it returns (0: none); LeRobot's default 1."""
    fourcc: str | None = None
    """Four-character pixel format to ask for (``MJPG`` often allows higher rates); None: the camera's."""
    timeout_ms: float = 200.0
    """How long ``read()`` waits for a new frame before it fails."""

    def __post_init__(self) -> None:
        if self.type not in CAMERA_TYPES:
            raise SpecError(
                f"type: {self.type!r} is not a LeRobot camera type; allowed: {list(CAMERA_TYPES)}"
            )
        if isinstance(self.index_or_path, bool) or not isinstance(self.index_or_path, int | str):
            raise SpecError(f"index_or_path: {self.index_or_path!r} is neither a camera index nor a path")
        if isinstance(self.index_or_path, int) and self.index_or_path < 0:
            raise SpecError(f"index_or_path: {self.index_or_path} is not a camera index (0, 1, ...)")
        if isinstance(self.index_or_path, str) and not self.index_or_path:
            raise SpecError("index_or_path: give a camera index or a path, e.g. /dev/video0")
        for name in ("fps", "width", "height"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"{name}: {value!r} must be a positive integer")
        if self.color_mode not in COLOR_MODES:
            raise SpecError(
                f"color_mode: {self.color_mode!r} is not a colour mode; allowed: {list(COLOR_MODES)}"
            )
        if self.rotation not in ROTATIONS:
            raise SpecError(f"rotation: {self.rotation!r} is not a rotation; allowed: {list(ROTATIONS)}")
        if self.warmup_s < 0:
            raise SpecError(f"warmup_s: {self.warmup_s} must be >= 0")
        if self.fourcc is not None and (not isinstance(self.fourcc, str) or len(self.fourcc) != 4):
            raise SpecError(f"fourcc: {self.fourcc!r} must be four characters, e.g. 'MJPG', or null")
        if not self.timeout_ms > 0:
            raise SpecError(f"timeout_ms: {self.timeout_ms!r} must be > 0")


@register_driver("lerobot")
class LeRobotCamera(Camera):
    """An OpenCV camera through LeRobot's ``OpenCVCamera`` (its capture settings, reader thread and colour conversion)."""

    config_class = LeRobotCameraConfig

    def __init__(self, config: LeRobotCameraConfig, device: Device | None = None):
        super().__init__(config, device)
        self.camera: Any = None  # LeRobot's camera while connected

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.config.height, self.config.width, 3)

    def make_lerobot_camera(self) -> Any:
        """LeRobot's (unconnected) camera object for this config."""
        cfg: LeRobotCameraConfig = self.config
        module = import_lerobot("lerobot.cameras.opencv.camera_opencv", missing={"cv2": _NO_CV2})
        configs = import_lerobot("lerobot.cameras.opencv.configuration_opencv", missing={"cv2": _NO_CV2})
        source = (
            cfg.index_or_path if isinstance(cfg.index_or_path, int) else Path(cfg.index_or_path).expanduser()
        )
        config = configs.OpenCVCameraConfig(
            index_or_path=source,
            fps=cfg.fps,
            width=cfg.width,
            height=cfg.height,
            color_mode=configs.ColorMode(cfg.color_mode),
            rotation=configs.Cv2Rotation(cfg.rotation),
            warmup_s=cfg.warmup_s,
            fourcc=cfg.fourcc,
        )
        return module.OpenCVCamera(config)

    def _connect(self) -> None:
        cfg: LeRobotCameraConfig = self.config
        camera = self.make_lerobot_camera()
        try:
            camera.connect()
        except ConnectionError as exc:
            _release(camera)
            if isinstance(cfg.index_or_path, str) and not os.path.exists(cfg.index_or_path):
                hint = "no such device: plug in the camera's USB cable, or fix index_or_path"
            elif camera.videocapture is None:
                hint = "it did not open (wrong index, or busy in another program?)"
            else:
                hint = "it opened but sent no frames during warmup: check the cable, or try another fourcc"
            raise DriverUnavailableError(
                f"lerobot driver: cannot open camera {cfg.index_or_path!r}: {hint}; "
                "list cameras with `lerobot-find-cameras opencv`"
            ) from exc
        except RuntimeError as exc:  # LeRobot could not set the size or rate
            _release(camera)
            raise RobotError(
                f"lerobot driver: camera {cfg.index_or_path!r} does not take {cfg.width}x{cfg.height} at "
                f"{cfg.fps} fps ({exc}); pick a mode it supports (`lerobot-find-cameras opencv` shows its default)"
            ) from exc
        self.camera = camera

    def _disconnect(self) -> None:
        camera, self.camera = self.camera, None
        if camera is not None:
            _release(camera)

    def _read(self) -> dict[str, np.ndarray]:
        try:
            frame = self.camera.async_read(timeout_ms=self.config.timeout_ms)
        except TimeoutError as exc:
            raise RobotError(
                f"{self._label}: no new frame within {self.config.timeout_ms} ms ({exc}); "
                "check the cable, or lower fps"
            ) from exc
        return {"rgb": np.ascontiguousarray(frame, dtype=np.uint8)}


def _release(camera: Any) -> None:
    """Stop LeRobot's reader thread and release the capture, whatever state connect left them in."""
    if camera.is_connected or camera.thread is not None:
        camera.disconnect()
    elif camera.videocapture is not None:
        camera.videocapture.release()
        camera.videocapture = None


__all__ = ["CAMERA_TYPES", "LeRobotCamera", "LeRobotCameraConfig"]
