"""Channels: the only way data crosses worker groups.

A :class:`Channel` is a named, bounded, keyed FIFO backed by one threaded Ray actor
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

import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

INLINE_BYTES = 100 * 1024
MAX_WAITERS = 16  # data calls a channel actor serves at once (each waiting get or put holds a thread)
MAX_AHEAD_BYTES = 256 << 20  # how far a producer's pipelined puts may run ahead of the channel


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


@ray.remote(num_cpus=0, concurrency_groups={"control": 2})
class ChannelActor:
    """Holds the queues. A threaded actor: every method holds ``cond``; waiting calls wait on it.

    Data calls (puts and gets) run on ``max_concurrency`` threads, one per call, so a get waiting for an
    item holds one of them: :meth:`Channel.create` sizes them from ``max_waiters``. ``metrics``,
    ``latest`` and ``clear`` run on two threads of their own (the ``control`` group) and never queue
    behind waiting data calls. Threads, not asyncio, and few of them: on this 2-core box a call costs
    ~100 us of the actor's CPU with 8 threads, ~140 with 32, ~430 with 256 (every thread of the pool
    takes its turn at each call), and ~310 on an async actor; every step of a channel-mode rollout
    makes four calls.
    """

    def __init__(
        self, name: str, maxsize: int, drop_oldest: bool, link: Any = None, max_waiters: int = MAX_WAITERS
    ):
        self.name = name
        self.max_waiters = max_waiters
        self.calls = 0  # data calls inside the actor now (each one holds a thread)
        self.warned_full = False
        self.maxsize = maxsize
        self.drop_oldest = drop_oldest
        self.link = None  # a simulated network link (rlinf_nb.link.LinkClock): latency + bandwidth
        if link is not None:
            from rlinf_nb.link import LinkClock

            self.link = LinkClock(link)
        self.queues: dict[Any, deque[_Envelope]] = defaultdict(deque)
        self.cond = threading.Condition()
        self.stats = {
            "puts": 0,
            "gets": 0,
            "dropped": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "put_wait_s": 0.0,
            "get_wait_s": 0.0,
            "put_calls": 0,  # calls that brought the puts (a busy producer's puts share calls)
            "get_calls": 0,
            "calls_max": 0,  # the most data calls in the actor at once (max_waiters: more queue behind them)
        }

    @contextmanager
    def _data_call(self) -> Iterator[None]:
        """Hold ``cond`` for a put or get, counting it in; says once when data calls fill every thread."""
        with self.cond:
            self.calls += 1
            self.stats["calls_max"] = max(self.stats["calls_max"], self.calls)
            if self.calls >= self.max_waiters and not self.warned_full:
                self.warned_full = True
                print(
                    f"rlinf-nb channel {self.name!r}: all {self.max_waiters} call threads are in use (gets and "
                    "puts waiting); further calls queue behind them. Create the channel with a larger "
                    "max_waiters (at least one per producer and consumer handle).",
                    flush=True,
                )
            try:
                yield
            finally:
                self.calls -= 1

    def put(self, key: Any, env: _Envelope, timeout: float | None) -> bool:
        """Queue ``env`` under ``key``; False when the key stayed full past ``timeout``."""
        return self.put_many([(key, env, timeout)])[0]

    def put_many(self, items: list[tuple[Any, _Envelope, float | None]]) -> list[bool]:
        """Queue ``(key, envelope, timeout)`` items in their order; per item: accepted, or its key stayed full.

        Each item's timeout counts from the call's arrival; the items behind a full key wait for it (one
        producer's puts keep their order, as a FIFO must).
        """
        arrival = time.monotonic()
        accepted = []
        with self._data_call():
            self.stats["put_calls"] += 1
            for key, env, timeout in items:
                t0 = time.perf_counter()
                if not self.drop_oldest:  # a full key holds its producer back (backpressure)
                    q = self.queues[key]
                    wait = None if timeout is None else max(0.0, arrival + timeout - time.monotonic())
                    if not self.cond.wait_for(lambda q=q: len(q) < self.maxsize, wait):
                        accepted.append(False)
                        continue
                accepted.append(self._append(key, env, t0))
        return accepted

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

    def get_batch(self, keys: list, timeout: float | None) -> list[_Envelope] | None:
        """One item from each key, all or nothing."""
        t0 = time.perf_counter()
        with self._data_call():
            if not self._wait(lambda: all(self._visible(self.queues[k]) for k in keys), keys, timeout):
                return None
            out = [self.queues[k].popleft() for k in keys]
            self.stats["get_calls"] += 1
            self.stats["gets"] += len(out)
            self.stats["bytes_out"] += sum(e.nbytes for e in out)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    def get_many(self, key: Any, max_items: int, timeout: float | None) -> list[_Envelope] | None:
        """Up to ``max_items`` queued items of one key, waiting for at least one."""
        t0 = time.perf_counter()
        with self._data_call():
            q = self.queues[key]
            if not self._wait(lambda: self._visible(q) > 0, [key], timeout):
                return None
            out = [q.popleft() for _ in range(min(max_items, self._visible(q)))]
            self.stats["get_calls"] += 1
            self.stats["gets"] += len(out)
            self.stats["bytes_out"] += sum(e.nbytes for e in out)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    @ray.method(concurrency_group="control")
    def latest(self, key: Any) -> _Envelope | None:
        """The newest item of ``key`` without removing it (for UI readers)."""
        with self.cond:
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

    def _wait(self, ready: Any, keys: list, timeout: float | None) -> bool:
        """Wait (holding ``cond``) until ``ready()``; False past ``timeout``."""
        if self.link is None:
            return self.cond.wait_for(ready, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():  # wake at the next delivery time, a put, or the deadline
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            pending = [env.visible_at for k in keys for env in self.queues[k] if env.visible_at > now]
            waits = [t - now for t in (min(pending, default=None), deadline) if t is not None]
            self.cond.wait(min(waits) if waits else None)
        return True

    @ray.method(concurrency_group="control")
    def clear(self) -> int:
        with self.cond:
            n = sum(len(q) for q in self.queues.values())
            self.queues.clear()
            self.cond.notify_all()
        return n

    @ray.method(concurrency_group="control")
    def metrics(self) -> dict[str, Any]:
        with self.cond:
            depths = {str(k): len(q) for k, q in self.queues.items()}
            out = {"name": self.name, "depth": sum(depths.values()), "depth_by_key": depths, **self.stats}
            if self.link is not None:  # items put but not delivered yet (they count in depth)
                out["in_flight"] = sum(len(q) - self._visible(q) for q in self.queues.values())
            return out


# ----------------------------------------------------------------------------- the client


class _PutPipeline:
    """One producer's pipelined puts: at most one call in flight; puts made meanwhile go in the next call.

    Coalescing is what makes a channel as fast as a raw ``ray.put``/call pair: a busy producer pays one
    actor call per burst, not per item, and never a ``ray.wait``. A daemon thread waits for the call in
    flight and sends whatever queued behind it, so no item sits unsent while its producer does something
    else (an env worker waiting for the actions to the observation it just put). One call at a time keeps
    the producer's FIFO order without any bookkeeping in the channel actor.
    """

    IDLE_EXIT_S = 10.0  # the thread ends after this long without a call to wait for (a new put restarts it)

    def __init__(self, actor: Any, name: str, max_ahead_bytes: int):
        self._actor = actor
        self._name = name
        self._max_ahead_bytes = max_ahead_bytes
        self._ahead_bytes = (
            0  # payload bytes submitted but not accepted yet (queued or in the call in flight)
        )
        self._inflight_bytes = 0
        self._cond = threading.Condition()
        self._pending: list[tuple[Any, _Envelope, float | None]] = []
        self._inflight: ray.ObjectRef | None = None
        self._refused = 0  # pipelined puts whose key stayed full, not reported yet
        self._error: BaseException | None = None  # a failed call (the channel actor died), not reported yet
        self._thread: threading.Thread | None = None

    def idle(self) -> bool:
        """Nothing in flight or queued (a blocking put may then go straight to the actor)."""
        return self._inflight is None and not self._pending

    def submit(self, items: list[tuple[Any, _Envelope, float | None]], timeout: float | None) -> None:
        """Queue ``items`` behind this producer's earlier puts; raises what earlier pipelined puts hit.

        A producer runs at most ``max_ahead_bytes`` ahead of the channel (large items hold object-store
        memory until accepted): past it, this waits up to ``timeout`` for earlier puts to be accepted.
        """
        with self._cond:
            nbytes = sum(env.nbytes for _, env, _ in items)
            if not self._cond.wait_for(
                lambda: self.idle() or self._ahead_bytes + nbytes <= self._max_ahead_bytes, timeout
            ):
                raise ChannelTimeout(
                    f"channel {self._name!r}: {self._ahead_bytes} bytes of pipelined puts still waiting to be "
                    f"accepted after {timeout} s (max_ahead_bytes={self._max_ahead_bytes}): is anyone reading?"
                )
            self._pending.extend(items)
            self._ahead_bytes += nbytes
            if self._inflight is None:
                self._send()
            self._report()

    def flush(self) -> None:
        """Wait until every submitted item was accepted (or refused: then raise)."""
        with self._cond:
            self._cond.wait_for(self.idle)
            self._report()

    def _send(self) -> None:  # the caller holds the lock
        batch, self._pending = self._pending, []
        self._inflight = self._actor.put_many.remote(batch)
        self._inflight_bytes = sum(env.nbytes for _, env, _ in batch)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._wait_for_calls, name=f"channel-put:{self._name}", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()

    def _wait_for_calls(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._inflight is not None, self.IDLE_EXIT_S):
                    self._thread = None
                    return
                ref = self._inflight
            try:
                refused, error = ray.get(ref).count(False), None
            except Exception as exc:  # noqa: BLE001 - reported to the producer on its next call
                refused, error = 0, exc
            with self._cond:
                self._refused += refused
                self._error = self._error or error
                self._inflight, self._ahead_bytes = None, self._ahead_bytes - self._inflight_bytes
                if self._pending:
                    self._send()
                self._cond.notify_all()

    def _report(self) -> None:  # the caller holds the lock
        error, self._error = self._error, None
        if error is not None:
            raise error
        refused, self._refused = self._refused, 0
        if refused:
            raise ChannelTimeout(
                f"channel {self._name!r}: {refused} pipelined put(s) found their key full past their timeout"
            )


class Channel:
    """A handle to a channel; picklable, so it can be passed to any worker."""

    def __init__(
        self, name: str, actor: Any, inline_bytes: int = INLINE_BYTES, max_ahead_bytes: int = MAX_AHEAD_BYTES
    ):
        """``max_ahead_bytes``: payload bytes of pipelined puts this handle may have unaccepted before a put waits."""
        self.name = name
        self._actor = actor
        self.inline_bytes = inline_bytes
        self.max_ahead_bytes = max_ahead_bytes
        self._pipeline = _PutPipeline(actor, name, max_ahead_bytes)  # per handle: a pickled copy gets its own

    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 8,
        drop_oldest: bool = False,
        link: Any = None,
        max_waiters: int = MAX_WAITERS,
        max_ahead_bytes: int = MAX_AHEAD_BYTES,
        **options: Any,
    ) -> Channel:
        """Create a channel actor (owned by the caller: it dies with its creator).

        ``link``: a simulated network link between the producer and consumer groups (an
        :class:`rlinf_nb.link.ChannelLink` or its mapping, e.g. ``{"latency": {"kind": "constant",
        "ms": 50}, "bandwidth_bytes_s": 10e6}``): each item becomes visible to getters only at its
        delivery time (:func:`rlinf_nb.link.delivery_times`). Items in flight hold their key's slots.

        ``max_waiters``: how many puts and gets the channel serves at once. A get waiting for an item
        (or a put for room) holds one until it returns, and calls beyond it queue, so give it at least
        one per producer and consumer handle; each one makes every call a little dearer (see
        :class:`ChannelActor`). The channel says so in its log when they are all in use.

        ``max_ahead_bytes``: how far one producer's pipelined puts (``block=False``) may run ahead of what
        the channel accepted, in payload bytes; a put past it waits (a handle passed to a worker keeps it).
        """
        if maxsize < 1:
            raise ValueError(f"channel {name!r}: maxsize must be >= 1, got {maxsize}")
        if max_waiters < 2:
            raise ValueError(f"channel {name!r}: max_waiters must be >= 2, got {max_waiters}")
        if link is not None:
            from rlinf_nb.link import ChannelLink

            link = ChannelLink.of(link)  # validated here, in the caller's process
        actor = ChannelActor.options(max_concurrency=max_waiters, **options).remote(
            name, maxsize, drop_oldest, link, max_waiters
        )
        return cls(name, actor, max_ahead_bytes=max_ahead_bytes)

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

        With ``block=False`` the put is pipelined: it returns at once, and a put that timed out on a full
        key raises on a later call (at the latest on :meth:`flush`). One handle's puts, blocking or not,
        land in the order they were made.
        """
        self.put_many([(key, item)], timeout, block)

    def put_many(
        self, items: list[tuple[Any, Any]], timeout: float | None = 60.0, block: bool = True
    ) -> None:
        """Append each ``(key, item)`` in order, in one call to the channel (see :meth:`put`)."""
        batch = [(key, self._envelope(item), timeout) for key, item in items]
        if block and self._pipeline.idle():  # the common blocking case: one call, no thread hop
            accepted = ray.get(self._actor.put_many.remote(batch))
            if not all(accepted):
                full = [key for (key, _, _), ok in zip(batch, accepted, strict=True) if not ok]
                raise ChannelTimeout(f"channel {self.name!r}: key {full[0]!r} stayed full for {timeout} s")
            return
        self._pipeline.submit(batch, timeout)
        if block:
            self._pipeline.flush()

    def flush(self) -> None:
        """Wait for every pipelined put to be accepted (raises if one was refused)."""
        self._pipeline.flush()

    def put_async(self, key: Any, item: Any, timeout: float | None = 60.0) -> ray.ObjectRef:
        """One put as its own call, returning its future (``True`` when accepted).

        Not ordered with this handle's pipelined puts: for out-of-band messages (a rollout abort).
        """
        return self._actor.put.remote(key, self._envelope(item), timeout)

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
        return (Channel, (self.name, self._actor, self.inline_bytes, self.max_ahead_bytes))
