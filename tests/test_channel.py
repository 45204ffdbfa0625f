"""Channels between workers: FIFO per key, backpressure, drop-oldest, payload types, metrics."""

from __future__ import annotations

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
