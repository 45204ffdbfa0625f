"""Single-process reference PPO on CartPole-v1, built only from rlinf_nb's maths and policies.

This is the same-machine baseline for the distributed runtime and the place where the
``ppo_cartpole`` recipe's defaults are chosen. It is deliberately CleanRL-shaped: one
file, one loop, no framework.

For each seed it reports how many env steps and wall seconds it took until the mean
return of the last ``--window`` finished episodes reached ``--target`` (475 of a maximum
500), and the throughput in env steps per second. ``--sb3`` runs Stable-Baselines3 PPO
with the rl-zoo CartPole hyperparameters on the same machine, with the same stopping
rule, for comparison (``--sb3-only`` skips ours).

Usage::

    .venv/bin/python bench/ppo_reference.py                  # our PPO, seeds 0 1 2
    .venv/bin/python bench/ppo_reference.py --sb3            # ... and SB3
    .venv/bin/python bench/ppo_reference.py --n-epochs 10 --seeds 0 1 2 3 4

Truncation: the vector env uses ``autoreset_mode=SAME_STEP``, so the observation returned
for a finished env is already the reset one, and the episode's true final observation is
in ``infos["final_obs"]``. For time-limit truncations (CartPole stops at 500 steps) we
bootstrap from ``V(final_obs)`` via ``gae(..., bootstrap_values=...)``; terminations
bootstrap from 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlinf_nb.algorithms.functional import (  # noqa: E402
    entropy_bonus,
    gae,
    normalize_advantages,
    ppo_policy_loss,
    value_loss,
)
from rlinf_nb.policies import make_policy  # noqa: E402


@dataclass
class PPOSettings:
    """Hyperparameters of the reference loop; the defaults are the chosen ``ppo_cartpole`` recipe.

    Start point: rl-zoo's CartPole-v1 PPO (8 envs x 32 steps, one 256 minibatch, 20 epochs,
    gamma 0.98, lambda 0.8, lr 1e-3 linearly to 0, clip 0.2, no entropy bonus). On a 2-core
    CPU box a gradient step (~4-5 ms, mostly framework overhead) costs as much as ~40 env
    steps, so the update dominates wall time. Halving the epochs (20 -> 10) and raising the
    lr (1e-3 -> 4e-3, still linearly decayed) reaches 475 in about as many env steps
    (mean 32k vs 36k over seeds 0-11, all 12 reached; final return 500 at 1e5 steps for
    seeds 0-5) with half the gradient steps. The clip range is constant (rl-zoo anneals it).
    """

    env_id: str = "CartPole-v1"
    n_envs: int = 8
    n_steps: int = 32
    batch_size: int = 256
    n_epochs: int = 10
    gamma: float = 0.98
    gae_lambda: float = 0.8
    lr: float = 4e-3
    anneal_lr: bool = True  # linear decay to 0 over the schedule horizon
    clip_eps: float = 0.2
    anneal_clip: bool = False  # linear decay of the clip range (rl-zoo: lin_0.2)
    clip_vloss: float | None = None  # value clipping off (SB3 default)
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True  # per minibatch
    adam_eps: float = 1e-5
    adam_fused: bool = True  # torch's fused CPU Adam: same maths, ~2x cheaper step for tiny nets
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    total_steps: int = 100_000  # env-step budget
    anneal_steps: int = 0  # horizon of the lr/clip schedules; 0 = total_steps
    target: float = 475.0
    window: int = 20


PRESETS: dict[str, dict] = {
    "recipe": {},
    "zoo": {"n_epochs": 20, "lr": 1e-3, "anneal_clip": True},
}


@dataclass
class Result:
    impl: str
    seed: int
    reached: bool
    steps: int  # env steps when the target was first reached (else: the budget)
    seconds: float  # wall seconds from the first reset until then
    steps_per_s: float
    mean_return: float  # mean return of the last `window` episodes at that moment
    episodes: int  # episodes finished by then
    cpu_seconds: float = float("nan")  # process CPU time over the same span (robust to a busy machine)
    update_seconds: float = float("nan")  # of `seconds`, wall time in GAE + gradient updates
    final_mean_return: float = float("nan")  # at the end of the budget, when not stopping at the target


def _make_env(env_id: str):
    def thunk():
        return gym.make(env_id)

    return thunk


def train_ppo(cfg: PPOSettings, seed: int, verbose: bool = False, stop_at_target: bool = True) -> Result:
    """Train until the target (or, with ``stop_at_target=False``, the whole budget)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = gym.vector.SyncVectorEnv(
        [_make_env(cfg.env_id) for _ in range(cfg.n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    policy = make_policy(
        "mlp",
        envs.single_observation_space,
        envs.single_action_space,
        hidden_sizes=cfg.hidden,
        activation=cfg.activation,
    )
    params = list(policy.parameters())
    optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps, fused=cfg.adam_fused or None)

    T, N = cfg.n_steps, cfg.n_envs
    batch = T * N
    obs_shape = envs.single_observation_space.shape
    obs_buf = torch.zeros((T, N, *obs_shape))
    act_buf = torch.zeros((T, N), dtype=torch.long)
    logp_buf = torch.zeros((T, N))
    val_buf = torch.zeros((T, N))
    rew_buf = torch.zeros((T, N))
    done_buf = torch.zeros((T, N), dtype=torch.bool)
    trunc_buf = torch.zeros((T, N), dtype=torch.bool)
    boot_buf = torch.zeros((T, N))  # V(final obs) of episodes truncated at that step

    ep_returns: deque[float] = deque(maxlen=cfg.window)
    ep_ret = np.zeros(N)
    n_episodes = 0
    global_step = 0
    update_seconds = 0.0
    reached: Result | None = None
    horizon = cfg.anneal_steps or cfg.total_steps

    t0, c0 = time.perf_counter(), time.process_time()
    obs_np, _ = envs.reset(seed=seed)
    obs = torch.from_numpy(obs_np)
    while global_step < cfg.total_steps and not (reached and stop_at_target):
        frac = max(1.0 - global_step / horizon, 0.0)
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * cfg.lr
        clip_eps = cfg.clip_eps * frac if cfg.anneal_clip else cfg.clip_eps

        # ---------------------------------------------------------------- rollout
        for t in range(T):
            action, logp, value = policy.act(obs)
            obs_buf[t] = obs
            act_buf[t] = action
            logp_buf[t] = logp
            val_buf[t] = value
            next_obs, reward, terminated, truncated, infos = envs.step(action.numpy())
            global_step += N
            rew_buf[t] = torch.from_numpy(reward)
            done = terminated | truncated
            done_buf[t] = torch.from_numpy(done)
            trunc_buf[t] = torch.from_numpy(truncated)
            if truncated.any():
                # SAME_STEP autoreset: next_obs is already the reset obs; the true last one is here.
                final = torch.from_numpy(np.stack(infos["final_obs"][truncated]))
                with torch.no_grad():
                    boot_buf[t, torch.from_numpy(truncated)] = policy.value(final)
            ep_ret += reward
            if done.any():
                for i in np.flatnonzero(done):
                    ep_returns.append(float(ep_ret[i]))
                    ep_ret[i] = 0.0
                    n_episodes += 1
                if reached is None and len(ep_returns) >= cfg.window and np.mean(ep_returns) >= cfg.target:
                    seconds = time.perf_counter() - t0
                    reached = Result(
                        "ours",
                        seed,
                        True,
                        global_step,
                        seconds,
                        global_step / seconds,
                        float(np.mean(ep_returns)),
                        n_episodes,
                        time.process_time() - c0,
                        update_seconds,
                    )
                    if stop_at_target:
                        break
            obs = torch.from_numpy(next_obs)
        if reached and stop_at_target:
            break

        # ---------------------------------------------------------------- advantages
        tu = time.perf_counter()
        with torch.no_grad():
            last_values = policy.value(obs)
            advantages, returns = gae(
                rew_buf, val_buf, done_buf, trunc_buf, last_values, boot_buf, cfg.gamma, cfg.gae_lambda
            )

        # ---------------------------------------------------------------- update
        b_obs = obs_buf.reshape(batch, *obs_shape)
        b_act = act_buf.reshape(batch)
        b_logp = logp_buf.reshape(batch)
        b_adv = advantages.reshape(batch)
        b_ret = returns.reshape(batch)
        b_val = val_buf.reshape(batch)
        for _epoch in range(cfg.n_epochs):
            perm = torch.randperm(batch)
            for start in range(0, batch, cfg.batch_size):
                idx = perm[start : start + cfg.batch_size]
                new_logp, entropy, new_val = policy.evaluate(b_obs[idx], b_act[idx])
                adv = b_adv[idx]
                if cfg.norm_adv:
                    adv = normalize_advantages(adv)
                pg = ppo_policy_loss(new_logp, b_logp[idx], adv, clip_eps)
                v_loss = value_loss(new_val, b_val[idx], b_ret[idx], clip_eps=cfg.clip_vloss)
                loss = pg.loss + cfg.vf_coef * v_loss
                if cfg.ent_coef:
                    loss = loss - cfg.ent_coef * entropy_bonus(entropy)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True)
                optimizer.step()
        update_seconds += time.perf_counter() - tu
        if verbose:
            mean = float(np.mean(ep_returns)) if ep_returns else float("nan")
            print(
                f"  step {global_step:7d}  mean_ret {mean:6.1f}  kl {pg.approx_kl.item():.4f}  "
                f"clipfrac {pg.clip_fraction.item():.3f}  vloss {v_loss.item():.3f}",
                flush=True,
            )

    envs.close()
    mean = float(np.mean(ep_returns)) if ep_returns else float("nan")
    if reached is not None:
        if not stop_at_target:
            reached.final_mean_return = mean
        return reached
    seconds = time.perf_counter() - t0
    return Result(
        "ours",
        seed,
        False,
        global_step,
        seconds,
        global_step / seconds,
        mean,
        n_episodes,
        time.process_time() - c0,
        update_seconds,
        mean,
    )


def train_sb3(
    seed: int,
    target: float = 475.0,
    window: int = 20,
    total_steps: int = 100_000,
    stop_at_target: bool = True,
) -> Result:
    """SB3 PPO with rl-zoo's CartPole-v1 hyperparameters, stopped by the same rule.

    rl-zoo (hyperparams/ppo.yml): n_envs 8, n_timesteps 1e5, n_steps 32, batch_size 256,
    gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, learning_rate lin_1e-3,
    clip_range lin_0.2; everything else SB3 defaults (64x64 tanh, separate actor/critic,
    orthogonal init, vf_coef 0.5, max_grad_norm 0.5, per-minibatch advantage normalisation).
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    def linear(initial: float):
        return lambda progress_remaining: progress_remaining * initial

    class StopAtReturn(BaseCallback):
        """Stop when the mean of the last `window` Monitor episode returns reaches `target`."""

        def __init__(self):
            super().__init__()
            self.returns: deque[float] = deque(maxlen=window)
            self.episodes = 0
            self.reached: Result | None = None

        def _on_step(self) -> bool:
            # Monitor's "episode" infos of this very step (model.ep_info_buffer lags one step).
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.returns.append(float(ep["r"]))
                    self.episodes += 1
            if self.reached is None and len(self.returns) >= window and np.mean(self.returns) >= target:
                seconds = time.perf_counter() - t0
                steps = self.num_timesteps
                self.reached = Result(
                    "sb3",
                    seed,
                    True,
                    steps,
                    seconds,
                    steps / seconds,
                    float(np.mean(self.returns)),
                    self.episodes,
                    time.process_time() - c0,
                )
                return not stop_at_target
            return True

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    callback = StopAtReturn()
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=total_steps, callback=callback)
    env.close()
    mean = float(np.mean(callback.returns)) if callback.returns else float("nan")
    if callback.reached is not None:
        if not stop_at_target:
            callback.reached.final_mean_return = mean
        return callback.reached
    seconds = time.perf_counter() - t0
    steps = model.num_timesteps
    return Result(
        "sb3",
        seed,
        False,
        steps,
        seconds,
        steps / seconds,
        mean,
        callback.episodes,
        time.process_time() - c0,
        final_mean_return=mean,
    )


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, PPOSettings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="recipe",
        help="starting hyperparameters (flags below override them): recipe = the defaults, "
        "zoo = rl-zoo's exactly (20 epochs, lr lin_1e-3, clip lin_0.2), to compare with --sb3",
    )
    parser.add_argument(
        "--sb3", action="store_true", help="also run Stable-Baselines3 PPO (rl-zoo hyperparameters)"
    )
    parser.add_argument("--sb3-only", action="store_true", help="run only Stable-Baselines3")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads (1 is fastest for tiny nets)"
    )
    parser.add_argument("--verbose", action="store_true", help="print one line per PPO update")
    parser.add_argument(
        "--no-stop", action="store_true", help="keep training to the budget after reaching the target"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    defaults = PPOSettings()
    settings = parser.add_argument_group("PPO settings (default: the recipe, or the --preset)")
    for field in dataclasses.fields(PPOSettings):
        flag = "--" + field.name.replace("_", "-")
        value = getattr(defaults, field.name)
        kwargs: dict = {"default": argparse.SUPPRESS, "help": f"default {value!r}"}
        if isinstance(value, bool):
            settings.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), metavar="BOOL", **kwargs
            )
        elif isinstance(value, tuple):
            settings.add_argument(flag, type=int, nargs="+", **kwargs)
        elif field.name == "clip_vloss":
            settings.add_argument(flag, type=lambda s: None if s.lower() == "none" else float(s), **kwargs)
        else:
            settings.add_argument(flag, type=type(value), **kwargs)
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(PPOSettings) if hasattr(args, f.name)}
    if "hidden" in given:
        given["hidden"] = tuple(given["hidden"])
    cfg = dataclasses.replace(defaults, **{**PRESETS[args.preset], **given})
    return args, cfg


def _print_results(results: list[Result]) -> None:
    print(
        f"{'impl':5s} {'seed':>4s} {'reached':>7s} {'steps':>7s} {'wall_s':>7s} {'cpu_s':>6s} {'steps/s':>7s} "
        f"{'mean_ret':>8s} {'episodes':>8s} {'final_ret':>9s}"
    )
    for r in results:
        print(
            f"{r.impl:5s} {r.seed:4d} {str(r.reached):>7s} {r.steps:7d} {r.seconds:7.2f} {r.cpu_seconds:6.2f} "
            f"{r.steps_per_s:7.0f} {r.mean_return:8.1f} {r.episodes:8d} {r.final_mean_return:9.1f}"
        )
    for impl in sorted({r.impl for r in results}):
        rs = [r for r in results if r.impl == impl]
        ok = [r for r in rs if r.reached]
        if ok:
            print(
                f"{impl}: reached {len(ok)}/{len(rs)}; mean steps {np.mean([r.steps for r in ok]):.0f}, "
                f"mean wall s {np.mean([r.seconds for r in ok]):.2f} (max {max(r.seconds for r in ok):.2f}), "
                f"mean cpu s {np.mean([r.cpu_seconds for r in ok]):.2f}, "
                f"mean steps/s {np.mean([r.steps_per_s for r in ok]):.0f}"
            )
        else:
            print(f"{impl}: reached 0/{len(rs)}")


def main(argv: list[str] | None = None) -> list[Result]:
    args, cfg = _parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, gymnasium {gym.__version__}, threads {args.threads}")
    results: list[Result] = []
    if not args.sb3_only:
        print("ours:", json.dumps(dataclasses.asdict(cfg)))
    if args.sb3 or args.sb3_only:
        import stable_baselines3

        print(f"sb3 {stable_baselines3.__version__}: rl-zoo CartPole-v1 hyperparameters")
    # Interleave ours and SB3 per seed, so both see the same background load on a shared box.
    for seed in args.seeds:
        if not args.sb3_only:
            r = train_ppo(cfg, seed, verbose=args.verbose, stop_at_target=not args.no_stop)
            results.append(r)
            print(
                f"  ours seed {seed}: reached={r.reached} steps={r.steps} wall_s={r.seconds:.2f} "
                f"cpu_s={r.cpu_seconds:.2f} steps/s={r.steps_per_s:.0f}",
                flush=True,
            )
        if args.sb3 or args.sb3_only:
            r = train_sb3(seed, cfg.target, cfg.window, total_steps=100_000, stop_at_target=not args.no_stop)
            results.append(r)
            print(
                f"  sb3  seed {seed}: reached={r.reached} steps={r.steps} wall_s={r.seconds:.2f} "
                f"cpu_s={r.cpu_seconds:.2f} steps/s={r.steps_per_s:.0f}",
                flush=True,
            )
    _print_results(results)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"settings": dataclasses.asdict(cfg), "results": [dataclasses.asdict(r) for r in results]},
                indent=1,
            )
        )
    return results


if __name__ == "__main__":
    main()
