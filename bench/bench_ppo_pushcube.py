"""ppo_pushcube on the cluster vs a single-process PPO loop with the same hyperparameters, same machine and seeds.

Run: ``.venv/bin/python bench/bench_ppo_pushcube.py [--seeds 0 1 2] [--budget N] [--smoke]``
(about 6 minutes per side and seed at full length on the 2-core dev box).

For each seed:

1. **ours** -- ``rl.launch("ppo_pushcube", seed=s)`` on the local cluster (ManiSkill
   PushCube-v1 state, CPU physx, 2 env workers x 8 envs, colocated policy): wall seconds from
   the launch call to the first metrics row whose ``success_rate`` (last ``metrics_window``
   episodes) is >= the recipe's ``stop_value`` (0.8), the env steps then, and env-steps/s over
   the training part (the launch's setup -- worker processes, imports, env construction -- up
   to the start of the first iteration is reported apart as ``setup s``).
2. **reference** -- ``bench/ppo_pushcube_reference.py``: 16 envs in one process, the recipe's
   hyperparameters read from the same resolved config, stopped by the same rule; seconds from
   the first reset (env and policy construction excluded, reported as ``setup s``).

Prints one table, ``ours / reference time-to-0.8`` per seed and the median (ours includes its
launch, as a notebook user waits for it), and the same ratio over the training parts only.
``--smoke`` runs both with a 2,048-step budget so every code path runs end to end in about a
minute; its numbers are not meaningful.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ppo_pushcube_reference as reference  # noqa: E402

RECIPE = "ppo_pushcube"
SMOKE_BUDGET = 2048
OURS = "rlinf-nb (cluster)"


def first_reaching(df: Any, metric: str, threshold: float, t0: float) -> dict[str, Any]:
    """Time-to-threshold of a run from its metrics DataFrame (``run.metrics()``).

    ``t0``: ``time.time()`` just before the launch. Returns ``reached``, ``steps`` (env steps
    at the first row with ``metric >= threshold``, else at the last row), ``seconds`` (that
    row's ``wall_time - t0``), ``setup_seconds`` (``t0`` to the start of the first iteration:
    the first row's ``wall_time`` less its own duration, ``env_steps / steps_per_s``) and
    ``steps_per_s`` (``steps / (seconds - setup_seconds)``).

    Raises:
        ValueError: ``df`` has no rows (the run never finished an iteration).
    """
    if df.empty:
        raise ValueError("the run has no metrics rows: it never finished an iteration")
    first = df.iloc[0]
    setup = float(first["wall_time"] - t0 - first["env_steps"] / first["steps_per_s"])
    values = df[metric] if metric in df else None
    hit = df[values.notna() & (values >= threshold)] if values is not None else df.iloc[:0]
    row = hit.iloc[0] if not hit.empty else df.iloc[-1]
    seconds = float(row["wall_time"] - t0)
    steps = int(row["env_steps"])
    value = row[metric] if values is not None else None
    return {"reached": not hit.empty, "steps": steps, "seconds": seconds, "setup_seconds": setup,
            "steps_per_s": steps / (seconds - setup), "success_rate": None if value is None else float(value)}  # fmt: skip


def ours(seed: int, budget: int | None) -> dict[str, Any]:
    import rlinf_nb as rl
    from rlinf_nb.client import resolve_config

    overrides = {"seed": seed}
    if budget is not None:
        overrides["budget__total_env_steps"] = budget
    name = f"bench_pushcube_s{seed}_{uuid.uuid4().hex[:6]}"
    t0 = time.time()
    run = rl.launch(RECIPE, name=name, **overrides)
    run.wait(timeout=3600, progress=False)
    status = run.status()
    if status["state"] != "finished":
        raise RuntimeError(f"run {name} ended {status['state']}: {status.get('error') or status}")
    cfg = resolve_config(RECIPE, **overrides)
    out = first_reaching(run.metrics(), "success_rate", cfg.budget.stop_value, t0)
    return {"impl": OURS, "seed": seed, **out}


def as_row(res: reference.Result) -> dict[str, Any]:
    return {"impl": res.impl, "seed": res.seed, "reached": res.reached, "steps": res.steps, "seconds": res.seconds,
            "setup_seconds": res.setup_seconds, "steps_per_s": res.steps_per_s, "success_rate": res.success_rate}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--budget", type=int, default=None, help="env-step budget of both (default: the recipe's)"
    )
    parser.add_argument("--skip-ours", action="store_true", help="leave out the cluster run")
    parser.add_argument("--skip-reference", action="store_true", help="leave out the single-process loop")
    parser.add_argument("--smoke", action="store_true",
                        help=f"budget {SMOKE_BUDGET} for both: checks the code paths, numbers not meaningful")  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="the reference prints one line per iteration")
    args = parser.parse_args(argv)
    budget = SMOKE_BUDGET if args.smoke else args.budget

    import torch

    import rlinf_nb as rl
    from rlinf_nb.client import resolve_config

    torch.set_num_threads(1)  # as our workers
    overrides = {} if budget is None else {"budget__total_env_steps": budget}
    settings = reference.PushCubeSettings.from_run_config(resolve_config(RECIPE, **overrides))
    print(f"recipe {RECIPE}, reference settings: {json.dumps(dataclasses.asdict(settings))}", flush=True)
    if not args.skip_ours:
        rl.attach(quiet=True)
    rows = []
    for seed in args.seeds:  # interleaved, so both sides see the same background load
        if not args.skip_ours:
            rows.append(ours(seed, budget))
            print(f"  {json.dumps(rows[-1])}", flush=True)
        if not args.skip_reference:
            rows.append(as_row(reference.train_ppo(settings, seed, verbose=args.verbose)))
            print(f"  {json.dumps(rows[-1])}", flush=True)

    target = settings.target
    if args.smoke:
        print(f"\nSMOKE RUN (budget {budget} env steps): the numbers below are not meaningful")
    print(f"\n{'impl':<26}{'seed':>5}{'reached':>9}{'env steps':>11}{'seconds':>9}{'setup s':>9}{'env-steps/s':>13}"
          f"{'success':>9}")  # fmt: skip
    for r in rows:
        rate = "" if r["success_rate"] is None else f"{r['success_rate']:.2f}"
        print(f"{r['impl']:<26}{r['seed']:>5}{str(r['reached']):>9}{r['steps']:>11}{r['seconds']:>9.1f}"
              f"{r['setup_seconds']:>9.1f}{r['steps_per_s']:>13.0f}{rate:>9}")  # fmt: skip
    by_seed = {s: {r["impl"]: r for r in rows if r["seed"] == s} for s in args.seeds}
    pairs = [(s, d[OURS], d[reference.IMPL]) for s, d in by_seed.items() if OURS in d and reference.IMPL in d]
    if pairs:
        print(f"\nours / reference time-to-{target:g} (ours from launch; reference from its first reset):")
        total, train = [], []
        for seed, o, ref in pairs:
            total.append(o["seconds"] / ref["seconds"])
            train.append((o["seconds"] - o["setup_seconds"]) / ref["seconds"])
            both = "" if o["reached"] and ref["reached"] else "  (not both reached: budget times)"
            print(f"  seed {seed}: {total[-1]:.2f}  (training only: {train[-1]:.2f}){both}")
        print(f"  median: {statistics.median(total):.2f}  (training only: {statistics.median(train):.2f})")
    return rows


if __name__ == "__main__":
    main()
