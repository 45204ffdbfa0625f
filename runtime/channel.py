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

Lanes (``Channel.create(..., lanes=True)``): a key with one producer actor and one consumer
actor on one node moves, once both have used it, onto shared buffers between the two
(:mod:`.lanes`): no actor call per item. The channel actor brokers the switch and keeps the
counts; see :class:`Channel`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from .lanes import (
    Endpoint,
    LaneBook,
    LaneClosed,
    LaneReader,
    LaneTimeout,
    LaneWriter,
    close_lane,
    hold_lane,
    lane_ends,
)

INLINE_BYTES = 100 * 1024
MAX_WAITERS = 16  # data calls a channel actor serves at once (each waiting get or put holds a thread)
MAX_AHEAD_BYTES = 256 << 20  # how far a producer's pipelined puts may run ahead of the channel
DEFAULT_TIMEOUT_S = 60.0  # a handle's timeout for the calls that pass none (placement.channel_timeout_s)


class _HandleDefault:
    """The ``timeout`` of a call that passes none: the handle's ``default_timeout_s``."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _HandleDefault()
Timeout = float | None | _HandleDefault  # seconds; None: wait for ever; DEFAULT: the handle's default


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


def _map_arrays(obj: Any, on_array: Any) -> tuple[Any, int]:
    """``obj`` with ``on_array`` applied to every numpy array (torch tensors become marked numpy first);
    returns it with the payload's bytes."""
    total = 0

    def walk(x: Any) -> Any:
        nonlocal total
        if isinstance(x, np.ndarray):
            total += x.nbytes
            return on_array(x)
        if isinstance(x, _TorchLeaf):
            total += x.array.nbytes
            return _TorchLeaf(on_array(x.array))
        if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
            arr = x.detach().cpu().numpy()
            total += arr.nbytes
            return _TorchLeaf(on_array(arr))
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            seq = [walk(v) for v in x]
            return seq if isinstance(x, list) else tuple(seq)
        if isinstance(x, bytes | bytearray):
            total += len(x)
        return x

    return walk(obj), total


def to_wire(obj: Any) -> tuple[Any, int]:
    """Torch tensors -> numpy (marked); returns ``(payload, nbytes)``."""
    return _map_arrays(obj, lambda a: a)


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


def copy_wire(obj: Any) -> tuple[Any, int]:
    """A wire payload with every array copied (out of a lane's shared buffer); returns ``(payload, nbytes)``."""
    return _map_arrays(obj, np.copy)


