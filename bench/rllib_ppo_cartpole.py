"""RLlib PPO on CartPole-v1 with rl-zoo's hyperparameters, stopped at a mean return of 475.

Runs in its own venv (``ray[rllib]`` 2.60 pins ``gymnasium==1.2.2``; the project venv has 1.4):
``bench/bench_ppo_cartpole.py`` creates it with uv (``bench/.venv-rllib``, from uv's cache) and
calls this file there, one seed per process, reading the one JSON line it prints last.

RLlib's new API stack, single process (``num_env_runners=0``: the local env runner samples,
the local learner trains; RLlib's cheapest layout on one small machine): 8 envs x 32 steps =
256 per iteration, one 256 minibatch, 20 epochs, gamma 0.98, lambda 0.8, lr 1e-3 linearly to
0 over 1e5 steps, clip 0.2, vf coefficient 0.5, no entropy bonus, grad clip 0.5, separate
64x64 tanh actor and critic. ``episode_return_mean`` is smoothed over the last 20 episodes,
the same rule as ours and SB3's. Time counts from before ``build_algo()`` (which starts a
local Ray instance) to the first iteration at >= 475.
"""

from __future__ import annotations

import argparse
import json
import time

TARGET = 475.0
WINDOW = 20
BUDGET = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-runners", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=8, rollout_fragment_length=32)
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=256,
            minibatch_size=256,
            num_epochs=20,
            gamma=0.98,
            lambda_=0.8,
            lr=[[0, 1e-3], [BUDGET, 0.0]],
            clip_param=0.2,
            vf_loss_coeff=0.5,
            vf_clip_param=float("inf"),
            entropy_coeff=0.0,
            grad_clip=0.5,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[64, 64], fcnet_activation="tanh", vf_share_layers=False
            )
        )  # fmt: skip
        .reporting(metrics_num_episodes_for_smoothing=WINDOW)
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    started = time.perf_counter()
    result = {"impl": "RLlib PPO", "seed": args.seed, "reached": False, "startup": started - t0}
    steps, ret = 0, float("nan")
    while steps < BUDGET:
        out = algo.train()
        runners = out.get("env_runners", {})
        steps = int(
            out.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime", 0))
        )
        ret = float(runners.get("episode_return_mean", float("nan")))
        if ret >= TARGET:
            result["reached"] = True
            break
    seconds = time.perf_counter() - t0
    result.update(steps=steps, seconds=seconds, steps_per_s=steps / (time.perf_counter() - started),
                  mean_return=ret)  # fmt: skip
    algo.stop()
    ray.shutdown()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
