"""Channels between workers: FIFO per key, backpressure, drop-oldest, payload types, metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from rlinf_nb.runtime.channel import Channel, ChannelTimeout


@pytest.fixture
def channel(attached):
    ch = Channel.create("test/ch", maxsize=3)
    yield ch
    ch.kill()


def test_fifo_per_key_and_batch_get(channel):
    for i in range(3):
        channel.put("a", i)
    channel.put("b", "x")
    assert channel.get("a") == 0
    assert channel.get_batch(["a", "b"]) == [1, "x"]
    assert channel.get("a") == 2


def test_get_on_empty_key_times_out(channel):
    with pytest.raises(ChannelTimeout, match="nothing arrived"):
        channel.get("empty", timeout=0.3)


def test_full_key_blocks_then_times_out(channel):
    for i in range(3):
        channel.put("k", i)
    with pytest.raises(ChannelTimeout, match="stayed full"):
        channel.put("k", 99, timeout=0.3)
    assert channel.get("k") == 0
    channel.put("k", 3, timeout=1.0)  # room again
    assert [channel.get("k") for _ in range(3)] == [1, 2, 3]


def test_pipelined_puts_keep_order(attached):
    ch = Channel.create("test/pipe", maxsize=64)
    try:
        for i in range(50):
            ch.put("p", i, block=False)
        ch.flush()
        assert ch.get_many("p", max_items=64) == list(range(50))
    finally:
        ch.kill()


def test_drop_oldest_keeps_the_newest(attached):
    ch = Channel.create("test/ui", maxsize=2, drop_oldest=True)
    try:
        for i in range(10):
            ch.put("cam", i, timeout=0.1)
        assert ch.latest("cam") == 9
        assert [ch.get("cam"), ch.get("cam")] == [8, 9]
        assert ch.metrics()["dropped"] == 8
    finally:
        ch.kill()


def test_numpy_and_torch_payloads_round_trip(channel):
    big = np.random.default_rng(0).integers(
        0, 255, size=(1024, 1024), dtype=np.uint8
    )  # 1 MB: object store path
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    channel.put("x", {"img": big, "t": tensor, "n": 3})
    got = channel.get("x")
    assert np.array_equal(got["img"], big)
    assert isinstance(got["t"], torch.Tensor) and torch.equal(got["t"], tensor)
    channel.put("y", {"t": tensor})
    raw = channel.get("y", as_torch=False)
    assert isinstance(raw["t"], np.ndarray)


def test_metrics_count_depth_and_bytes(channel):
    channel.put("m", np.zeros(1000, np.float32))
    channel.put("m", np.zeros(1000, np.float32))
    m = channel.metrics()
    assert m["depth"] == 2 and m["depth_by_key"]["m"] == 2
    assert m["bytes_in"] == 8000 and m["puts"] == 2
    channel.get("m")
    assert channel.metrics()["gets"] == 1


def test_get_many_takes_a_burst_in_order(channel):
    for i in range(3):
        channel.put("burst", np.full(200_000, i, np.uint8))  # object-store path
    got = channel.get_many("burst", max_items=10)
    assert [int(a[0]) for a in got] == [0, 1, 2]
    with pytest.raises(ChannelTimeout):
        channel.get_many("burst", timeout=0.2)


def test_pipelined_puts_keep_order_while_the_key_is_full(attached):
    """Non-blocking puts that must wait for room (a slow consumer) still land in the order they were made."""
    ch = Channel.create("test/pipe_full", maxsize=2)
    try:
        for i in range(40):
            ch.put("p", i, block=False)
        got = []
        while len(got) < 40:
            got += ch.get_many("p", max_items=3, timeout=30)
        ch.flush()
        assert got == list(range(40))
        assert ch.metrics()["puts"] == 40
    finally:
        ch.kill()


def test_a_busy_producers_puts_share_calls(attached):
    """Puts made while the producer's previous call is in flight go together in its next call (coalescing)."""
    ch = Channel.create("test/coalesce", maxsize=2)
    try:
        for i in range(40):  # the key fills at once: the first calls wait in the channel
            ch.put("p", np.full(4, i), block=False)
        got = []
        # nothing but these gets makes the queued puts go out (the producer's thread does)
        while len(got) < 40:
            got += ch.get_many("p", max_items=8, timeout=30, as_torch=False)
        ch.flush()
        assert [int(a[0]) for a in got] == list(range(40))
        m = ch.metrics()
        assert m["puts"] == 40 and m["put_calls"] <= 10  # one call per put would be 40
    finally:
        ch.kill()


