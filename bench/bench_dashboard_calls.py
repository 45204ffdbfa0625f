"""What each of the dashboard's polls costs the cluster, in CPU ms per call, measured on a paused run.

Run: ``.venv/bin/python bench/bench_dashboard_calls.py [--calls 200]``.

``bench_dashboard.py`` compares env-steps/s with the dashboard open and closed, which the shared
machine's noise swamps. This one pauses a ppo_cartpole run with frames (so the workers are idle),
then makes each kind of call the dashboard's poller makes ``--calls`` times and divides the CPU
time our cluster's processes used (controller, channel actors, workers, Ray's own daemons; found
by their ``RLINF_NB_CLUSTER_ID``) and this process used by the number of calls. Frame reads are
made as for a new frame every time (the reader's cache cleared), the dashboard's worst case.
Multiply by the dashboard's rates (data 2 calls x 4 Hz, status 2 Hz, frames up to 10 Hz) for its
cost per second.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from bench_dashboard import cluster_cpu

import rlinf_nb as rl
from rlinf_nb.envs.cartpole_sketch import CARTPOLE_WITH_FRAMES


def per_call(fn: Callable[[], object], calls: int, cluster_id: str) -> tuple[float, float, float]:
    """(cluster CPU ms, this process's CPU ms, wall ms) per call of ``fn``."""
    fn()
    c0, k0, t0 = cluster_cpu(cluster_id), time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    c1, k1, t1 = cluster_cpu(cluster_id), time.process_time(), time.perf_counter()
    return 1e3 * (c1 - c0) / calls, 1e3 * (k1 - k0) / calls, 1e3 * (t1 - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    handle = rl.attach(quiet=True)
    run = rl.launch(
        "ppo_cartpole",
        name=f"bench_calls_{uuid.uuid4().hex[:6]}",
        env__id=CARTPOLE_WITH_FRAMES,
        env__render_every=64,
        budget__total_env_steps=10**8,
        budget__stop_metric=None,
        budget__stop_value=None,
        linger_s=10,
    )
    try:
        run.wait(until=lambda row: row["step"] >= 2, timeout=300, progress=False)
        while not run.latest_episode():
            time.sleep(0.5)
        run.pause()
        while run.status()["state"] != "paused":
            time.sleep(0.2)
        time.sleep(2.0)

        def frames_new() -> object:
            run._frames._frames.clear()  # as for a new frame at every poll
            return run.latest_frames()

        def episode_new() -> object:
            run._frames._episodes.clear()
            return run.latest_episode()

        idle = per_call(lambda: time.sleep(0.01), 100, handle.cluster_id)
        print(f"{'call':<28}{'cluster CPU ms':>16}{'kernel CPU ms':>16}{'wall ms':>10}")
        print(f"{'(idle 10 ms sleep)':<28}{idle[0]:16.2f}{idle[1]:16.2f}{idle[2]:10.1f}")
        for name, fn, n in (
            ("status", run.status, args.calls),
            ("metrics_since", lambda: run.metrics_since(10**9), args.calls),
            ("events_since", lambda: run.events_since(10**9), args.calls),
            ("latest_frames (new frame)", frames_new, args.calls),
            ("latest_frames (unchanged)", lambda: run.latest_frames({0: run._frames._frames[0][1]["env_steps"]}),
             args.calls),
            ("latest_episode (new)", episode_new, max(args.calls // 4, 10)),
            ("health", run.health, max(args.calls // 10, 5)),
        ):  # fmt: skip
            c, k, w = per_call(fn, n, handle.cluster_id)
            # the cluster's idle CPU over the call's wall time is not the call's
            c -= idle[0] * w / idle[2]
            print(f"{name:<28}{c:16.2f}{k:16.2f}{w:10.1f}")
    finally:
        run.stop(timeout=120)


if __name__ == "__main__":
    main()
