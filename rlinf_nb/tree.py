"""Trees of arrays: observations that are one array or a dict of arrays (camera images + state).

A *tree* is a leaf (a numpy array, a torch tensor, anything that is not a mapping) or a
mapping whose values are trees, such as ManiSkill's ``obs_mode="rgb"`` observations
``{"state": float32 [N, D], "rgb_base_camera": uint8 [N, H, W, 3]}``. A bare array is a
one-leaf tree, so code written with these functions handles array observations exactly
as before: ``map(fn, x)`` is ``fn(x)`` for an array ``x``.

Shape contract: the leaves of a batched tree share their leading dims (``[N, ...]`` for
one step of ``N`` envs, ``[T, N, ...]`` for a rollout); :func:`batch_shape` checks it and
names the first leaf that breaks it. Dtypes are never changed here (``uint8`` images stay
``uint8``; convert where the data is used, e.g. in the policy's encoder).

    >>> import numpy as np
    >>> obs = {"rgb": np.zeros((2, 4, 4, 3), np.uint8), "state": np.ones((2, 5), np.float32)}
    >>> batch_shape(obs)
    (2,)
    >>> rollout = stack([obs, obs, obs])  # [T=3, N=2, ...]
    >>> {k: (v.shape, v.dtype.name) for k, v in rollout.items()}
    {'rgb': ((3, 2, 4, 4, 3), 'uint8'), 'state': ((3, 2, 5), 'float32')}
    >>> index(flatten_lead(rollout), [0, 5])["state"].shape
    (2, 5)
    >>> map(lambda a: a * 2, np.arange(3))  # an array is a tree with one leaf
    array([0, 2, 4])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "assign",
    "batch_shape",
    "batch_size",
    "concatenate",
    "flatten_lead",
    "index",
    "is_dict",
    "items",
    "leaves",
    "map",
    "stack",
    "where",
    "zeros",
]

SEP = "/"  # joins the keys of nested leaves in :func:`items` ("obs/rgb_base_camera")


def is_dict(tree: Any) -> bool:
    """Whether ``tree`` is a mapping (a dict observation), not a single leaf."""
    return isinstance(tree, Mapping)


def map(fn: Callable[..., Any], *trees: Any, path: str = "") -> Any:  # noqa: A001 - tree.map, as in jax
    """``fn(leaf, *matching_leaves)`` for every leaf; the result has the first tree's structure.

    Raises:
        ValueError: the trees do not have the same keys (names the path where they differ).
    """
    first = trees[0]
    if not is_dict(first):
        for other in trees[1:]:
            if is_dict(other):
                raise ValueError(f"tree: {path or 'the root'} is a leaf in one tree and a dict in another")
        return fn(*trees)
    for other in trees[1:]:
        if not is_dict(other) or set(other) != set(first):
            have = sorted(other) if is_dict(other) else "a leaf"
            raise ValueError(f"tree: keys differ at {path or 'the root'}: {sorted(first)} vs {have}")
    return {k: map(fn, *(t[k] for t in trees), path=_join(path, k)) for k in first}


def items(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs in key order; paths join keys with ``/`` (a bare leaf: ``prefix``)."""
    if not is_dict(tree):
        return [(prefix, tree)]
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        out += items(value, _join(prefix, key))
    return out


def leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree``, in key order."""
    return [leaf for _, leaf in items(tree)]


def batch_shape(tree: Any, ndim: int = 1) -> tuple[int, ...]:
    """The leading ``ndim`` dims that every leaf shares (``(N,)``, or ``(T, N)`` with ``ndim=2``).

    Raises:
        ValueError: a leaf has fewer dims, or its leading dims differ from the first leaf's.
    """
    found: tuple[int, ...] | None = None
    first_path = ""
    for path, leaf in items(tree):
        shape = tuple(np.shape(leaf))
        name = path or "the observation"
        if len(shape) < ndim:
            raise ValueError(f"tree: {name} has shape {shape}, expected at least {ndim} leading dims")
        if found is None:
            found, first_path = shape[:ndim], name
        elif shape[:ndim] != found:
            raise ValueError(
                f"tree: {name} has leading dims {shape[:ndim]}, but {first_path} has {found}: "
                "every leaf of a batch needs the same leading dims"
            )
    if found is None:
        raise ValueError("tree: an empty dict has no batch shape")
    return found


def batch_size(tree: Any) -> int:
    """The shared leading dim ``N`` of every leaf."""
    return batch_shape(tree, 1)[0]


def index(tree: Any, idx: Any) -> Any:
    """``leaf[idx]`` for every leaf (numpy or torch; ``idx`` an int, slice, mask or index array)."""
    return map(lambda a: a[idx], tree)


def assign(dst: Any, idx: Any, src: Any) -> None:
    """``dst_leaf[idx] = src_leaf`` for every leaf, in place (``dst`` must be a dict or an array)."""

    def put(d: Any, s: Any) -> None:
        d[idx] = s

    map(put, dst, src)


def zeros(like: Any, lead: Sequence[int] = ()) -> Any:
    """Numpy zeros shaped ``(*lead, *leaf.shape)`` with each leaf's dtype (storage for a rollout)."""
    lead = tuple(int(n) for n in lead)
    return map(lambda a: np.zeros(lead + np.shape(a), np.asarray(a).dtype), like)


def stack(trees: Sequence[Any], axis: int = 0) -> Any:
    """Stack matching trees along a new ``axis`` (numpy or torch leaves)."""
    return map(lambda *parts: _lib(parts[0]).stack(parts, axis), *trees)


def concatenate(trees: Sequence[Any], axis: int = 0) -> Any:
    """Concatenate matching trees along ``axis`` (numpy or torch leaves)."""
    if not trees:
        raise ValueError("tree.concatenate: nothing to concatenate")

    def cat(*parts: Any) -> Any:
        lib = _lib(parts[0])
        return lib.cat(parts, axis) if lib is not np else np.concatenate(parts, axis=axis)

    return map(cat, *trees)


def where(mask: Any, a: Any, b: Any) -> Any:
    """Per row: ``a`` where ``mask[N]`` is true, else ``b``; the mask broadcasts over each leaf's trailing dims."""
    mask = np.asarray(mask, bool)

    def pick(x: Any, y: Any) -> Any:
        x = np.asarray(x)
        return np.where(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x, y)

    return map(pick, a, b)


def flatten_lead(tree: Any, n: int = 2) -> Any:
    """Merge the leading ``n`` dims of every leaf: ``[T, N, ...] -> [T*N, ...]`` (numpy or torch)."""
    return map(lambda a: a.reshape(-1, *a.shape[n:]), tree)


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}{SEP}{key}" if prefix else str(key)


def _lib(leaf: Any) -> Any:
    """numpy, or torch for tensors (torch is imported only when a tensor is seen)."""
    if type(leaf).__module__.startswith("torch"):
        import torch

        return torch
    return np
