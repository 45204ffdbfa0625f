"""Fixed controllers under simulated edge–cloud delays: env-steps/s, success and return at 0 / 20 / 100 ms.

Run: ``.venv/bin/python bench/bench_latency.py [--delays 0,20,100] [--steps 150] [--channel]`` (no cluster
needed; ``--channel`` starts a local Ray instance).

Each delay is applied to both the observations and the actions (``env.link`` with a constant
``obs_delay`` and ``action_delay``, so the loop delay is twice it), in control steps of the env's
period ``dt_ms``:

* ``robot:mock_arm/reach`` (mock arm at 50 Hz, ``dt_ms=20``): a proportional end-effector controller
  (half the remaining distance per step, clipped). Success = within 3 cm of the target before the
  50-step limit.
* ``Pendulum-v1`` (``dt_ms=50``, its own period): energy-pumping swing-up plus a PD balance near the
  top. Return per 200-step episode (no success signal), five episodes per env.

The delays are simulated in steps, not slept, so env-steps/s shows the wrappers' own cost; the
ratios are against the 0 ms baseline (the unwrapped env) measured in the same run.

``--channel`` adds the channel-link rows (``placement.links`` of a run): the reach case again, but
each observation and each action crosses a real Ray channel (:meth:`Channel.create` with a constant
``ChannelLink`` latency, the same on both links) on a local Ray cluster the bench starts. The env
waits for its action (lockstep, like a simulator behind an edge-cloud link), so the delay costs
wall-clock throughput but not success; ``env.link`` models a real-time robot, which does not wait.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rlinf_nb.envs import make_env


def reach_controller(obs: np.ndarray) -> np.ndarray:
    """The reach task's last 3 state dims are target - end effector (m); an action of 1 moves 2 cm."""
    return np.clip(0.5 * obs[:, -3:] / 0.02, -1.0, 1.0).astype(np.float32)


def pendulum_controller(obs: np.ndarray) -> np.ndarray:
    cos, sin, vel = obs[:, 0], obs[:, 1], obs[:, 2]
    theta = np.arctan2(sin, cos)
    energy = vel**2 / 6 + 5 * cos  # 5 = upright at rest (m = l = 1, g = 10)
    torque = np.where(np.abs(theta) < 0.6, -(12 * theta + 2.5 * vel), 2.0 * np.sign(vel) * (energy < 5))
    return np.clip(torque, -2.0, 2.0)[:, None].astype(np.float32)


CASES = {
    # name: (env spec, make_env kwargs, controller, dt_ms, num_envs, steps per env)
    "mock_arm/reach": (
        "robot:mock_arm/reach",
        {"robot_overrides": {"control_hz": 50}},
        reach_controller,
        20,
        8,
    ),
    "Pendulum-v1": ("Pendulum-v1", {}, pendulum_controller, 50, 16),
}


def rollout(spec: str, kwargs: dict, controller, dt_ms: float, num_envs: int, steps: int, ms: float) -> dict:
    link = {"obs_delay": {"kind": "constant", "ms": ms}, "action_delay": {"kind": "constant", "ms": ms}}
    env = make_env(spec, num_envs, seed=0, link={**link, "dt_ms": dt_ms}, **kwargs)
    obs = env.reset()
    successes, returns = [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        res = env.step(controller(obs))
        obs = res.obs
        successes += res.successes
        returns += res.episode_returns
    rate = steps * num_envs / (time.perf_counter() - t0)
    env.close()
    return {
        "rate": rate,
        "success": float(np.mean(successes)) if successes else float("nan"),
        "return": float(np.mean(returns)) if returns else float("nan"),
        "episodes": len(returns),
    }


def channel_rollout(steps: int, ms: float, num_envs: int = 8) -> dict:
    """The reach case through linked obs/actions channels: ``ms`` of latency each way, slept for real."""
    from rlinf_nb.runtime.channel import Channel

    spec, kwargs, controller, _, _ = CASES["mock_arm/reach"]
    link = {"latency": {"kind": "constant", "ms": ms}} if ms else None
    obs_ch = Channel.create("bench/obs", maxsize=2, link=link)
    act_ch = Channel.create("bench/actions", maxsize=2, link=link)
    env = make_env(spec, num_envs, seed=0, **kwargs)
    obs = env.reset()
    successes: list[float] = []
    t0 = time.perf_counter()
    for _ in range(steps):
        obs_ch.put(0, obs)  # env -> rollout
        action = controller(obs_ch.get(0, as_torch=False))
        act_ch.put(0, action)  # rollout -> env
        res = env.step(act_ch.get(0, as_torch=False))
        obs = res.obs
        successes += res.successes
    rate = steps * num_envs / (time.perf_counter() - t0)
    env.close()
    obs_ch.kill()
    act_ch.kill()
    return {"rate": rate, "success": float(np.mean(successes)) if successes else float("nan")}


def main_channel(delays: list[float], steps: int) -> None:
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # a private instance
    try:
        print(f"\n{'channel link':<16}{'delay ms':>9}{'env-steps/s':>13}{'x 0ms':>7}{'success':>9}")
        base = None
        for ms in delays:
            r = channel_rollout(steps, ms)
            base = base or r
            print(f"{'mock_arm/reach':<16}{ms:>9.0f}{r['rate']:>13,.0f}{r['rate'] / base['rate']:>7.2f}"
                  f"{r['success']:>9.2f}")  # fmt: skip
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--delays", default="0,20,100", help="comma-separated delays in ms (first = baseline)"
    )
    parser.add_argument("--steps", type=int, default=150, help="steps per env for the reach case")
    parser.add_argument(
        "--channel", action="store_true", help="also run the reach case through linked Ray channels"
    )
    parser.add_argument("--channel-steps", type=int, default=100, help="steps per env for --channel")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    print(f"{'env':<16}{'delay ms':>9}{'loop steps':>11}{'env-steps/s':>13}{'x 0ms':>7}"
          f"{'success':>9}{'x 0ms':>7}{'return':>10}{'episodes':>10}")  # fmt: skip
    for name, (spec, kwargs, controller, dt_ms, num_envs) in CASES.items():
        steps = args.steps if name == "mock_arm/reach" else 1000  # Pendulum: five 200-step episodes
        base = None
        for ms in delays:
            r = rollout(spec, kwargs, controller, dt_ms, num_envs, steps, ms)
            base = base or r
            loop = 2 * int(np.ceil(ms / dt_ms - 1e-9))
            success = "-" if np.isnan(r["success"]) else f"{r['success']:.2f}"
            s_ratio = (
                "-"
                if np.isnan(r["success"]) or not base["success"]
                else f"{r['success'] / base['success']:.2f}"
            )
            print(f"{name:<16}{ms:>9.0f}{loop:>11}{r['rate']:>13,.0f}{r['rate'] / base['rate']:>7.2f}"
                  f"{success:>9}{s_ratio:>7}{r['return']:>10.2f}{r['episodes']:>10}")  # fmt: skip
    if args.channel:
        main_channel(delays, args.channel_steps)


if __name__ == "__main__":
    main()
