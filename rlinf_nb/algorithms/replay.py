"""Replay buffers for off-policy learners: a numpy ring buffer and 50/50 demo mixing (RLPD).

A transition is a mapping of fields with one leading batch dim ``[n, ...]``, for example
``{"obs": [n, O], "actions": [n, A], "rewards": [n], "next_obs": [n, O], "terminated": [n]}``.
A field may itself be a mapping (dict observations: ``{"obs": {"rgb": [n, H, W, 3],
"state": [n, S]}}``); nested fields are stored flat under ``"obs/rgb"`` and come back
nested. Keys may hold ``/`` themselves (robot camera paths such as ``cams/front``): in the
flat name it is escaped as ``%2F`` (``"obs/cams%2Ffront"``, ``%`` as ``%25``). Storage is
allocated on the first :meth:`ReplayBuffer.extend`, with the shapes and dtypes of that data
(images stay ``uint8``).

Memory: every field is stored once per transition, ``obs`` and ``next_obs`` both, except the
image frames of ``next_obs``: within a collected segment a transition's next frame is the next
transition's ``obs`` frame, so it is kept as a link (checked byte for byte when stored) and only
the frames that appear nowhere else (an episode's last, a segment's last row) are copies. A
transition with one ``H x W x 3`` uint8 camera and an ``S``-float state costs about
``(1 + f) 3 H W + 8 S + 4 A + 16`` bytes, ``f`` the share of own next frames (``1 / T`` for
segments of ``T`` steps, plus episode ends): ~14 KB at 64 x 64 with ``T = 8`` (1.4 GB per 100k
transitions; 2.5 GB when every next frame is a copy). The arrays are allocated with ``np.empty``,
so the operating system commits pages only as the buffer fills.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MixedReplay", "ReplayBuffer", "flatten_fields", "segment_successors", "unflatten_fields"]

_SEP = "/"


def _escape(key: Any) -> str:
    return str(key).replace("%", "%25").replace(_SEP, "%2F")


def _unescape(part: str) -> str:
    return part.replace("%2F", _SEP).replace("%25", "%")


def flatten_fields(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """``{"obs": {"rgb": x, "cams/front": y}}`` -> ``{"obs/rgb": x, "obs/cams%2Ffront": y}`` (numpy values)."""
    out: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{_SEP}{_escape(key)}" if prefix else _escape(key)
        if isinstance(value, Mapping):
            out.update(flatten_fields(value, name))
        else:
            out[name] = np.asarray(value)
    return out


def unflatten_fields(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_fields`."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = (_unescape(p) for p in name.split(_SEP))
        cur = out
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = value
    return out


def segment_successors(lead: tuple[int, ...]) -> np.ndarray | None:
    """For transitions flattened from ``[T, N]`` (``t * N + n``), the index of the one that follows each in
    its env (``t + 1``, same ``n``), or ``-1`` on the last row; ``None`` for a flat ``[n]`` batch.

    A hint for :meth:`ReplayBuffer.extend`: a transition's ``next_obs`` is usually its successor's
    ``obs`` (not where an episode ended, which :meth:`~ReplayBuffer.extend` finds by comparing them).
    """
    if len(lead) != 2:
        return None
    T, N = lead
    succ = np.arange(T * N) + N
    succ[(T - 1) * N :] = -1
    return succ


@dataclass
class _NextFrames:
    """A ``next_obs`` image leaf kept by reference: slot ``i``'s frame is the ``source`` (``obs``) frame in
    slot ``ref[i]`` or, where ``ref[i] < 0``, its own copy ``own[i]``."""

    source: str
    ref: np.ndarray  # [capacity] int64
    own: list[np.ndarray | None]


def _frame_source(name: str) -> str:
    """``next_obs/cams%2Ffront`` -> ``obs/cams%2Ffront`` (``next_obs`` -> ``obs``)."""
    return "obs" + name[len("next_obs") :]


class ReplayBuffer:
    """A fixed-capacity FIFO ring buffer of transitions in preallocated numpy arrays.

    Image leaves of ``next_obs`` (``uint8``, at least 2-D per item, with an ``obs`` twin) are not stored
    again where they equal a later transition's ``obs`` frame (see :meth:`extend`): a transition keeps a
    link to that frame instead, and a copy of its own only where it differs (an episode's last frame,
    the last row of a segment). Samples are the same either way.

    Args:
        capacity: the most transitions kept; once full, the oldest are overwritten.
    """

    def __init__(self, capacity: int):
        if int(capacity) < 1:
            raise ValueError(f"ReplayBuffer: capacity must be >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.pos = 0  # next slot to write
        self.size = 0
        self.data: dict[str, np.ndarray] | None = None  # every field but the linked next_obs frames
        self.next_frames: dict[str, _NextFrames] = {}
        self._own_bytes = 0  # of the next_obs frames kept as copies

    def __len__(self) -> int:
        return self.size

    @property
    def fields(self) -> list[str]:
        return sorted([*self.data, *self.next_frames]) if self.data is not None else []

    def _allocate(self, flat: Mapping[str, np.ndarray]) -> None:
        def framed(name: str, v: np.ndarray) -> bool:
            src = flat.get(_frame_source(name)) if name.split(_SEP)[0] == "next_obs" else None
            return (src is not None and v.dtype == np.uint8 and v.ndim >= 3 and src.dtype == v.dtype
                    and src.shape[1:] == v.shape[1:])  # fmt: skip

        self.next_frames = {k: _NextFrames(_frame_source(k), np.full(self.capacity, -1, np.int64),
                                           [None] * self.capacity)
                            for k, v in flat.items() if framed(k, v)}  # fmt: skip
        self.data = {k: np.empty((self.capacity, *v.shape[1:]), dtype=v.dtype)
                     for k, v in flat.items() if k not in self.next_frames}  # fmt: skip

    def _item_shape(self, name: str) -> tuple[int, ...]:
        assert self.data is not None
        frames = self.next_frames.get(name)
        return self.data[frames.source if frames else name].shape[1:]

    def extend(self, transitions: Mapping[str, Any], next_of: np.ndarray | None = None) -> int:
        """Append ``n`` transitions (every field ``[n, ...]``); returns ``n``.

        ``next_of[i]`` (optional, e.g. :func:`segment_successors`): a later transition of this call whose
        ``obs`` is likely transition ``i``'s ``next_obs`` (``-1``: none). Where the image frames are
        equal, byte for byte, the ``next_obs`` frame is kept as a link to that ``obs`` frame; the
        comparison makes a wrong hint cost memory, never correctness.

        Raises:
            ValueError: the fields' leading dims differ, or the fields (or their trailing
                shapes) are not those of the first call.
        """
        flat = flatten_fields(transitions)
        if not flat:
            return 0
        lengths = {k: (v.shape[0] if v.ndim else -1) for k, v in flat.items()}
        n = next(iter(lengths.values()))
        if n < 0 or any(m != n for m in lengths.values()):
            raise ValueError(f"ReplayBuffer.extend: every field needs the same leading dim n, got {lengths}")
        if self.data is None:
            self._allocate(flat)
        if set(flat) != set(self.fields):
            raise ValueError(
                f"ReplayBuffer.extend: fields {sorted(flat)} differ from the buffer's {self.fields}"
            )
        for k, v in flat.items():
            if v.shape[1:] != self._item_shape(k):
                raise ValueError(
                    f"ReplayBuffer.extend: field {k!r} has per-item shape {v.shape[1:]}, "
                    f"the buffer stores {self._item_shape(k)}"
                )
        if n == 0:
            return 0
        m = min(n, self.capacity)  # only the newest `capacity` survive
        skip = n - m
        if skip:
            self.pos = (self.pos + skip) % self.capacity
        idx = (self.pos + np.arange(m)) % self.capacity
        assert self.data is not None
        for k, v in self.data.items():
            v[idx] = flat[k][skip:]
        successors = None if next_of is None else np.asarray(next_of, np.int64)[skip:] - skip
        for k, frames in self.next_frames.items():
            self._own_bytes += self._write_next_frames(
                frames, flat[k][skip:], flat[frames.source][skip:], idx, successors
            )
        self.pos = (self.pos + m) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return n

    @staticmethod
    def _write_next_frames(frames: _NextFrames, nxt: np.ndarray, src: np.ndarray, idx: np.ndarray,
                           successors: np.ndarray | None) -> int:  # fmt: skip
        """Link each ``nxt`` frame to its successor's ``src`` frame where they are equal, else keep a copy;
        returns the change in the bytes of copies held.

        Only successors at or after the transition itself, in this call: the ring overwrites a linked
        frame only after the transition that links to it.
        """
        m = len(idx)
        ref = np.full(m, -1, np.int64)
        if successors is not None:
            order = np.arange(m)
            cand = np.flatnonzero((successors >= order) & (successors < m))
            if len(cand):
                same = (nxt[cand] == src[successors[cand]]).reshape(len(cand), -1).all(axis=1)
                ref[cand[same]] = idx[successors[cand[same]]]
        frames.ref[idx] = ref
        change = 0
        for k, slot in enumerate(idx):
            old, new = frames.own[slot], (None if ref[k] >= 0 else np.array(nxt[k]))
            frames.own[slot] = new
            change += (new.nbytes if new is not None else 0) - (old.nbytes if old is not None else 0)
        return change

    def _gather_next_frames(self, frames: _NextFrames, idx: np.ndarray) -> np.ndarray:
        assert self.data is not None
        src = self.data[frames.source]
        out = np.empty((len(idx), *src.shape[1:]), src.dtype)
        ref = frames.ref[idx]
        linked = ref >= 0
        out[linked] = src[ref[linked]]
        for b in np.flatnonzero(~linked):
            out[b] = frames.own[idx[b]]
        return out

    def stored_bytes(self) -> int:
        """Bytes of transition data held for the occupied slots (linked frames counted once)."""
        if self.data is None:
            return 0
        return sum(v[: self.size].nbytes for v in self.data.values()) + self._own_bytes

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """``batch_size`` slot indices drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty")
        return rng.integers(0, self.size, size=int(batch_size))

    def _flat_at(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        assert self.data is not None
        out = {k: v[idx] for k, v in self.data.items()}
        out.update({k: self._gather_next_frames(fr, idx) for k, fr in self.next_frames.items()})
        return out

    def gather(self, idx: np.ndarray) -> dict[str, Any]:
        """The transitions in slots ``idx`` (nested like the input; copies)."""
        return unflatten_fields(self._flat_at(idx))

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        """``batch_size`` transitions drawn uniformly with replacement, as numpy arrays."""
        return self.gather(self.sample_indices(batch_size, rng))

    def ordered(self) -> dict[str, np.ndarray]:
        """All stored transitions, oldest first (flat field names)."""
        if self.data is None:
            return {}
        start = self.pos if self.size == self.capacity else 0
        return self._flat_at((start + np.arange(self.size)) % self.capacity)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the buffer exactly: the occupied slots as stored (linked frames as
        links), and the write position."""
        data = {} if self.data is None else {k: v[: self.size].copy() for k, v in self.data.items()}
        next_frames = {}
        for k, fr in self.next_frames.items():
            slots = np.flatnonzero(fr.ref[: self.size] < 0)
            own = (
                np.stack([fr.own[i] for i in slots])
                if len(slots)
                else np.empty((0, *self._item_shape(k)), np.uint8)
            )
            next_frames[k] = {"ref": fr.ref[: self.size].copy(), "own_slots": slots, "own": own}
        return {"capacity": self.capacity, "size": self.size, "pos": self.pos, "data": data,
                "next_frames": next_frames}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (also one written before frames were linked: ``next_obs`` frames
        stored in full under ``data``).

        With the same capacity the slots come back as they were, so sampling with the same
        generator state draws the same transitions. With another capacity the data is
        re-appended oldest first (the newest ``capacity`` kept; ``next_obs`` frames as copies).
        """
        self.pos, self.size, self.data, self.next_frames, self._own_bytes = 0, 0, None, {}, 0
        data = state["data"]
        if not data:
            return
        size, pos = int(state["size"]), int(state["pos"])
        linked = state.get("next_frames") or {}
        if int(state["capacity"]) != self.capacity:
            same = ReplayBuffer(int(state["capacity"]))
            same.load_state_dict(state)
            self.extend(unflatten_fields(same.ordered()))
            return
        self._allocate({**data, **{k: data[_frame_source(k)][:0] for k in linked}})
        assert self.data is not None
        for k, v in data.items():
            if k in self.next_frames:  # written before frames were linked: every frame its own
                self.next_frames[k].own[:size] = [np.array(f) for f in v]
                self._own_bytes += int(v[:size].nbytes)
            else:
                self.data[k][:size] = v
        for k, saved in linked.items():
            fr = self.next_frames[k]
            fr.ref[:size] = saved["ref"]
            for slot, frame in zip(saved["own_slots"], saved["own"], strict=True):
                fr.own[int(slot)] = np.array(frame)
                self._own_bytes += int(frame.nbytes)
        self.size, self.pos = size, pos


class MixedReplay:
    """Sample from several buffers in fixed proportions (RLPD: online and demos 50/50).

    Args:
        buffers: the buffers, e.g. ``[online, demos]``.
        fractions: the share of each batch drawn from each buffer (sums to 1). A buffer that
            is empty gives its share to the others, in proportion to theirs.
    """

    def __init__(self, buffers: Sequence[ReplayBuffer], fractions: Sequence[float]):
        if len(buffers) != len(fractions) or not buffers:
            raise ValueError("MixedReplay: give one fraction per buffer")
        if any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
            raise ValueError(f"MixedReplay: fractions must be >= 0 and sum to 1, got {list(fractions)}")
        self.buffers = list(buffers)
        self.fractions = [float(f) for f in fractions]

    def counts(self, batch_size: int) -> list[int]:
        """How many of ``batch_size`` samples come from each buffer (largest remainders)."""
        w = np.array([f if len(b) else 0.0 for b, f in zip(self.buffers, self.fractions, strict=True)])
        if w.sum() == 0:
            raise ValueError("MixedReplay.sample: every buffer with a nonzero fraction is empty")
        exact = batch_size * w / w.sum()
        out = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - out), kind="stable")[: batch_size - int(out.sum())]:
            out[i] += 1
        return out.tolist()

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        """A batch concatenated from every buffer, in buffer order, as numpy arrays."""
        parts = []
        for buf, n in zip(self.buffers, self.counts(batch_size), strict=True):
            if n:
                parts.append(flatten_fields(buf.sample(n, rng)))
        keys = set(parts[0])
        for p in parts[1:]:
            if set(p) != keys:
                raise ValueError(
                    f"MixedReplay.sample: buffers hold different fields: {sorted(keys)} vs {sorted(p)}"
                )
        return unflatten_fields({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
