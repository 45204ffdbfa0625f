"""Feature specs for recorded datasets, and per-frame conversion to what LeRobot expects.

A *feature* is LeRobot's dict ``{"dtype": ..., "shape": (...), "names": ...}``. :func:`image` and
:func:`vector` build the common ones. The Recorder adds the RL flags below (LeRobot's own names,
so LeRobot's RL tools read them too) and accepts the short aliases in frames::

    frame = {"observation.state": s, "observation.images.front": rgb, "action": a,
             "reward": r, "done": d, "success": ok, "intervention": human}

Scalars are stored with shape ``(1,)`` (LeRobot's convention) and read back as 0-d values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "DONE",
    "FLAG_ALIASES",
    "INTERVENTION",
    "REWARD",
    "SUCCESS",
    "VISUAL_DTYPES",
    "convert_frame",
    "image",
    "normalize_features",
    "vector",
]

REWARD = "next.reward"
DONE = "next.done"
SUCCESS = "next.success"
INTERVENTION = "complementary_info.is_intervention"

#: short frame keys accepted by ``Recorder.add_frame`` -> (feature name, LeRobot feature)
FLAG_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "reward": (REWARD, {"dtype": "float32", "shape": (1,), "names": None}),
    "done": (DONE, {"dtype": "bool", "shape": (1,), "names": None}),
    "success": (SUCCESS, {"dtype": "bool", "shape": (1,), "names": None}),
    "intervention": (INTERVENTION, {"dtype": "bool", "shape": (1,), "names": None}),
}

VISUAL_DTYPES = ("image", "video")
_NUMERIC_DTYPES = ("float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
# LeRobot adds these itself; a user feature may not use the names.
_RESERVED = ("timestamp", "frame_index", "episode_index", "index", "task_index", "task")


def image(height: int, width: int, *, video: bool = False) -> dict[str, Any]:
    """An ``HxWx3`` uint8 camera image feature (stored as PNG in parquet, or as video frames)."""
    return {
        "dtype": "video" if video else "image",
        "shape": (int(height), int(width), 3),
        "names": ["height", "width", "channels"],
    }


def vector(size: int, names: list[str] | None = None, dtype: str = "float32") -> dict[str, Any]:
    """A 1-d numeric feature (state, action), optionally with one name per element."""
    if names is not None and len(names) != int(size):
        raise ValueError(f"vector: got {len(names)} names for size {size}; give one name per element")
    return {"dtype": dtype, "shape": (int(size),), "names": list(names) if names is not None else None}


def normalize_features(
    features: Mapping[str, Any],
    *,
    video: bool,
    vcodec: str,
    flags: Mapping[str, bool],
) -> dict[str, dict[str, Any]]:
    """Validate user features and return LeRobot features (shapes as tuples), flags added.

    Args:
        features: name -> LeRobot feature dict, or a bare shape tuple (a float32 array).
        video: store every ``image`` feature as ``video`` instead.
        vcodec: the video codec (checked against the image sizes it can encode).
        flags: which of ``reward/done/success/intervention`` to add as features.

    Raises:
        ValueError: naming the feature and what is wrong with it.
    """
    if not isinstance(features, Mapping):
        raise ValueError(f"features: expected a mapping name -> feature, got {type(features).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in features.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"features: bad name {name!r}; use a non-empty string without '/'")
        if name in _RESERVED:
            raise ValueError(f"features: {name!r} is reserved by LeRobot; reserved: {', '.join(_RESERVED)}")
        if isinstance(spec, tuple | list):
            spec = {"dtype": "float32", "shape": tuple(spec), "names": None}
        if not isinstance(spec, Mapping) or "dtype" not in spec or "shape" not in spec:
            raise ValueError(
                f"features[{name!r}]: expected {{'dtype': ..., 'shape': (...)}} or a shape tuple, got {spec!r}"
            )
        dtype = str(spec["dtype"])
        shape = tuple(int(s) for s in spec["shape"])
        if dtype not in (*VISUAL_DTYPES, *_NUMERIC_DTYPES):
            allowed = ", ".join((*VISUAL_DTYPES, *_NUMERIC_DTYPES))
            raise ValueError(f"features[{name!r}]: dtype {dtype!r} is not supported; allowed: {allowed}")
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"features[{name!r}]: shape {shape} must be non-empty with sizes >= 1")
        if dtype in VISUAL_DTYPES:
            if len(shape) != 3 or shape[2] != 3:
                # LeRobot's stats and tools assume 3 channels (per-channel stats of shape (3, 1, 1)).
                raise ValueError(f"features[{name!r}]: image shape {shape} must be (height, width, 3)")
            if video:
                dtype = "video"
            if dtype == "video":
                _check_video_size(name, shape, vcodec)
        names = spec.get("names")
        out[name] = {"dtype": dtype, "shape": shape, "names": names}
    for alias, on in flags.items():
        feat_name, feat = FLAG_ALIASES[alias]
        if on and feat_name not in out:
            out[feat_name] = dict(feat)
    if not out:
        raise ValueError("features: no features given")
    return out


def _check_video_size(name: str, shape: tuple[int, ...], vcodec: str) -> None:
    h, w = shape[0], shape[1]
    if vcodec == "libsvtav1" and min(h, w) < 32:
        # SVT-AV1 (through PyAV) kills the whole process with SIGFPE below ~26 px; seen here.
        raise ValueError(
            f"features[{name!r}]: {h}x{w} is too small for vcodec 'libsvtav1' (needs >= 32 px a side, "
            "it crashes the process below that); use vcodec='h264', a larger image, or video=False"
        )
    if vcodec == "h264" and (h % 2 or w % 2):
        raise ValueError(f"features[{name!r}]: h264 (yuv420p) needs even height and width, got {h}x{w}")


def convert_frame(frame: Mapping[str, Any], features: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """One user frame -> LeRobot ``add_frame`` values (numpy, declared dtypes and shapes).

    Aliases (``reward``, ``done``, ...) map to their feature names; omitted flags default to
    ``False``; every other declared feature (reward included) is required.

    Raises:
        ValueError: a missing or unknown key, or a value of the wrong shape or dtype.
    """
    values: dict[str, Any] = {}
    for key, value in frame.items():
        if key == "task":
            continue
        name = FLAG_ALIASES[key][0] if key in FLAG_ALIASES else key
        if name not in features:
            raise ValueError(
                f"add_frame: unknown key {key!r}; declared features: {', '.join(sorted(features))}"
            )
        if name in values:
            raise ValueError(f"add_frame: {key!r} given twice (as the alias and as {name!r})")
        values[name] = value
    out: dict[str, Any] = {}
    for name, feat in features.items():
        if name not in values:
            if feat["dtype"] == "bool" and name in (DONE, SUCCESS, INTERVENTION):
                out[name] = np.zeros(feat["shape"], dtype=bool)
                continue
            raise ValueError(
                f"add_frame: missing feature {name!r} (declared {feat['dtype']} {feat['shape']})"
            )
        value = values[name]
        if hasattr(value, "detach"):  # torch tensor
            value = value.detach().cpu().numpy()
        if feat["dtype"] in VISUAL_DTYPES:
            out[name] = _convert_image(name, value, feat["shape"])
        else:
            arr = np.asarray(value)
            if arr.size != int(np.prod(feat["shape"])):
                raise ValueError(
                    f"add_frame: {name!r} has shape {arr.shape}; the feature's shape is {feat['shape']}"
                )
            if feat["dtype"] == "bool" and arr.dtype != bool:
                if not np.isin(arr, (0, 1)).all():
                    raise ValueError(f"add_frame: {name!r} is a bool feature, got {arr.tolist()!r}")
            out[name] = arr.astype(feat["dtype"], copy=False).reshape(feat["shape"])
    return out


def _convert_image(name: str, value: Any, shape: tuple[int, int, int]) -> np.ndarray:
    arr = np.asarray(value)
    h, w, c = shape
    if arr.shape == (c, h, w) and arr.shape != (h, w, c):
        arr = np.moveaxis(arr, 0, -1)
    if arr.shape != (h, w, c):
        raise ValueError(f"add_frame: image {name!r} has shape {arr.shape}; expected {(h, w, c)} (HWC)")
    if arr.dtype != np.uint8:
        raise ValueError(f"add_frame: image {name!r} has dtype {arr.dtype}; expected uint8")
    return np.ascontiguousarray(arr)
