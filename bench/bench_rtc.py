"""Real-time chunking: a paced robot behind a slow policy link, with and without ``policy.chunk_prefetch``.

Run: ``.venv/bin/python bench/bench_rtc.py [--latency-ms 50] [--chunk 8] [--prefetch 4] [--iterations 4]``
(attaches to the local cluster, starting it if needed).

The env is the mock arm's reach task on the **real clock** (``robot_overrides: {clock: real}``): each
env step is one 20 Hz control period, slept as on hardware. The policy sits behind a simulated network
(``placement.links``: a constant ``--latency-ms`` on the request and on the reply; ``env_to_rollout:
direct``). Both runs are PPO with chunks of ``--chunk`` actions and the same seed:

* **baseline** (``chunk_prefetch: 0``): the arm finishes a chunk, then waits a round trip for the next;
* **prefetch**: the next chunk is asked for ``--prefetch`` steps before the current one runs out, so the
  round trip overlaps the last actions of the current chunk.

Printed: env steps/s of the rollout stage (median over iterations after the first), the ratio against the
baseline of the same run, and the ideal rates: the control rate (every round trip hidden), and the rate
with one round trip per chunk (the arm keeps its rate by deadlines, so the step after a wait does not sleep:
a chunk takes ``chunk - 1`` periods plus the longer of a period and the round trip). A prefetch window
shorter than the round trip hides only part of it. Each rollout segment still waits at its edges (its first
chunk, and its values-only round at the end), so the prefetch rate stays a little under the control rate.

Measured here (2 cores, defaults): baseline 17.20 env steps/s, prefetch 4: 19.22 (1.12x); ideal 20.00 and
17.78.
"""

from __future__ import annotations

import argparse
import time
import uuid

CONTROL_HZ = 20  # robots/specs/mock_arm.yaml


def rollout_rate(latency_ms: float, chunk: int, prefetch: int, rollout_steps: int, iterations: int) -> dict:
    import rlinf_nb as rl

    link = {"latency": {"kind": "constant", "ms": latency_ms}}
    cfg = {
        "algorithm": "ppo",
        "seed": 0,
        "env": {"id": "robot:mock_arm/reach", "num_envs": 1,
                "kwargs": {"max_steps": 200, "robot_overrides": {"clock": "real"}}},
        "algo": {"rollout_steps": rollout_steps, "epochs": 1, "minibatch_size": rollout_steps},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [64, 64]}, "chunk": chunk, "chunk_prefetch": prefetch},
        "placement": {"env_to_rollout": "direct", "links": {"obs": link, "actions": link}},
        "budget": {"total_env_steps": rollout_steps * iterations, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0, "keep": 1},
        "linger_s": 30,
    }  # fmt: skip
    run = rl.launch(cfg, name=f"bench_rtc_p{prefetch}_{uuid.uuid4().hex[:6]}")
    try:
        run.wait(timeout=1800, progress=False)
    finally:
        run.stop()
    df = run.metrics()
    if df.empty or "time/rollout" not in df:
        raise RuntimeError(f"the run produced no metrics: {run.status()}")
    per_iter = rollout_steps / df["time/rollout"]
    steady = per_iter.iloc[1:] if len(per_iter) > 1 else per_iter
    return {"steps_per_s": float(steady.median()), "iterations": len(df),
            "stale_chunk_rate": float(df["stale_chunk_rate"].mean()) if "stale_chunk_rate" in df else 0.0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0, help="one-way latency of request and reply")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--rollout-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()

    import rlinf_nb as rl

    rl.attach(quiet=True)
    t0 = time.time()
    base = rollout_rate(args.latency_ms, args.chunk, 0, args.rollout_steps, args.iterations)
    pre = rollout_rate(args.latency_ms, args.chunk, args.prefetch, args.rollout_steps, args.iterations)
    period = 1 / CONTROL_HZ
    round_trip = 2 * args.latency_ms / 1000
    waiting = args.chunk / ((args.chunk - 1) * period + max(period, round_trip))
    print(
        f"\nmock arm reach at {CONTROL_HZ} Hz (real clock), chunk {args.chunk}, link {args.latency_ms:g} ms each way"
    )
    print(f"{'':32}{'env steps/s':>12}{'vs baseline':>13}{'stale chunks':>14}")
    print(f"{'baseline (chunk_prefetch 0)':32}{base['steps_per_s']:>12.2f}{1.0:>13.2f}{'-':>14}")
    print(f"{f'chunk_prefetch {args.prefetch}':32}{pre['steps_per_s']:>12.2f}"
          f"{pre['steps_per_s'] / base['steps_per_s']:>13.2f}{pre['stale_chunk_rate']:>14.3f}")  # fmt: skip
    print(
        f"ideal: {CONTROL_HZ:.2f} steps/s with the round trip hidden, "
        f"{waiting:.2f} with one round trip per chunk ({time.time() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
