"""Channel throughput vs raw ray.put/ray.get between the same two actors (target ratio >= 0.9).

Run: ``.venv/bin/python bench/bench_channel.py``, or ``make bench`` with the others; it attaches to, or
starts, the local cluster. Prints MB/s for 1 MB and 10 MB numpy payloads three ways, each as a ratio to raw:
- raw: the producer ``ray.put``s each item and hands its ref to the consumer in an actor call;
- channel: the default, brokered channel (every item's ref passes the channel actor);
- lanes: a channel made with ``lanes=True``: after a warm-up item opens the key's shared-memory lane, items
  go producer -> consumer through shared buffers with no actor call (``rlinf_nb.runtime.lanes``).
and each channel's actor calls per item (puts and gets: a busy producer's puts share calls, a get takes what
is queued). The raw path keeps at most 4 transfers in flight; the channels hold at most 4 items (``maxsize=4``).
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


def _through(prod, cons, ch: Channel, n: int) -> float:
    t0 = time.perf_counter()
    ray.get([prod.via_channel.remote(ch, n), cons.drain.remote(ch, n)])
    return time.perf_counter() - t0


def measure(nbytes: int, n: int, repeats: int) -> dict[str, float]:
    """MB/s of raw, channel and lanes (best of ``repeats``, interleaved) and each channel's calls per item."""
    prod, cons = Producer.remote(nbytes), Consumer.remote()
    channels = {
        "channel": Channel.create("bench/ch", maxsize=4),
        "lanes": Channel.create("bench/lanes", maxsize=4, lanes=True),
    }
    for ch in channels.values():  # warm-up: both ends use the key (which opens the lane)
        for _ in range(3):
            _through(prod, cons, ch, 4)
    best = dict.fromkeys(["raw", *channels], float("inf"))
    for _ in range(repeats):
        best["raw"] = min(best["raw"], ray.get(prod.raw.remote(cons, n)))
        for label, ch in channels.items():
            best[label] = min(best[label], _through(prod, cons, ch, n))
    mb = nbytes * n / 1e6
    out = {label: mb / t for label, t in best.items()}
    for label, ch in channels.items():
        m = ch.metrics()
        out[f"{label}_calls"] = (m["put_calls"] + m["get_calls"]) / m["puts"]
        ch.kill()
    for a in (prod, cons):
        ray.kill(a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rl.attach(quiet=True)
    print(
        f"{'payload':>8} {'raw MB/s':>9} {'channel MB/s':>13} {'ratio':>6} {'calls/item':>10} "
        f"{'lanes MB/s':>11} {'ratio':>6} {'calls/item':>10}  (target ratio >= 0.9)"
    )
    for nbytes, n in ((1 << 20, 200), (10 << 20, 40)):
        r = measure(nbytes, n, args.repeats)
        print(
            f"{nbytes >> 20:>6}MB {r['raw']:>9.0f} {r['channel']:>13.0f} {r['channel'] / r['raw']:>6.2f} "
            f"{r['channel_calls']:>10.2f} {r['lanes']:>11.0f} {r['lanes'] / r['raw']:>6.2f} {r['lanes_calls']:>10.2f}"
        )


if __name__ == "__main__":
    main()
