"""ppo_cartpole on the cluster vs Stable-Baselines3 PPO (rl-zoo hyperparameters), same machine, same seeds.

Run: ``.venv/bin/python bench/bench_ppo_cartpole.py [--seeds 0 1 2]``.

For each seed: time from ``rl.launch`` (warm cluster) to the first update whose
``episode_return_mean`` (mean of the last 20 episodes) is >= 475, the env steps it
took, and env-steps/s; then the same for SB3 PPO (bench/ppo_reference.py::train_sb3,
stopped by the same rule) and for our single-process reference loop built from the
same maths (bench/ppo_reference.py::train_ppo), and RLlib PPO (bench/rllib_ppo_cartpole.py)
with the same hyperparameters. Prints medians and ratios.

RLlib runs in its own venv, ``bench/.venv-rllib``: ``ray[rllib]`` pins ``gymnasium==1.2.2``
while the project venv has 1.4 (LeRobot/ManiSkill resolve to it). The first run creates it
with uv (``ray[rllib]`` at this venv's Ray version, the same torch; from uv's cache once
``make setup`` has run: seconds, no download). ``--skip-rllib`` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ppo_reference  # noqa: E402

import rlinf_nb as rl  # noqa: E402

TARGET = 475.0
HERE = Path(__file__).resolve().parent
RLLIB_VENV = HERE / ".venv-rllib"


def rllib_python() -> Path:
    """The RLlib venv's python, created on first use with uv (same Ray and torch versions as ours)."""
    python = RLLIB_VENV / "bin" / "python"
    if python.exists():
        return python
    import ray
    import torch

    torch_version = torch.__version__.split("+")[0]  # the local tag (+cu128) is not on PyPI's index
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    print(
        f"[bench] creating {RLLIB_VENV} (ray[rllib]=={ray.__version__}, torch=={torch_version})",
        flush=True,
    )
    subprocess.run([uv, "venv", "-q", str(RLLIB_VENV), "--python", sys.executable], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), f"ray[rllib]=={ray.__version__}",
                    f"torch=={torch_version}"], check=True)  # fmt: skip
    return python


def rllib(seed: int) -> dict:
    """One seed of RLlib PPO in its own venv and process; its last stdout line is the result."""
    proc = subprocess.run([str(rllib_python()), str(HERE / "rllib_ppo_cartpole.py"), "--seed", str(seed)],
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"RLlib PPO failed (seed {seed}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--skip-rllib", action="store_true")
    args = parser.parse_args()
    if not args.skip_rllib:
        rllib_python()  # before anything is measured: a failed venv should not waste the other runs
    rl.attach(quiet=True)
    rows = []
    for seed in args.seeds:
        rows.append(ours(seed))
        rows.append(as_row(ppo_reference.train_sb3(seed, target=TARGET), "stable-baselines3 PPO"))
        if not args.skip_reference:
            rows.append(
                as_row(ppo_reference.train_ppo(ppo_reference.PPOSettings(), seed), "single-process reference")
            )
        if not args.skip_rllib:
            rows.append(rllib(seed))
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
    if "RLlib PPO" in med:
        print(
            f"RLlib time-to-475 / rlinf-nb = {med['RLlib PPO'][0] / ours_t:.2f}  (target >= 3.0; RLlib's "
            "time includes its ray.init and build, as ours includes launch)"
        )


if __name__ == "__main__":
    main()
