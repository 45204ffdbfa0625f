"""Channel throughput vs raw ray.put/ray.get between the same two actors (target ratio >= 0.9).

Run: ``.venv/bin/python bench/bench_channel.py`` (attaches to, or starts, the local cluster).
Prints MB/s for 1 MB and 10 MB numpy payloads, both ways, the ratio channel / raw, and the channel's
actor calls per item (puts and gets: a busy producer's puts share calls, a get takes what is queued).
The raw path keeps at most 4 transfers in flight; the channel holds at most 4 items (``maxsize=4``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
from rlinf_nb.runtime.channel import Channel

import rlinf_nb as rl


@ray.remote(num_cpus=0)
class Producer:
    def __init__(self, nbytes: int):
        self.payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)

    def raw(self, consumer, n: int) -> float:
        t0 = time.perf_counter()
        refs = []
        for _ in range(n):
            ref = ray.put(self.payload)
            refs.append(consumer.take.remote([ref]))
            if len(refs) > 4:  # the same small pipeline depth the channel allows
                ray.get(refs.pop(0))
        ray.get(refs)
        return time.perf_counter() - t0

    def via_channel(self, ch: Channel, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            ch.put(0, self.payload, block=False)
        ch.flush()
        return time.perf_counter() - t0


@ray.remote(num_cpus=0)
class Consumer:
    def __init__(self):
        self.checksum = 0

    def take(self, wrapped: list) -> int:
        arr = ray.get(wrapped[0])
        self.checksum += int(arr[0])
        return arr.nbytes

    def drain(self, ch: Channel, n: int) -> float:
        t0 = time.perf_counter()
        got = 0
        while got < n:
            for arr in ch.get_many(0, max_items=n - got, as_torch=False):
                self.checksum += int(arr[0])
                got += 1
        return time.perf_counter() - t0


def measure(nbytes: int, n: int, repeats: int) -> tuple[float, float, float]:
    prod, cons = Producer.remote(nbytes), Consumer.remote()
    ch = Channel.create("bench/ch", maxsize=4)
    raw_best = chan_best = float("inf")
    for _ in range(repeats):
        raw_best = min(raw_best, ray.get(prod.raw.remote(cons, n)))
        t0 = time.perf_counter()
        ray.get([prod.via_channel.remote(ch, n), cons.drain.remote(ch, n)])
        chan_best = min(chan_best, time.perf_counter() - t0)
    m = ch.metrics()
    calls_per_item = (m["put_calls"] + m["get_calls"]) / m["puts"]
    ch.kill()
    for a in (prod, cons):
        ray.kill(a)
    mb = nbytes * n / 1e6
    return mb / raw_best, mb / chan_best, calls_per_item


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rl.attach(quiet=True)
    print(
        f"{'payload':>8} {'raw MB/s':>10} {'channel MB/s':>13} {'ratio':>6} {'calls/item':>11}  (target >= 0.9)"
    )
    for nbytes, n in ((1 << 20, 200), (10 << 20, 40)):
        raw, chan, calls = measure(nbytes, n, args.repeats)
        print(f"{nbytes >> 20:>6}MB {raw:>10.0f} {chan:>13.0f} {chan / raw:>6.2f} {calls:>11.2f}")


if __name__ == "__main__":
    main()
