"""Channels: the only way data crosses worker groups.

A :class:`Channel` is a named, bounded, keyed FIFO backed by one async Ray actor
(:class:`ChannelActor`, zero CPUs). Producers ``put(key, item)``; consumers
``get(key)`` or ``get_batch(keys)``. A full key blocks its producer (backpressure)
until the timeout, unless the channel was made with ``drop_oldest=True`` (for UI
streams: the newest frame wins). Metrics: depth per key, bytes, put/get waits.

Payloads: numpy arrays travel through Ray's object store. Items larger than
``inline_bytes`` are ``ray.put`` by the producer and only their reference passes
through the channel actor, so the bytes move once, producer → consumer, exactly as
a raw ``ray.put``/``ray.get`` would. Torch tensors are sent as numpy (pickled torch
tensors are ~10× slower through the object store) and rebuilt on ``get``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

INLINE_BYTES = 100 * 1024
MAX_PRODUCERS = 4096  # put-order counters a channel keeps (the least recently used go)


class ChannelTimeout(TimeoutError):
    """A put on a full key or a get on an empty key waited past its timeout."""


# ----------------------------------------------------------------------------- payload wire format


class _TorchLeaf:
    """Marks a tensor that was converted to numpy for the trip."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self):
        return (_TorchLeaf, (self.array,))


def to_wire(obj: Any) -> tuple[Any, int]:
    """Torch tensors -> numpy (marked); returns ``(payload, nbytes)``."""
    total = 0

    def walk(x: Any) -> Any:
        nonlocal total
        if isinstance(x, np.ndarray):
            total += x.nbytes
            return x
        mod = type(x).__module__
        if mod.startswith("torch") and hasattr(x, "detach"):
            arr = x.detach().cpu().numpy()
            total += arr.nbytes
            return _TorchLeaf(arr)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            seq = [walk(v) for v in x]
            return seq if isinstance(x, list) else tuple(seq)
        if isinstance(x, bytes | bytearray):
            total += len(x)
        return x

    return walk(obj), total


def from_wire(obj: Any, as_torch: bool = True) -> Any:
    """Undo :func:`to_wire`: marked leaves become torch tensors again (zero-copy)."""
    if isinstance(obj, _TorchLeaf):
        if not as_torch:
            return obj.array
        import torch

        arr = obj.array if obj.array.flags.writeable else obj.array.copy()
        return torch.from_numpy(arr)
    if isinstance(obj, dict):
        return {k: from_wire(v, as_torch) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_wire(v, as_torch) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_wire(v, as_torch) for v in obj)
    return obj


@dataclass
class _Envelope:
    """What the channel actor stores: an inline payload or a reference to one."""

    inline: Any
    ref: list | None  # [ObjectRef] wrapped in a list so Ray does not resolve it in transit
    nbytes: int
    put_time: float
    visible_at: float = 0.0  # with a link: when getters may see it (the channel actor's monotonic clock)


# ----------------------------------------------------------------------------- the actor


