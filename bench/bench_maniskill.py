"""ManiSkill PushCube-v1 env-steps/s: a plain ``env.step`` loop vs our rollout through the cluster.

Run: ``.venv/bin/python bench/bench_maniskill.py [--workers 1] [--seconds 8] [--no-rgb] [--skip-cluster]
[--modes colocated] [--rounds 5]``.

All in one run, CPU physx (``sim_backend="physx_cpu"``), state observations, one env per
env worker, random actions:

1. **plain loop** -- ``gym.make("PushCube-v1", num_envs=1, ...)`` stepped in a tight loop
   (resetting on done), in ``--workers`` processes at once (the same envs the cluster runs);
2. **make_env loop** -- the same through ``rlinf_nb.envs.make_env("maniskill:PushCube-v1")``
   (numpy conversion, same-step autoreset, episode bookkeeping); and the plain loop that also runs
   the same MLP policy (``policy.act``) in-process each step, the floor of any rollout with a policy;
3. **cluster rollout** -- a PPO run (``epochs=1``, so updates are short) with
   ``env_workers=--workers`` and ``num_envs=1``, once per ``placement.env_to_rollout`` mode
   (``direct``: a rollout worker answers each step in an actor call; ``channel``: the same through the
   obs/actions channels, on shared-memory lanes; ``colocated``: the env worker runs the policy); rollout env-steps/s per iteration is
   ``rollout_steps * workers / time/rollout`` (the rollout stage only: env steps plus the
   channel round trips to the rollout worker's policy), median over iterations after the
   first. Each cluster run sits between two plain loops (``--bracket-seconds``) and its ratio uses their
   mean; every path runs ``--rounds`` times, and the reported ratio is the median. With ``--chunk k``
   (default 8) two more runs use ``policy.chunk: k``, one policy answer per k env steps: ``channel`` with
   the next chunk asked for k/2 steps early (``policy.chunk_prefetch``), and ``colocated``.

With ``--rgb`` (default on) it also measures the plain and make_env loops with
``obs_mode="rgb"`` (128x128 base camera) and prints construction times.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
import uuid
from typing import Any

ENV_ID = "PushCube-v1"


def _plain_worker(args: tuple[str, float, int, Any]) -> tuple[float, float]:
    """One process: make the env, wait for the others, step for ``seconds``; (make s, steps/s)."""
    obs_mode, seconds, seed, barrier = args
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    import numpy as np

    t0 = time.perf_counter()
    env = gym.make(ENV_ID, num_envs=1, obs_mode=obs_mode, sim_backend="physx_cpu")
    make_s = time.perf_counter() - t0
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).uniform(-1, 1, (4096, *env.action_space.shape)).astype(np.float32)
    if barrier is not None:
        barrier.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, term, trunc, _ = env.step(actions[steps % 4096])
        steps += 1
        if bool(term.any()) or bool(trunc.any()):
            env.reset()
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return make_s, rate


def plain_loop(obs_mode: str, seconds: float, workers: int) -> tuple[float, float]:
    """Total env-steps/s of ``workers`` plain loops running at once, and the mean make time.

    Always in fresh processes, as the cluster's env workers are: after ``rl.attach`` the bench's own
    process also runs Ray's driver threads, which slowed an in-process loop by ~10% (396-440 vs 455-499
    env-steps/s) and so flattered the cluster's ratio.
    """
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(workers)
        with ctx.Pool(workers) as pool:
            out = pool.map(_plain_worker, [(obs_mode, seconds, i, barrier) for i in range(workers)])
    return statistics.mean(m for m, _ in out), sum(r for _, r in out)


def plain_policy_loop(seconds: float) -> float:
    """Env-steps/s of the plain loop that also runs the bench's MLP policy in-process per step.

    What any rollout with a policy in the loop pays at least: the env step plus one forward pass.
    """
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    import torch

    from rlinf_nb.policies import make_policy

    torch.set_num_threads(1)
    env = gym.make(ENV_ID, num_envs=1, obs_mode="state", sim_backend="physx_cpu")
    obs, _ = env.reset(seed=0)
    base = env.unwrapped
    policy = make_policy(
        "mlp", base.single_observation_space, base.single_action_space, hidden_sizes=[256, 256]
    )
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with torch.no_grad():
            action, _, _ = policy.act(torch.as_tensor(obs.numpy() if hasattr(obs, "numpy") else obs))
        obs, _, term, trunc, _ = env.step(action.numpy())
        steps += 1
        if bool(term.any()) or bool(trunc.any()):
            obs, _ = env.reset()
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def make_env_loop(obs_mode: str, seconds: float) -> tuple[float, float]:
    """(make s, steps/s) of one env through rlinf_nb.envs.make_env."""
    import numpy as np

    from rlinf_nb.envs import make_env

    t0 = time.perf_counter()
    env = make_env(f"maniskill:{ENV_ID}", num_envs=1, seed=0, obs_mode=obs_mode)
    make_s = time.perf_counter() - t0
    env.reset()
    actions = np.random.default_rng(0).uniform(-1, 1, (4096, 1, *env.action_space.shape)).astype(np.float32)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(actions[steps % 4096])
        steps += 1
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return make_s, rate


def cluster_rollout(
    workers: int, rollout_steps: int, iterations: int, mode: str, chunk: int = 1, prefetch: int = 0
) -> dict[str, float]:
    """Rollout env-steps/s of a PPO run on the cluster (median over iterations after the first).

    ``mode`` is ``placement.env_to_rollout``: ``direct`` (a rollout worker answers each step), ``channel``
    (the same over the obs/actions channels' lanes) or ``colocated`` (each env worker runs its own policy copy).
    ``chunk``/``prefetch``: ``policy.chunk`` and ``policy.chunk_prefetch`` (one policy answer per ``chunk``
    env steps).
    """
    import rlinf_nb as rl

    rl.attach(quiet=True)
    cfg = {
        "algorithm": "ppo",
        "seed": 0,
        "env": {"id": f"maniskill:{ENV_ID}", "num_envs": 1, "kwargs": {"obs_mode": "state"}},
        "algo": {"rollout_steps": rollout_steps, "epochs": 1, "minibatch_size": rollout_steps * workers},
        "policy": {
            "name": "mlp",
            "kwargs": {"hidden_sizes": [256, 256]},
            "chunk": chunk,
            "chunk_prefetch": prefetch,
        },
        "placement": {"env": {"num_workers": workers}, "env_to_rollout": mode},
        "budget": {"total_env_steps": rollout_steps * workers * iterations},
        "checkpoint": {"every": 0, "keep": 1},
    }
    t0 = time.time()
    run = rl.launch(cfg, name=f"bench_maniskill_{mode}_{chunk}_{uuid.uuid4().hex[:6]}")
    run.wait(timeout=1800, progress=False)
    df = run.metrics()
    if df.empty or "time/rollout" not in df:
        raise RuntimeError(f"the run produced no metrics: {run.status()}")
    per_iter = rollout_steps * workers / df["time/rollout"]
    steady = per_iter.iloc[1:] if len(per_iter) > 1 else per_iter
    later = df.iloc[1:] if len(df) > 1 else df
    return {
        "rollout_steps_per_s": float(steady.median()),
        "overall_steps_per_s": float(df["steps_per_s"].iloc[1:].median()),
        # the env worker's split of the rollout stage: stepping envs, asking the policy, the rest (bookkeeping,
        # the call to the env worker, the trajectories' trip back)
        "env_share": float((later["time/rollout_env"] / later["time/rollout"]).median()),
        "policy_share": float((later["time/rollout_policy"] / later["time/rollout"]).median()),
        "seconds": time.time() - t0,
        "iterations": len(df),
    }


def bracketed_runs(
    args: argparse.Namespace, runs: list[tuple[str, str, int, int]]
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]], list[float]]:
    """Each cluster run bracketed by plain loops: per label, its ratios to the mean of the plain loops
    measured just before and just after it, over ``args.rounds`` rounds; and every plain-loop rate.

    The box's speed drifts by more than the gaps measured here (300-490 env-steps/s within minutes), so a
    run is compared with the plain loop of its own minute, not with one measured minutes earlier.
    """
    ratios: dict[str, list[float]] = {label: [] for label, *_ in runs}
    results: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in runs}
    plains = [plain_loop("state", args.bracket_seconds, args.workers)[1]]
    for _ in range(args.rounds):
        for label, mode, chunk, prefetch in runs:
            result = cluster_rollout(args.workers, args.rollout_steps, args.iterations, mode, chunk, prefetch)
            plains.append(plain_loop("state", args.bracket_seconds, args.workers)[1])
            ratios[label].append(result["rollout_steps_per_s"] / statistics.mean(plains[-2:]))
            results[label].append(result)
    return ratios, results, plains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="env workers (one env each)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each loop measurement")
    parser.add_argument(
        "--bracket-seconds", type=float, default=5.0, help="length of the plain loops between cluster runs"
    )
    parser.add_argument("--rounds", type=int, default=2, help="cluster runs per rollout path")
    parser.add_argument("--rollout-steps", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--chunk", type=int, default=8, help="chunk length of the chunked rows (1: none)")
    parser.add_argument("--rgb", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument(
        "--modes",
        default="direct,channel,colocated",
        help="comma-separated placement.env_to_rollout modes of the cluster rows (e.g. colocated)",
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - {"direct", "channel", "colocated"})
    if unknown:
        parser.error(f"--modes: got {unknown}; allowed values: direct, channel, colocated")

    rows: list[tuple[str, float, float | None]] = []
    make_s, plain_state = plain_loop("state", args.seconds, args.workers)
    rows.append((f"plain env.step loop, state, {args.workers} proc", plain_state, make_s))
    make_s, ours = make_env_loop("state", args.seconds)
    rows.append(("make_env loop, state, 1 env", ours, make_s))
    if args.rgb:
        make_s, rate = plain_loop("rgb", args.seconds, 1)
        rows.append(("plain env.step loop, rgb 128px, 1 env", rate, make_s))
        make_s, rate = make_env_loop("rgb", args.seconds)
        rows.append(("make_env loop, rgb 128px, 1 env", rate, make_s))
    with_policy = plain_policy_loop(args.seconds)
    rows.append(("plain loop + MLP policy.act, 1 env", with_policy, None))
    ratios: dict[str, list[float]] = {}
    results: dict[str, list[dict[str, float]]] = {}
    if not args.skip_cluster:
        runs = [(mode, mode, 1, 0) for mode in modes]
        if args.chunk > 1:  # one policy answer per chunk; channel: the next chunk asked for halfway
            chunked = (("channel", args.chunk // 2), ("colocated", 0))
            for mode, prefetch in (c for c in chunked if c[0] in modes):
                label = f"{mode}, {args.chunk}-chunks" + (f", prefetch {prefetch}" if prefetch else "")
                runs.append((label, mode, args.chunk, prefetch))
        ratios, results, plains = bracketed_runs(args, runs)
        rows.append((f"plain loops between runs, median of {len(plains)}", statistics.median(plains), None))
        for label, rs in results.items():
            rate = statistics.median(r["rollout_steps_per_s"] for r in rs)
            rows.append((f"cluster rollout, {label}, {args.workers} env worker(s)", rate, None))

    width = max(len(what) for what, _, _ in rows) + 2  # the chunked rows' labels are the longest
    print(f"\n{'what':<{width}}{'env-steps/s':>12}{'make s':>9}")
    for what, rate, make in rows:
        print(f"{what:<{width}}{rate:>12.1f}{'' if make is None else f'{make:.2f}':>9}")
    print(f"\nmake_env / plain (state, 1 env) = {ours / (plain_state / args.workers):.2f}")
    for label, rs in ratios.items():
        each = ", ".join(f"{r:.2f}" for r in rs)
        rate = statistics.median(r["rollout_steps_per_s"] for r in results[label])
        print(f"cluster rollout ({label}) / plain loop = {statistics.median(rs):.2f}  (target >= 0.9; "
              f"each run / its bracketing plain loops: {each}); / plain loop + policy = {rate / with_policy:.2f}")  # fmt: skip
        overall = statistics.median(r["overall_steps_per_s"] for r in results[label])
        print(f"  (whole PPO iteration incl. update: {overall:.1f} env-steps/s; "
              f"{len(rs)} runs of {results[label][0]['iterations']} iterations)")  # fmt: skip
        env = statistics.median(r["env_share"] for r in results[label])
        policy = statistics.median(r["policy_share"] for r in results[label])
        print(f"  (rollout stage: {env:.0%} stepping envs, {policy:.0%} asking the policy, "
              f"{1 - env - policy:.0%} the rest)")  # fmt: skip


if __name__ == "__main__":
    main()
