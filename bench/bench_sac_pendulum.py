"""sac_pendulum on the cluster vs Stable-Baselines3 SAC (rl-zoo hyperparameters), same machine, same seeds.

Run: ``.venv/bin/python bench/bench_sac_pendulum.py [--seeds 0 1]``.

For each seed: time from ``rl.launch`` (warm cluster) to the first update whose
``episode_return_mean`` (mean of the last 10 episodes, the recipe's ``metrics_window``)
is >= -250, and the env steps it took; then SB3 SAC stopped by the same rule. SB3 runs
rl-zoo's Pendulum-v1 settings (hyperparams/sac.yml: learning_rate 1e-3, everything else
SB3 defaults: one env, 256x256 ReLU, batch 256, learning_starts 100, train_freq 1,
gradient_steps 1, tau 0.005, gamma 0.99, auto temperature). Ours is the packaged recipe:
4 envs collected asynchronously while the learner trains (utd 1, learning_starts 1000).
Prints medians and the ratio of times; the issue's comparison is time to -250.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections import deque

import numpy as np

import rlinf_nb as rl

TARGET = -250.0
WINDOW = 10
BUDGET = 60_000


def ours(seed: int) -> dict:
    t0 = time.time()
    run = rl.launch("sac_pendulum", name=f"bench_sac_s{seed}_{uuid.uuid4().hex[:6]}", seed=seed,
                    budget__total_env_steps=BUDGET)  # fmt: skip
    run.wait(timeout=3600, progress=False)
    df = run.metrics()
    hit = df[df["episode_return_mean"] >= TARGET]
    row = hit.iloc[0] if not hit.empty else df.iloc[-1]
    seconds = float(row["wall_time"] - t0)
    return {"impl": "rlinf-nb (cluster)", "seed": seed, "reached": not hit.empty, "steps": int(row["env_steps"]),
            "seconds": seconds, "steps_per_s": int(row["env_steps"]) / seconds}  # fmt: skip


def sb3(seed: int) -> dict:
    """SB3 SAC with rl-zoo's Pendulum-v1 hyperparameters, stopped by the same rule."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    t0 = time.perf_counter()
    result: dict = {"impl": "stable-baselines3 SAC", "seed": seed, "reached": False}

    class StopAtReturn(BaseCallback):
        """Stop when the mean of the last WINDOW Monitor episode returns reaches TARGET."""

        def __init__(self):
            super().__init__()
            self.returns: deque[float] = deque(maxlen=WINDOW)

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.returns.append(float(ep["r"]))
            if len(self.returns) >= WINDOW and np.mean(self.returns) >= TARGET:
                result.update(reached=True, steps=self.num_timesteps)
                return False
            return True

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, verbose=0)
    model.learn(total_timesteps=BUDGET, callback=StopAtReturn())
    seconds = time.perf_counter() - t0
    steps = result.get("steps", model.num_timesteps)
    result.update(steps=steps, seconds=seconds, steps_per_s=steps / seconds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    rl.attach(quiet=True)
    rows = []
    for seed in args.seeds:
        rows.append(ours(seed))
        rows.append(sb3(seed))
    print(f"\n{'impl':<24}{'seed':>5}{'reached':>9}{'steps':>9}{'seconds':>9}{'steps/s':>9}")
    for r in rows:
        print(f"{r['impl']:<24}{r['seed']:>5}{str(r['reached']):>9}{r['steps']:>9}{r['seconds']:>9.1f}"
              f"{r['steps_per_s']:>9.0f}")  # fmt: skip
    med = {
        impl: statistics.median(r["seconds"] for r in rows if r["impl"] == impl)
        for impl in dict.fromkeys(r["impl"] for r in rows)
    }
    print("\nmedian time to -250 (s):")
    for impl, secs in med.items():
        print(f"  {impl:<24}{secs:>8.1f} s")
    print(f"\nrlinf-nb time-to--250 / SB3 = {med['rlinf-nb (cluster)'] / med['stable-baselines3 SAC']:.2f}")


if __name__ == "__main__":
    main()
