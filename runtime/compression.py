"""Lossless compression of what env workers send: observations to the rollout workers, frames to the UI.

A run's ``compression:`` section turns it on per channel (``obs``, ``frames``). The sender keeps one
:class:`~rlinf_nb.codec.FrameEncoder` per array it sends (per observation key), so every stream is
delta-coded against its own previous frame; arrays smaller than ``min_bytes`` (state vectors) go
as they are. Receivers keep one :class:`~rlinf_nb.codec.FrameDecoder` per (sender, key): blobs are
self-describing, so the receiver needs no config. Bit-exact: the policy sees exactly the arrays
the env produced.

A receiver that missed blobs (the ``frames`` channel drops the oldest under load) gets
:class:`~rlinf_nb.codec.MissingFrameError` until the sender's next keyframe; :class:`ObsDecoder`
turns that into ``None`` for the frame stream (the UI keeps its last frame), and raises on the
obs path, where nothing may be lost. A restarted env worker starts new streams (new ids, a
keyframe first), which decoders follow without a reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf_nb.codec import CodecConfig, FrameDecoder, FrameEncoder, MissingFrameError
from rlinf_nb.config import param

__all__ = ["ChannelCompression", "CompressionConfig", "Encoded", "ObsDecoder", "ObsEncoder"]


@dataclass
class ChannelCompression:
    """Compression of one channel's arrays (off by default)."""

    enabled: bool = param(False, doc="encode arrays with rlinf_nb.codec before sending")
    min_bytes: int = param(4096, doc="arrays smaller than this are sent as they are", range=(0, None))
    codec: CodecConfig = param(
        factory=CodecConfig, doc="how each stream is coded (back end, level, keyframes)"
    )


def _frames_default() -> ChannelCompression:
    # The frames channel keeps only the newest frame and the dashboard peeks at it at its own rate, so a
    # delta's reference is usually never seen there: every frame a keyframe (left delta + zstd) by default.
    return ChannelCompression(codec=CodecConfig(keyframe_interval=1))


@dataclass
class CompressionConfig:
    """Which env-worker channels compress (lossless, per-stream delta coding)."""

    obs: ChannelCompression = param(
        factory=ChannelCompression, doc="observations sent to the rollout workers (images benefit most)"
    )
    frames: ChannelCompression = param(factory=_frames_default, doc="rollout frames sent to the dashboard")


@dataclass(frozen=True)
class Encoded:
    """One array as a codec blob (what travels instead of the array)."""

    blob: bytes


class ObsEncoder:
    """The sending side: an array or a dict of arrays in, the same structure with :class:`Encoded` leaves out."""

    def __init__(self, cfg: ChannelCompression | None):
        self.cfg = cfg
        self.enabled = bool(cfg is not None and cfg.enabled)
        self._encoders: dict[str, FrameEncoder] = {}
        self.raw_bytes = 0  # of the arrays that were encoded
        self.sent_bytes = 0  # their blobs

    def restart(self) -> None:
        """Make every stream's next blob a keyframe (at each rollout's start: a rollout that was
        aborted half-way, its last blobs never decoded, cannot leave a receiver out of step)."""
        for encoder in self._encoders.values():
            encoder.force_keyframe()

    def encode(self, obs: Any) -> Any:
        if not self.enabled or obs is None:
            return obs
        if isinstance(obs, dict):
            return {k: self._leaf(k, v) for k, v in obs.items()}
        return self._leaf("", obs)

    def _leaf(self, key: str, value: Any) -> Any:
        array = np.asarray(value)
        if array.nbytes < self.cfg.min_bytes:
            return value
        encoder = self._encoders.get(key)
        if encoder is None:
            encoder = self._encoders[key] = FrameEncoder(self.cfg.codec)
        blob = encoder.encode(array)
        self.raw_bytes += array.nbytes
        self.sent_bytes += len(blob)
        return Encoded(blob)

    def stats(self) -> dict[str, float]:
        """Bytes of the encoded arrays before and after, and their ratio (sent / raw)."""
        ratio = self.sent_bytes / self.raw_bytes if self.raw_bytes else None
        return {"raw_bytes": float(self.raw_bytes), "sent_bytes": float(self.sent_bytes), "ratio": ratio}


class ObsDecoder:
    """The receiving side, for any number of senders; plain (unencoded) values pass through."""

    def __init__(self, drop_missing: bool = False):
        self.drop_missing = drop_missing
        self._decoders: dict[tuple[Any, str], FrameDecoder] = {}

    def decode(self, obs: Any, sender: Any) -> Any:
        """The arrays ``sender`` encoded. With ``drop_missing``, ``None`` where a stream lost its reference."""
        if isinstance(obs, dict):
            out = {k: self._leaf(sender, k, v) for k, v in obs.items()}
            return None if any(v is None for v in out.values()) else out
        return self._leaf(sender, "", obs)

    def _leaf(self, sender: Any, key: str, value: Any) -> Any:
        if not isinstance(value, Encoded):
            return value
        decoder = self._decoders.get((sender, key))
        if decoder is None:
            decoder = self._decoders[(sender, key)] = FrameDecoder()
        try:
            return decoder.decode(value.blob)
        except MissingFrameError:
            if self.drop_missing:
                return None
            raise