def test_put_many_lands_in_order_in_one_call(channel):
    channel.put_many([("a", 1), ("b", 2), ("a", 3)])
    assert channel.get_batch(["a", "b", "a"]) == [1, 2, 3]
    assert channel.metrics()["put_calls"] == 1


def test_a_refused_pipelined_put_raises_on_flush(channel):
    for i in range(3):
        channel.put("k", i)
    channel.put("k", 99, timeout=0.2, block=False)  # the key stays full
    with pytest.raises(ChannelTimeout, match="found their key full"):
        channel.flush()
    assert channel.get_many("k", max_items=10) == [0, 1, 2]


def test_a_producer_runs_at_most_max_ahead_bytes_ahead(attached):
    ch = Channel.create("test/ahead", maxsize=1, max_ahead_bytes=(5 << 20) // 2)  # 2.5 MB
    item = np.zeros(1 << 20, np.uint8)  # 1 MB: through the object store
    try:
        ch.put("k", item)  # accepted: the key is full now
        ch.put("k", item, block=False)  # in flight, waiting for room
        ch.put("k", item, block=False)  # queued behind it: 2 MB ahead
        with pytest.raises(ChannelTimeout, match="max_ahead_bytes"):
            ch.put("k", item, timeout=0.5, block=False)  # 3 MB ahead would be too far
        assert len(ch.get_many("k", timeout=5)) == 1
        assert len(ch.get_many("k", timeout=5)) == 1  # the in-flight one, then the queued one
        assert len(ch.get_many("k", timeout=5)) == 1
        ch.flush()
        assert ch.metrics()["puts"] == 3
    finally:
        ch.kill()


def test_metrics_and_latest_answer_while_every_call_thread_waits(attached):
    """Gets waiting on empty keys hold all the data threads; metrics/latest run on threads of their own."""
    import ray

    ch = Channel.create("test/waiters", maxsize=2, max_waiters=2)
    try:
        waiting = [ch._actor.get_many.remote(f"empty{i}", 1, 15) for i in range(2)]  # 15 s each
        deadline = time.monotonic() + 12  # a loaded machine can take seconds to deliver the calls
        calls_max = 0
        while calls_max < 2 and time.monotonic() < deadline:
            # each metrics call would sit behind the gets (15 s) if it shared their threads
            calls_max = ray.get(ch.metrics_async(), timeout=5)["calls_max"]
        assert calls_max == 2, "both gets never held a data thread at once"
        assert ray.get(ch._actor.latest.remote("empty0"), timeout=5) is None
        returned, _ = ray.wait(waiting, num_returns=2, timeout=0)
        assert not returned, "the gets returned early: metrics/latest proved nothing"
        assert ray.get(waiting, timeout=60) == [None, None]  # they time out, nothing was put
    finally:
        ch.kill()


def test_bad_channel_sizes_are_refused(attached):
    with pytest.raises(ValueError, match="max_waiters must be >= 2, got 1"):
        Channel.create("test/bad", max_waiters=1)
    with pytest.raises(ValueError, match="maxsize must be >= 1, got 0"):
        Channel.create("test/bad", maxsize=0)


def test_a_handles_default_timeout_applies_where_no_timeout_is_passed_also_in_a_worker(attached):
    """``default_timeout_s`` is what a put or get waits when it passes no timeout; a handle passed to a
    worker keeps it, and ``timeout=None`` still waits for the item."""
    import ray

    ch = Channel.create("test/default_timeout", maxsize=1, default_timeout_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ChannelTimeout, match="within 0.5 s"):
            ch.get("empty")
        assert time.monotonic() - t0 < 30
        ch.put("full", 1)
        with pytest.raises(ChannelTimeout, match="stayed full for 0.5 s"):
            ch.put("full", 2)

        @ray.remote(num_cpus=0)
        def read(handle: Channel, key: str, timeout: str) -> str:
            try:
                got = handle.get(key) if timeout == "default" else handle.get(key, timeout=None)
            except ChannelTimeout as exc:
                return f"timeout: {exc}"
            return f"got {got}"

        # within 30 s, so not the 60 s default: the worker's handle kept the 0.5 s
        assert "within 0.5 s" in ray.get(read.remote(ch, "empty", "default"), timeout=30)
        waiting = read.remote(ch, "later", "none")  # no timeout: waits past the handle's 0.5 s
        time.sleep(2.0)
        ch.put("later", 7)
        assert ray.get(waiting, timeout=60) == "got 7"
    finally:
        ch.kill()
