"""ppo_cartpole on the cluster vs Stable-Baselines3 PPO (rl-zoo hyperparameters), same machine, same seeds.

Run: ``.venv/bin/python bench/bench_ppo_cartpole.py [--seeds 0 1 2]``.

For each seed: time from ``rl.launch`` (warm cluster) to the first update whose
``episode_return_mean`` (mean of the last 20 episodes) is >= 475, the env steps it
took, and env-steps/s; then the same for SB3 PPO (bench/ppo_reference.py::train_sb3,
stopped by the same rule) and for our single-process reference loop built from the
same maths (bench/ppo_reference.py::train_ppo). Prints medians and ratios.

RLlib is not measured yet: ``ray[rllib]`` 2.60 pins ``gymnasium==1.2.2`` while this
venv has 1.4 (LeRobot/ManiSkill resolve to it); it needs its own venv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ppo_reference  # noqa: E402

import rlinf_nb as rl  # noqa: E402

TARGET = 475.0


def ours(seed: int) -> dict:
    t0 = time.time()
    run = rl.launch("ppo_cartpole", name=f"bench_ppo_s{seed}_{uuid.uuid4().hex[:6]}", seed=seed)
    started = time.time()
    run.wait(timeout=1800, progress=False)
    df = run.metrics()
    hit = df[df["episode_return_mean"] >= TARGET]
    if hit.empty:
        return {"impl": "rlinf-nb (cluster)", "seed": seed, "reached": False, "steps": int(df["env_steps"].iloc[-1]),
                "seconds": float(df["wall_time"].iloc[-1] - t0), "steps_per_s": float("nan"), "startup": started - t0}  # fmt: skip
    row = hit.iloc[0]
    seconds = float(row["wall_time"] - t0)
    steady = float(df["steps_per_s"].median())
    return {"impl": "rlinf-nb (cluster)", "seed": seed, "reached": True, "steps": int(row["env_steps"]),
            "seconds": seconds, "steps_per_s": steady, "startup": started - t0}  # fmt: skip


def as_row(res: ppo_reference.Result, impl: str) -> dict:
    return {"impl": impl, "seed": res.seed, "reached": res.reached, "steps": res.steps, "seconds": res.seconds,
            "steps_per_s": res.steps_per_s, "startup": 0.0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    rl.attach(quiet=True)
    rows = []
    for seed in args.seeds:
        rows.append(ours(seed))
        rows.append(as_row(ppo_reference.train_sb3(seed, target=TARGET), "stable-baselines3 PPO"))
        if not args.skip_reference:
            rows.append(
                as_row(ppo_reference.train_ppo(ppo_reference.PPOSettings(), seed), "single-process reference")
            )
    print(f"\n{'impl':<26}{'seed':>5}{'reached':>9}{'steps':>9}{'seconds':>9}{'steps/s':>9}{'startup':>9}")
    for r in rows:
        print(f"{r['impl']:<26}{r['seed']:>5}{str(r['reached']):>9}{r['steps']:>9}{r['seconds']:>9.1f}"
              f"{r['steps_per_s']:>9.0f}{r['startup']:>9.1f}")  # fmt: skip
    med = {}
    for impl in dict.fromkeys(r["impl"] for r in rows):
        sel = [r for r in rows if r["impl"] == impl]
        med[impl] = (
            statistics.median(r["seconds"] for r in sel),
            statistics.median(r["steps_per_s"] for r in sel),
        )
    print("\nmedian time to 475 (s) and env-steps/s:")
    for impl, (secs, sps) in med.items():
        print(f"  {impl:<26}{secs:>8.1f} s {sps:>8.0f} steps/s")
    ours_t, sb3_t = med["rlinf-nb (cluster)"][0], med["stable-baselines3 PPO"][0]
    print(f"\nrlinf-nb time-to-475 / SB3 = {ours_t / sb3_t:.2f}  (target <= 1.0)")
    print("RLlib: not measured (ray[rllib] pins gymnasium==1.2.2; needs a separate venv)")


if __name__ == "__main__":
    main()