@ray.remote(num_cpus=0, max_concurrency=1000)
class ChannelActor:
    """Holds the queues. All methods run on one asyncio loop (no locks needed)."""

    def __init__(self, name: str, maxsize: int, drop_oldest: bool, link: Any = None):
        self.name = name
        self.maxsize = maxsize
        self.drop_oldest = drop_oldest
        self.link = None  # a simulated network link (rlinf_nb.link.LinkClock): latency + bandwidth
        if link is not None:
            from rlinf_nb.link import LinkClock

            self.link = LinkClock(link)
        self.queues: dict[Any, deque[_Envelope]] = defaultdict(deque)
        self.next_put: OrderedDict[str, int] = OrderedDict()  # per producer: the number of its next put
        self.cond = asyncio.Condition()
        self.stats = {
            "puts": 0,
            "gets": 0,
            "dropped": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "put_wait_s": 0.0,
            "get_wait_s": 0.0,
        }

    async def put(self, key: Any, env: _Envelope, timeout: float | None,
                  order: tuple[str, int] | None = None) -> bool:  # fmt: skip
        """Queue ``env`` under ``key``; False when the key stayed full (or the turn never came) past ``timeout``.

        ``order`` = (producer, n): the producer's n-th put runs after its (n-1)-th, so one producer's
        pipelined puts keep their order (Ray does not order the calls of an async actor), without
        making each put wait for the previous one's reply.
        """
        t0 = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self.cond:
            try:
                if order is not None:
                    await self._wait_until(lambda: self.next_put.get(order[0], 0) >= order[1], deadline)
                if not self.drop_oldest:  # a full key holds its producer back (backpressure)
                    q = self.queues[key]
                    await self._wait_until(lambda: len(q) < self.maxsize, deadline)
                return self._append(key, env, t0)
            except TimeoutError:
                return False
            finally:
                if order is not None:  # this turn is over (done or timed out): the producer's next may run
                    self._advance(*order)

    async def _wait_until(self, predicate: Any, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        await asyncio.wait_for(self.cond.wait_for(predicate), timeout)

    def _advance(self, producer: str, n: int) -> None:
        self.next_put[producer] = max(self.next_put.get(producer, 0), n + 1)
        self.next_put.move_to_end(producer)
        while len(self.next_put) > MAX_PRODUCERS:  # producers long gone (each Channel handle is one)
            self.next_put.popitem(last=False)
        self.cond.notify_all()

    def _append(self, key: Any, env: _Envelope, t0: float) -> bool:
        """Append ``env`` (dropping the oldest items of a full drop-oldest key); the caller holds the lock."""
        q = self.queues[key]
        if self.drop_oldest:
            while len(q) >= self.maxsize:
                q.popleft()
                self.stats["dropped"] += 1
        if self.link is not None:  # link_delay_s / link_messages: the simulated delays so far
            now = time.monotonic()
            env.visible_at = self.link.deliver(now, env.nbytes)
            self.stats["link_delay_s"] = self.stats.get("link_delay_s", 0.0) + env.visible_at - now
            self.stats["link_messages"] = self.stats.get("link_messages", 0) + 1
        q.append(env)
        self.stats["puts"] += 1
        self.stats["bytes_in"] += env.nbytes
        self.stats["put_wait_s"] += time.perf_counter() - t0
        self.cond.notify_all()
        return True

    async def get_batch(self, keys: list, timeout: float | None) -> list[_Envelope] | None:
        """One item from each key, all or nothing."""
        t0 = time.perf_counter()
        async with self.cond:
            try:
                await self._wait(lambda: all(self._visible(self.queues[k]) for k in keys), keys, timeout)
            except TimeoutError:
                return None
            out = [self.queues[k].popleft() for k in keys]
            self.stats["gets"] += len(out)
            self.stats["bytes_out"] += sum(e.nbytes for e in out)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    async def get_many(self, key: Any, max_items: int, timeout: float | None) -> list[_Envelope] | None:
        """Up to ``max_items`` queued items of one key, waiting for at least one."""
        t0 = time.perf_counter()
        async with self.cond:
            q = self.queues[key]
            try:
                await self._wait(lambda: self._visible(q) > 0, [key], timeout)
            except TimeoutError:
                return None
            out = [q.popleft() for _ in range(min(max_items, self._visible(q)))]
            self.stats["gets"] += len(out)
            self.stats["bytes_out"] += sum(e.nbytes for e in out)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    async def latest(self, key: Any) -> _Envelope | None:
        """The newest item of ``key`` without removing it (for UI readers)."""
        q = self.queues.get(key)
        n = self._visible(q) if q else 0
        return q[n - 1] if n else None

    def _visible(self, q: deque[_Envelope]) -> int:
        """How many items at the head of ``q`` getters may see (all of them without a link)."""
        if self.link is None or not q:
            return len(q)
        now = time.monotonic()
        n = 0
        for env in q:  # a link delivers in put order, so the visible items are a prefix
            if env.visible_at > now:
                break
            n += 1
        return n

    async def _wait(self, ready: Any, keys: list, timeout: float | None) -> None:
        """Wait (holding ``cond``) until ``ready()``; raises TimeoutError past ``timeout``."""
        if self.link is None:
            await asyncio.wait_for(self.cond.wait_for(ready), timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():  # wake at the next delivery time, a put, or the deadline
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError
            pending = [env.visible_at for k in keys for env in self.queues[k] if env.visible_at > now]
            waits = [t - now for t in (min(pending, default=None), deadline) if t is not None]
            try:
                await asyncio.wait_for(self.cond.wait(), min(waits) if waits else None)
            except TimeoutError:
                pass

    async def clear(self) -> int:
        async with self.cond:
            n = sum(len(q) for q in self.queues.values())
            self.queues.clear()
            self.cond.notify_all()
        return n

    async def metrics(self) -> dict[str, Any]:
        depths = {str(k): len(q) for k, q in self.queues.items()}
        out = {"name": self.name, "depth": sum(depths.values()), "depth_by_key": depths, **self.stats}
        if self.link is not None:  # items put but not delivered yet (they count in depth)
            out["in_flight"] = sum(len(q) - self._visible(q) for q in self.queues.values())
        return out


# ----------------------------------------------------------------------------- the client


class Channel:
    """A handle to a channel; picklable, so it can be passed to any worker."""

    def __init__(self, name: str, actor: Any, inline_bytes: int = INLINE_BYTES):
        self.name = name
        self._actor = actor
        self.inline_bytes = inline_bytes
        self._inflight: list[ray.ObjectRef] = []
        # this handle's puts are numbered: the channel runs them in that order (a pickled copy is a new producer)
        self._producer = uuid.uuid4().hex
        self._puts = 0

    @classmethod
    def create(
        cls, name: str, maxsize: int = 8, drop_oldest: bool = False, link: Any = None, **options: Any
    ) -> Channel:
        """Create a channel actor (owned by the caller: it dies with its creator).

        ``link``: a simulated network link between the producer and consumer groups (an
        :class:`rlinf_nb.link.ChannelLink` or its mapping, e.g. ``{"latency": {"kind": "constant",
        "ms": 50}, "bandwidth_bytes_s": 10e6}``): each item becomes visible to getters only at its
        delivery time (:func:`rlinf_nb.link.delivery_times`). Items in flight hold their key's slots.
        """
        if maxsize < 1:
            raise ValueError(f"channel {name!r}: maxsize must be >= 1, got {maxsize}")
        if link is not None:
            from rlinf_nb.link import ChannelLink

            link = ChannelLink.of(link)  # validated here, in the caller's process
        actor = ChannelActor.options(**options).remote(name, maxsize, drop_oldest, link)
        return cls(name, actor)

    def _envelope(self, item: Any) -> _Envelope:
        payload, nbytes = to_wire(item)
        if nbytes > self.inline_bytes:
            return _Envelope(None, [ray.put(payload)], nbytes, time.time())
        return _Envelope(payload, None, nbytes, time.time())

    @staticmethod
    def _open(env: _Envelope, as_torch: bool) -> Any:
        payload = ray.get(env.ref[0]) if env.ref is not None else env.inline
        return from_wire(payload, as_torch)

    def put(self, key: Any, item: Any, timeout: float | None = 60.0, block: bool = True) -> None:
        """Append ``item`` under ``key``; blocks while the key is full (unless drop_oldest).

        With ``block=False`` the put is pipelined: it returns at once and the outcome of
        earlier non-blocking puts is checked on the next call (a put that timed out on a
        full key raises then). Puts are numbered per handle and the channel runs them in
        that order, so one producer's items keep their FIFO order.
        """
        ref = self._actor.put.remote(key, self._envelope(item), timeout, self._next_order())
        if block:
            self._check_inflight(wait=True)
            if not ray.get(ref):
                raise ChannelTimeout(f"channel {self.name!r}: key {key!r} stayed full for {timeout} s")
            return
        self._inflight.append(ref)
        self._check_inflight(wait=False)

    def _check_inflight(self, wait: bool) -> None:
        if not self._inflight:
            return
        if wait:
            done, self._inflight = self._inflight, []
        else:
            done, self._inflight = ray.wait(self._inflight, num_returns=len(self._inflight), timeout=0)
        for ok in ray.get(done):
            if not ok:
                raise ChannelTimeout(
                    f"channel {self.name!r}: a pipelined put found its key full past its timeout"
                )

    def flush(self) -> None:
        """Wait for every pipelined put to be accepted."""
        self._check_inflight(wait=True)

    def put_async(self, key: Any, item: Any, timeout: float | None = 60.0) -> ray.ObjectRef:
        """Like :meth:`put` but returns the call's future (``True`` when accepted)."""
        return self._actor.put.remote(key, self._envelope(item), timeout, self._next_order())

    def _next_order(self) -> tuple[str, int]:
        order = (self._producer, self._puts)
        self._puts += 1
        return order

    def get(self, key: Any, timeout: float | None = 60.0, as_torch: bool = True) -> Any:
        return self.get_batch([key], timeout, as_torch)[0]

    def get_batch(self, keys: list, timeout: float | None = 60.0, as_torch: bool = True) -> list[Any]:
        """One item from each of ``keys`` (waits until all have one)."""
        envs = ray.get(self._actor.get_batch.remote(list(keys), timeout))
        if envs is None:
            raise ChannelTimeout(f"channel {self.name!r}: nothing arrived on {keys!r} within {timeout} s")
        return [self._open(e, as_torch) for e in envs]

    def get_many(
        self, key: Any, max_items: int = 64, timeout: float | None = 60.0, as_torch: bool = True
    ) -> list[Any]:
        """Everything queued under ``key`` (at most ``max_items``), waiting for at least one item.

        One round trip for a burst of items: the consumer-side batch get for one stream.
        """
        envs = ray.get(self._actor.get_many.remote(key, max_items, timeout))
        if envs is None:
            raise ChannelTimeout(f"channel {self.name!r}: nothing arrived on {key!r} within {timeout} s")
        refs = [e.ref[0] for e in envs if e.ref is not None]
        fetched = iter(ray.get(refs)) if refs else iter(())
        return [from_wire(next(fetched) if e.ref is not None else e.inline, as_torch) for e in envs]

    def latest(self, key: Any, as_torch: bool = False) -> Any | None:
        env = ray.get(self._actor.latest.remote(key))
        return None if env is None else self._open(env, as_torch)

    def clear(self) -> int:
        return ray.get(self._actor.clear.remote())

    def metrics(self) -> dict[str, Any]:
        return ray.get(self._actor.metrics.remote())

    def metrics_async(self) -> ray.ObjectRef:
        return self._actor.metrics.remote()

    def kill(self) -> None:
        ray.kill(self._actor)

    def __reduce__(self):
        return (Channel, (self.name, self._actor, self.inline_bytes))
