"""The reading side of the dashboard's frames: peek at a run's ``frames`` channel, decode, skip what the caller has.

Env workers put their newest camera frames under their rank and their last finished episode under
``episode/<rank>`` (:mod:`.frames`); the channel keeps only the newest of each. The reader runs in
the client (the notebook kernel) and talks to the channel actor directly, so polling frames costs
the run's controller nothing (it would compete with the training loop for its process). It peeks
(never removes), opens an item only when it is new (the envelope's put time says so; the last
decoded item stands in otherwise), decodes ``compression.frames`` blobs per camera (a camera whose
delta lost its reference shows its last good frame) and leaves out what the caller says it already
shows.
"""

from __future__ import annotations

from typing import Any

import ray

from .channel import Channel, _Envelope, from_wire
from .compression import ObsDecoder
from .frames import episode_key

__all__ = ["FrameReader"]


def _open(env: _Envelope) -> Any:
    payload = ray.get(env.ref[0]) if env.ref is not None else env.inline
    return from_wire(payload, as_torch=False)


class FrameReader:
    """Newest frames and episodes of a run's env workers, read from its ``frames`` channel.

    Args:
        channel: the run's ``frames`` channel (``RunController.frames_channel``).
        num_workers: how many env workers put frames on it (ranks ``0 .. num_workers - 1``).
    """

    def __init__(self, channel: Channel, num_workers: int) -> None:
        self.channel = channel
        self.ranks = range(int(num_workers))
        self.decoder = ObsDecoder(drop_missing=True)  # compression.frames, one stream per (rank, camera)
        self.last_good: dict[tuple[int, str], Any] = {}
        self._frames: dict[int, tuple[float, dict[str, Any]]] = {}  # rank -> (put time, decoded item)
        self._episodes: dict[int, tuple[float, dict[str, Any]]] = {}

    def _latest(self, keys: list[Any]) -> list[_Envelope | None]:
        return ray.get([self.channel._actor.latest.remote(k) for k in keys])  # one round trip for all ranks

    def frames(self, since: dict[int, int] | None = None) -> dict[int, Any]:
        """``{rank: {"cameras": {name: HxWxC uint8}, "frame": first camera, "env_steps", "time", ...}}``.

        ``since``: ``{rank: env_steps}`` the caller already shows; those ranks are left out while unchanged.
        """
        since = since or {}
        out = {}
        for rank, env in zip(self.ranks, self._latest(list(self.ranks)), strict=True):
            if env is None:
                continue
            cached = self._frames.get(rank)
            if cached is None or cached[0] != env.put_time:
                item = self._decode(rank, _open(env))
                if item is None:
                    continue
                cached = self._frames[rank] = (env.put_time, item)
            item = cached[1]
            if since.get(rank) != item["env_steps"]:
                out[rank] = item
        return out

    def _decode(self, rank: int, item: dict[str, Any]) -> dict[str, Any] | None:
        cameras = item.get("cameras")
        if cameras is None:  # an item with one unnamed frame
            cameras = {"render": item["frame"]}
        decoded = {}
        for name, value in cameras.items():
            frame = self.decoder.decode({name: value}, rank)
            frame = frame[name] if frame is not None else self.last_good.get((rank, name))
            if frame is not None:
                decoded[name] = self.last_good[(rank, name)] = frame
        if not decoded:
            return None
        return {**item, "cameras": decoded, "frame": next(iter(decoded.values()))}

    def episode(self, since: str | None = None) -> dict[str, Any] | None:
        """The newest finished episode of any env worker (``cameras``: ``{name: [T, h, w, C] uint8}``),
        or None when there is none or its ``id`` is ``since``."""
        envs = self._latest([episode_key(r) for r in self.ranks])
        found = [
            (env.put_time, rank, env) for rank, env in zip(self.ranks, envs, strict=True) if env is not None
        ]
        if not found:
            return None
        put_time, rank, env = max(found, key=lambda f: f[0])
        cached = self._episodes.get(rank)
        if cached is None or cached[0] != put_time:
            cached = self._episodes[rank] = (put_time, _open(env))
        item = cached[1]
        return None if item.get("id") == since else item