@dataclass
class _LaneSwitch:
    """A get's answer when its key's queue is empty and the rest of the key's items come by a lane."""

    shm: Any


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
        self,
        name: str,
        maxsize: int,
        drop_oldest: bool,
        link: Any = None,
        max_waiters: int = MAX_WAITERS,
        lanes: bool = False,
    ):
        self.name = name
        self.book = LaneBook(name, maxsize) if lanes else None  # None: every item passes through here
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
        """Queue ``env`` under ``key``; False when the key stayed full past ``timeout``.

        An out-of-band put (a rollout abort): a lane on ``key`` is closed, so its reader comes to the queue.
        """
        if self.book is not None:
            with self.cond:
                self._close_lanes([key])
        return self.put_many([(key, env, timeout)])[0][0]

    def _close_lanes(self, keys: list | None) -> None:
        """Close the lanes of ``keys`` (None: all); the caller holds the lock. Their items in flight are lost."""
        for shm in self.book.drop(keys):
            close_lane(shm)
        self.cond.notify_all()

    def put_many(
        self, items: list[tuple[Any, _Envelope, float | None]], producer: tuple[str, str | None] | None = None
    ) -> tuple[list[bool], dict[Any, tuple[Any, str, int]]]:
        """Queue ``(key, envelope, timeout)`` items in their order; per item: accepted, or its key stayed full.

        Each item's timeout counts from the call's arrival; the items behind a full key wait for it (one
        producer's puts keep their order, as a FIFO must). ``producer``: the putting handle's id and node
        (None outside an actor). Also returns the lanes this producer may open now (see :class:`LaneBook`).
        """
        arrival = time.monotonic()
        accepted = []
        with self._data_call():
            self.stats["put_calls"] += 1
            if self.book is not None and producer is not None:
                # the lane's own producer putting here lost its end (Ray restarted it): close the lane
                self._close_lanes([k for k, _, _ in items if self.book.stale(k, producer_id=producer[0])])
                for key, _, _ in items:
                    self.book.note_producer(key, producer[0])
            for key, env, timeout in items:
                t0 = time.perf_counter()
                if not self.drop_oldest:  # a full key holds its producer back (backpressure)
                    q = self.queues[key]
                    wait = None if timeout is None else max(0.0, arrival + timeout - time.monotonic())
                    if not self.cond.wait_for(lambda q=q: len(q) < self.maxsize, wait):
                        accepted.append(False)
                        continue
                accepted.append(self._append(key, env, t0))
            offers = {}
            if self.book is not None and producer is not None:
                for key, _, _ in items:
                    offer = self.book.offer(key, *producer)
                    if offer is not None:
                        offers[key] = offer
        return accepted, offers

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

    def get_batch(
        self, keys: list, timeout: float | None, reader: tuple[str, str, Any] | None = None
    ) -> list[_Envelope | _LaneSwitch] | None:
        """One item from each key, all or nothing; a key whose items now come by a lane answers a switch.

        ``reader``: the calling actor's id, node and handle (None outside an actor): on a channel with lanes
        it may be offered a lane for these keys (see :class:`LaneBook`).
        """
        t0 = time.perf_counter()
        with self._data_call():
            self._note_reader(keys, reader)
            if not self._wait(
                lambda: all(self._visible(self.queues[k]) or self._switch(k, reader) for k in keys),
                keys,
                timeout,
            ):
                return None
            out = [
                self.queues[k].popleft() if self._visible(self.queues[k]) else self._switch(k, reader)
                for k in keys
            ]
            envs = [e for e in out if isinstance(e, _Envelope)]
            self.stats["get_calls"] += 1
            self.stats["gets"] += len(envs)
            self.stats["bytes_out"] += sum(e.nbytes for e in envs)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    def get_many(
        self, key: Any, max_items: int, timeout: float | None, reader: tuple[str, str, Any] | None = None
    ) -> list[_Envelope] | _LaneSwitch | None:
        """Up to ``max_items`` queued items of one key, waiting for at least one (or the key's lane)."""
        t0 = time.perf_counter()
        with self._data_call():
            self._note_reader([key], reader)
            q = self.queues[key]
            if not self._wait(lambda: self._visible(q) > 0 or self._switch(key, reader), [key], timeout):
                return None
            if not q:
                return self._switch(key, reader)
            out = [q.popleft() for _ in range(min(max_items, self._visible(q)))]
            self.stats["get_calls"] += 1
            self.stats["gets"] += len(out)
            self.stats["bytes_out"] += sum(e.nbytes for e in out)
            self.stats["get_wait_s"] += time.perf_counter() - t0
            self.cond.notify_all()
        return out

    def _note_reader(self, keys: list, reader: tuple[str, str, Any] | None) -> None:
        if self.book is not None:
            if reader is not None:  # a reader told to switch, back here, lost its end: close the lane
                self._close_lanes([k for k in keys if self.book.stale(k, reader_id=reader[0])])
            for key in keys:
                self.book.note_reader(key, reader)

    def _switch(self, key: Any, reader: tuple[str, str, Any] | None) -> _LaneSwitch | None:
        """The switch to ``key``'s lane once its queue is empty (its earlier items come first)."""
        if self.book is None or self.queues[key]:
            return None
        shm = self.book.lane_for(key, reader)
        return None if shm is None else _LaneSwitch(shm)

    @ray.method(concurrency_group="control")
    def open_lane(self, key: Any, producer_id: str, shm: Any, held: Any) -> bool:
        """The producer made ``key``'s lane after its earlier puts were queued; waiting getters switch to it.

        ``shm`` goes to the key's reader; ``held`` (a second copy of it) is this actor's: mapped now, so
        the lane can be closed after its writer died (:func:`hold_lane`).
        """
        with self.cond:
            ok = self.book is not None and self.book.open(key, producer_id, shm, held)
            if ok:
                hold_lane(held)
            self.cond.notify_all()
            return ok

    @ray.method(concurrency_group="control")
    def set_link(self, link: Any) -> None:
        """The link's new latency and bandwidth (a live change), from the next put on; its draws carry on."""
        with self.cond:
            if self.link is None:
                raise ValueError(f"channel {self.name!r} was created without a link: there is none to retune")
            self.link.retune(link)
            self.cond.notify_all()

    @ray.method(concurrency_group="control")
    def lane_report(self, key: Any, role: str, items: int, nbytes: int) -> None:
        """A lane end's counts since its last report (``role``: put or get)."""
        with self.cond:
            self.book.report(key, role, items, nbytes)

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
        """Drop every queued item and close every lane (their ends start over); returns the queued count."""
        with self.cond:
            n = sum(len(q) for q in self.queues.values())
            self.queues.clear()
            if self.book is not None:
                self._close_lanes(None)
            self.cond.notify_all()
        return n

    @ray.method(concurrency_group="control")
    def metrics(self) -> dict[str, Any]:
        with self.cond:
            depths = {str(k): len(q) for k, q in self.queues.items()}
            out = {"name": self.name, **self.stats}
            if self.book is not None:  # lane items count in the totals as their ends last reported them
                for k in self.book.counts:
                    depths[str(k)] = depths.get(str(k), 0) + self.book.depth(k)
                totals = self.book.totals()
                out.update(totals)
                for total, lane in (
                    ("puts", "lane_puts"),
                    ("gets", "lane_gets"),
                    ("bytes_in", "lane_bytes_in"),
                ):
                    out[total] += totals[lane]
                out["bytes_out"] += totals["lane_bytes_out"]
            out.update(depth=sum(depths.values()), depth_by_key=depths)
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

    def __init__(
        self,
        actor: Any,
        name: str,
        max_ahead_bytes: int,
        producer: tuple[str, str | None] | None = None,
        offers: dict | None = None,
    ):
        self._actor = actor
        self._producer = producer  # this handle's id and node, on a channel with lanes
        self.offers: dict[Any, tuple[Any, str, int]] = {} if offers is None else offers  # lanes offered to it
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
        self._inflight = self._actor.put_many.remote(batch, self._producer)
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
            offers = {}
            try:
                accepted, offers = ray.get(ref)
                refused, error = accepted.count(False), None
            except Exception as exc:  # noqa: BLE001 - reported to the producer on its next call
                refused, error = 0, exc
            with self._cond:
                self.offers.update(offers)
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
    """A handle to a channel; picklable, so it can be passed to any worker.

    On a channel made with ``lanes=True`` a key with one producer actor and one consumer actor on the same
    node becomes a shared-memory lane once both have used it: the producer's later items go straight into
    shared buffers the consumer reads, with no call to the channel actor (see :mod:`.lanes`). Earlier items,
    already queued in the channel actor, are read first. ``clear()``, an out-of-band ``put_async`` and an end
    that Ray restarted close a key's lane (its items in flight are dropped) and a new one is offered later. A
    lane key has no ``latest`` (its items never pass the channel actor).
    """

    def __init__(
        self,
        name: str,
        actor: Any,
        inline_bytes: int = INLINE_BYTES,
        max_ahead_bytes: int = MAX_AHEAD_BYTES,
        lanes: bool = False,
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ):
        """``max_ahead_bytes``: payload bytes of pipelined puts this handle may have unaccepted before a put waits.
        ``default_timeout_s``: the timeout of the puts and gets that pass none (None: wait for ever)."""
        self.name = name
        self.default_timeout_s = default_timeout_s
        self._actor = actor
        self.inline_bytes = inline_bytes
        self.max_ahead_bytes = max_ahead_bytes
        self.lanes = lanes
        self._here = Endpoint.here() if lanes else None  # this process as a lane end (None: no lanes here)
        # as a producer: this actor (all its handles share its lanes), else this handle
        self._id = self._here.actor_id if self._here else uuid.uuid4().hex
        producer = (self._id, self._here.node_id if self._here else None) if lanes else None
        ends = lane_ends(actor._actor_id.hex()) if self._here else None  # this process's ends of the lanes
        self._pipeline = _PutPipeline(actor, name, max_ahead_bytes, producer, ends.offers if ends else None)
        self._writers: dict[Any, LaneWriter] = ends.writers if ends else {}
        self._readers: dict[Any, LaneReader] = ends.readers if ends else {}
        # items a timed-out get_batch had taken (wire form): the next gets of their keys return them first
        self._stash: dict[Any, deque] = defaultdict(deque)

    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 8,
        drop_oldest: bool = False,
        link: Any = None,
        max_waiters: int = MAX_WAITERS,
        max_ahead_bytes: int = MAX_AHEAD_BYTES,
        lanes: bool = False,
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
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

        ``lanes``: let keys with one producer actor and one consumer actor on one node become shared-memory
        lanes (``maxsize`` buffers each; see the class docstring). Not with ``drop_oldest`` or ``link``.

        ``default_timeout_s``: how long the puts and gets that pass no ``timeout`` wait before they raise
        :class:`ChannelTimeout` (handles passed to workers keep it). Calls that must wait for as long as it
        takes (an env held in its reset by an e-stop) pass ``timeout=None``.
        """
        if maxsize < 1:
            raise ValueError(f"channel {name!r}: maxsize must be >= 1, got {maxsize}")
        if max_waiters < 2:
            raise ValueError(f"channel {name!r}: max_waiters must be >= 2, got {max_waiters}")
        if lanes and (drop_oldest or link is not None):
            what = "drop_oldest=True" if drop_oldest else "a link"
            raise ValueError(
                f"channel {name!r}: lanes=True cannot go with {what} (a lane's items never pass the channel "
                "actor, which drops and delays them); allowed: lanes=False, or neither drop_oldest nor link"
            )
        if link is not None:
            from rlinf_nb.link import ChannelLink

            link = ChannelLink.of(link)  # validated here, in the caller's process
        actor = ChannelActor.options(max_concurrency=max_waiters, **options).remote(
            name, maxsize, drop_oldest, link, max_waiters, lanes
        )
        return cls(
            name, actor, max_ahead_bytes=max_ahead_bytes, lanes=lanes, default_timeout_s=default_timeout_s
        )

    def _envelope(self, item: Any) -> _Envelope:
        return self._wrap(*to_wire(item))

    def _wrap(self, payload: Any, nbytes: int) -> _Envelope:
        """A wire payload as the channel actor stores it: inline, or ``ray.put`` by this producer."""
        if nbytes > self.inline_bytes:
            return _Envelope(None, [ray.put(payload)], nbytes, time.time())
        return _Envelope(payload, None, nbytes, time.time())

    @staticmethod
    def _payload(env: _Envelope) -> Any:
        return ray.get(env.ref[0]) if env.ref is not None else env.inline

    def put(self, key: Any, item: Any, timeout: Timeout = DEFAULT, block: bool = True) -> None:
        """Append ``item`` under ``key``; blocks while the key is full (unless drop_oldest).

        With ``block=False`` the put is pipelined: it returns at once, and a put that timed out on a full
        key raises on a later call (at the latest on :meth:`flush`). One handle's puts, blocking or not,
        land in the order they were made. On a lane, a put copies the item into the next shared buffer and
        waits only while all of them are unread.
        """
        self.put_many([(key, item)], timeout, block)

    def put_many(self, items: list[tuple[Any, Any]], timeout: Timeout = DEFAULT, block: bool = True) -> None:
        """Append each ``(key, item)`` in order, in one call to the channel (see :meth:`put`)."""
        timeout = self._timeout(timeout)
        if self._here is not None:
            wired = self._put_on_lanes(items, timeout)
            if not wired:
                return
        else:
            wired = [(key, *to_wire(item)) for key, item in items]
        batch = [(key, self._wrap(payload, nbytes), timeout) for key, payload, nbytes in wired]
        if block and self._pipeline.idle():  # the common blocking case: one call, no thread hop
            accepted, offers = ray.get(self._actor.put_many.remote(batch, self._pipeline._producer))
            self._pipeline.offers.update(offers)
            if not all(accepted):
                full = [key for (key, _, _), ok in zip(batch, accepted, strict=True) if not ok]
                raise ChannelTimeout(f"channel {self.name!r}: key {full[0]!r} stayed full for {timeout} s")
            return
        self._pipeline.submit(batch, timeout)
        if block:
            self._pipeline.flush()

    def _put_on_lanes(
        self, items: list[tuple[Any, Any]], timeout: float | None
    ) -> list[tuple[Any, Any, int]]:
        """Write the items whose key has (or may now open) a lane; returns the others, as ``(key, wire payload,
        nbytes)``, to be queued after these.

        A key with an item among the others keeps the rest of this call's items there too: an offer that came
        in meanwhile must not put a later item on a lane ahead of an earlier one still to be queued.
        """
        rest: list[tuple[Any, Any, int]] = []
        queued_keys = set()
        for key, item in items:
            payload, nbytes = to_wire(item)
            writer = None if key in queued_keys else self._writers.get(key) or self._open_lane(key, nbytes)
            if writer is None:
                rest.append((key, payload, nbytes))
                queued_keys.add(key)
                continue
            try:
                writer.write(payload, nbytes, timeout)
            except LaneTimeout:
                raise ChannelTimeout(
                    f"channel {self.name!r}: key {key!r} stayed full for {timeout} s (every buffer of its "
                    "shared-memory lane unread)"
                ) from None
            except LaneClosed:  # the channel closed it (cleared, aborted): this item goes to its queue
                del self._writers[key]
                rest.append((key, payload, nbytes))
                queued_keys.add(key)
        self._report_lanes(force=False)
        return rest

    def _open_lane(self, key: Any, item_bytes: int) -> LaneWriter | None:
        """Open ``key``'s lane if the channel offered one: after this handle's earlier puts are queued."""
        offer = self._pipeline.offers.pop(key, None)
        if offer is None:
            return None
        reader_handle, node_id, buffers = offer
        self._pipeline.flush()  # the key's earlier items are in the channel actor's queue: read first
        writer = LaneWriter(reader_handle, node_id, buffers, first_item_bytes=item_bytes)
        # the same lane twice: Ray sends each argument as a copy of its own (see ChannelActor.open_lane)
        if not ray.get(self._actor.open_lane.remote(key, self._id, writer.shm, writer.shm)):
            writer.shm.close()  # another producer or reader came meanwhile: the key stays brokered
            return None
        self._writers[key] = writer
        return writer

    def _report_lanes(self, force: bool) -> list[ray.ObjectRef]:
        """Send the lane ends' counts to the channel actor (at most every REPORT_EVERY_S unless forced)."""
        refs = []
        for role, ends in (("put", self._writers), ("get", self._readers)):
            for key, end in ends.items():
                due = end.counts.take(force)
                if due is not None:
                    refs.append(self._actor.lane_report.remote(key, role, *due))
        return refs

    def flush(self) -> None:
        """Wait for every pipelined put to be accepted (raises if one was refused); report lane counts."""
        self._pipeline.flush()
        if self._writers or self._readers:
            ray.get(self._report_lanes(force=True))

    def put_async(self, key: Any, item: Any, timeout: Timeout = DEFAULT) -> ray.ObjectRef:
        """One put as its own call, returning its future (``True`` when accepted).

        Not ordered with this handle's pipelined puts: for out-of-band messages (a rollout abort).
        """
        return self._actor.put.remote(key, self._envelope(item), self._timeout(timeout))

    def get(self, key: Any, timeout: Timeout = DEFAULT, as_torch: bool = True) -> Any:
        return self.get_batch([key], timeout, as_torch)[0]

    def get_batch(self, keys: list, timeout: Timeout = DEFAULT, as_torch: bool = True) -> list[Any]:
        """One item from each of ``keys`` (waits until all have one)."""
        timeout = self._timeout(timeout)
        if self._here is not None:
            return [from_wire(p, as_torch) for p in self._get_batch_with_lanes(list(keys), timeout)]
        envs = ray.get(self._actor.get_batch.remote(list(keys), timeout))
        if envs is None:
            raise ChannelTimeout(f"channel {self.name!r}: nothing arrived on {keys!r} within {timeout} s")
        return [from_wire(self._payload(e), as_torch) for e in envs]

    def _get_batch_with_lanes(self, keys: list, timeout: float | None) -> list[Any]:
        """Wire payloads, one per key: stashed first, then the channel actor's queues, then lanes.

        All or nothing: on a timeout, what was taken goes back to the stash (read before anything else).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[Any] = [None] * len(keys)
        taken: list[int] = []
        for i, key in enumerate(keys):
            if self._stash[key]:
                got[i] = self._stash[key].popleft()
                taken.append(i)
        try:
            brokered = [i for i, k in enumerate(keys) if i not in taken and k not in self._readers]
            if brokered:
                ask = [keys[i] for i in brokered]
                reply = ray.get(self._actor.get_batch.remote(ask, _left(deadline), self._here.ref()))
                if reply is None:
                    raise ChannelTimeout(
                        f"channel {self.name!r}: nothing arrived on {ask!r} within {timeout} s"
                    )
                for i, answer in zip(brokered, reply, strict=True):
                    if isinstance(answer, _LaneSwitch):
                        self._readers.setdefault(keys[i], LaneReader(answer.shm))
                    else:
                        got[i] = self._payload(answer)
                        taken.append(i)
            for i, key in enumerate(keys):
                if i not in taken:
                    got[i] = self._get_many_with_lanes(key, 1, timeout, deadline)[0]
                    taken.append(i)
        except ChannelTimeout:
            for i in sorted(taken, reverse=True):
                self._stash[keys[i]].appendleft(got[i])
            raise
        self._report_lanes(force=False)
        return got

    def _read_lane(self, key: Any, wait: float | None, timeout: float | None) -> Any:
        reader = self._readers[key]
        try:
            payload, nbytes = copy_wire(reader.read(wait))
        except LaneTimeout:
            raise ChannelTimeout(
                f"channel {self.name!r}: nothing arrived on {key!r} within {timeout} s"
            ) from None
        reader.counts.add(nbytes)
        return payload

    def get_many(
        self, key: Any, max_items: int = 64, timeout: Timeout = DEFAULT, as_torch: bool = True
    ) -> list[Any]:
        """Everything queued under ``key`` (at most ``max_items``), waiting for at least one item.

        One round trip for a burst of items: the consumer-side batch get for one stream.
        """
        timeout = self._timeout(timeout)
        if self._here is not None:
            return [from_wire(p, as_torch) for p in self._get_many_with_lanes(key, max_items, timeout)]
        envs = ray.get(self._actor.get_many.remote(key, max_items, timeout))
        if envs is None:
            raise ChannelTimeout(f"channel {self.name!r}: nothing arrived on {key!r} within {timeout} s")
        return [from_wire(p, as_torch) for p in self._payloads(envs)]

    def _payloads(self, envs: list[_Envelope]) -> list[Any]:
        refs = [e.ref[0] for e in envs if e.ref is not None]
        fetched = iter(ray.get(refs)) if refs else iter(())
        return [next(fetched) if e.ref is not None else e.inline for e in envs]

    def _get_many_with_lanes(
        self, key: Any, max_items: int, timeout: float | None, deadline: float | None = None
    ) -> list[Any]:
        """Wire payloads of ``key``: stashed ones, else from the channel actor's queue or the key's lane.

        A lane read returns one item: it costs no call, and a read that finds nothing (timeout 0) took
        ~20 ms here. A lane the channel closed sends the reader back to the queue (where an abort waits).
        """
        stash = self._stash[key]
        if stash:
            return [stash.popleft() for _ in range(min(max_items, len(stash)))]
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        while True:
            if key not in self._readers:
                reply = ray.get(
                    self._actor.get_many.remote(key, max_items, _left(deadline), self._here.ref())
                )
                if reply is None:
                    raise ChannelTimeout(
                        f"channel {self.name!r}: nothing arrived on {key!r} within {timeout} s"
                    )
                if not isinstance(reply, _LaneSwitch):
                    return self._payloads(reply)
                self._readers[key] = LaneReader(reply.shm)
            try:
                out = [self._read_lane(key, _left(deadline), timeout)]
            except LaneClosed:
                del self._readers[key]
                continue
            self._report_lanes(force=False)
            return out

    def latest(self, key: Any, as_torch: bool = False) -> Any | None:
        env = ray.get(self._actor.latest.remote(key))
        return None if env is None else from_wire(self._payload(env), as_torch)

    def clear(self) -> int:
        return ray.get(self._actor.clear.remote())

    def metrics(self) -> dict[str, Any]:
        return ray.get(self._actor.metrics.remote())

    def metrics_async(self) -> ray.ObjectRef:
        return self._actor.metrics.remote()

    def set_link(self, link: Any) -> None:
        """Retune the link of a channel created with one (see :meth:`ChannelActor.set_link`)."""
        ray.get(self._actor.set_link.remote(link))

    def kill(self) -> None:
        ray.kill(self._actor)

    def _timeout(self, timeout: Timeout) -> float | None:
        """A call's ``timeout``, this handle's ``default_timeout_s`` where the call passed none."""
        return self.default_timeout_s if timeout is DEFAULT else timeout

    def __reduce__(self):
        return (
            Channel,
            (
                self.name,
                self._actor,
                self.inline_bytes,
                self.max_ahead_bytes,
                self.lanes,
                self.default_timeout_s,
            ),
        )


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (None: no deadline), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
