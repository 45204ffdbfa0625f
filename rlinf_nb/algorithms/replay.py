"""Replay buffers for off-policy learners: a numpy ring buffer and 50/50 demo mixing (RLPD).

A transition is a mapping of fields with one leading batch dim ``[n, ...]``, for example
``{"obs": [n, O], "actions": [n, A], "rewards": [n], "next_obs": [n, O], "terminated": [n]}``.
A field may itself be a mapping (dict observations: ``{"obs": {"rgb": [n, H, W, 3],
"state": [n, S]}}``); nested fields are stored flat under ``"obs/rgb"`` and come back
nested. Keys may hold ``/`` themselves (robot camera paths such as ``cams/front``): in the
flat name it is escaped as ``%2F`` (``"obs/cams%2Ffront"``, ``%`` as ``%25``). Storage is
allocated on the first :meth:`ReplayBuffer.extend`, with the shapes and dtypes of that data
(images stay ``uint8``).

Memory: every field is stored once per transition, ``obs`` and ``next_obs`` both, so a
transition with one ``H x W x 3`` uint8 camera and an ``S``-float state costs about
``2 * (3 H W + 4 S) + 4 A + 8`` bytes: ~24.7 KB at 64 x 64 (2.5 GB per 100k transitions),
~1.6 KB at 16 x 16. The arrays are allocated with ``np.empty``, so the operating system
commits pages only as the buffer fills.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["MixedReplay", "ReplayBuffer", "flatten_fields", "unflatten_fields"]

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


class ReplayBuffer:
    """A fixed-capacity FIFO ring buffer of transitions in preallocated numpy arrays.

    Args:
        capacity: the most transitions kept; once full, the oldest are overwritten.
    """

    def __init__(self, capacity: int):
        if int(capacity) < 1:
            raise ValueError(f"ReplayBuffer: capacity must be >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.pos = 0  # next slot to write
        self.size = 0
        self.data: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.size

    @property
    def fields(self) -> list[str]:
        return sorted(self.data) if self.data is not None else []

    def _allocate(self, flat: Mapping[str, np.ndarray]) -> None:
        self.data = {k: np.empty((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in flat.items()}

    def extend(self, transitions: Mapping[str, Any]) -> int:
        """Append ``n`` transitions (every field ``[n, ...]``); returns ``n``.

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
        assert self.data is not None
        if set(flat) != set(self.data):
            raise ValueError(
                f"ReplayBuffer.extend: fields {sorted(flat)} differ from the buffer's {sorted(self.data)}"
            )
        for k, v in flat.items():
            if v.shape[1:] != self.data[k].shape[1:]:
                raise ValueError(
                    f"ReplayBuffer.extend: field {k!r} has per-item shape {v.shape[1:]}, "
                    f"the buffer stores {self.data[k].shape[1:]}"
                )
        if n == 0:
            return 0
        if n >= self.capacity:  # only the newest `capacity` survive
            start = self.pos + n - self.capacity
            flat = {k: v[n - self.capacity :] for k, v in flat.items()}
            self.pos = start % self.capacity
            m = self.capacity
        else:
            m = n
        idx = (self.pos + np.arange(m)) % self.capacity
        for k, v in flat.items():
            self.data[k][idx] = v
        self.pos = (self.pos + m) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return n

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """``batch_size`` slot indices drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty")
        return rng.integers(0, self.size, size=int(batch_size))

    def gather(self, idx: np.ndarray) -> dict[str, Any]:
        """The transitions in slots ``idx`` (nested like the input; copies)."""
        assert self.data is not None
        return unflatten_fields({k: v[idx] for k, v in self.data.items()})

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        """``batch_size`` transitions drawn uniformly with replacement, as numpy arrays."""
        return self.gather(self.sample_indices(batch_size, rng))

    def ordered(self) -> dict[str, np.ndarray]:
        """All stored transitions, oldest first (flat field names)."""
        if self.data is None:
            return {}
        start = self.pos if self.size == self.capacity else 0
        idx = (start + np.arange(self.size)) % self.capacity
        return {k: v[idx] for k, v in self.data.items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the buffer exactly: the occupied slots as stored, and the write position."""
        data = {} if self.data is None else {k: v[: self.size].copy() for k, v in self.data.items()}
        return {"capacity": self.capacity, "size": self.size, "pos": self.pos, "data": data}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`.

        With the same capacity the slots come back as they were, so sampling with the same
        generator state draws the same transitions. With another capacity the data is
        re-appended oldest first (the newest ``capacity`` kept).
        """
        self.pos, self.size, self.data = 0, 0, None
        data = state["data"]
        if not data:
            return
        size, pos = int(state["size"]), int(state["pos"])
        if int(state["capacity"]) == self.capacity:
            self._allocate(data)
            assert self.data is not None
            for k, v in data.items():
                self.data[k][:size] = v
            self.size, self.pos = size, pos
            return
        start = pos if size == int(state["capacity"]) else 0
        idx = (start + np.arange(size)) % size
        self.extend(unflatten_fields({k: v[idx] for k, v in data.items()}))


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
