"""Packaged recipes: every one builds into a valid RunConfig; the new ones run on the cluster; slow
tests check that each reaches what its header promises.

Fast (no cluster): names, validation, overrides. Cluster smoke: every new recipe for a tiny
budget, all launched at once (one cluster for the module). Slow (``-m slow``): learning runs with
the recipes as shipped, asserting the threshold each recipe stops at.
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from rlinf_nb import recipes
from rlinf_nb.client import resolve_config
from rlinf_nb.config import ConfigError
from rlinf_nb.run_config import RunConfig

NEW = ["sac_pendulum", "crossq_pendulum", "grpo_cartpole", "reinforcepp_cartpole",
       "ppo_pushcube", "ppo_pickcube", "ppo_peginsertion", "rlpd_pushcube", "bc_peginsertion"]  # fmt: skip


# ----------------------------------------------------------------------------- fast: configs


def test_expected_recipes_are_packaged():
    assert set(NEW) | {"ppo_cartpole"} <= set(recipes.names())


@pytest.mark.parametrize("name", recipes.names())
def test_every_recipe_builds_a_valid_run_config_with_a_stop_threshold(name):
    cfg = resolve_config(name)  # what rl.launch validates with, without launching
    assert isinstance(cfg, RunConfig)
    assert (
        cfg.budget.stop_metric in ("episode_return_mean", "success_rate")
        and cfg.budget.stop_value is not None
    )
    header = resources.files(recipes).joinpath(f"{name}.yaml").read_text().splitlines()[0]
    assert header.startswith("# ") and len(header) > 40, header  # says what it does and reaches


@pytest.mark.parametrize("name", NEW)
def test_new_recipes_take_num_envs_and_env_workers_overrides(name):
    # GRPO needs the env count to be a multiple of its group size: 2 x 4 envs and groups of 4.
    extra = {"algo__group_size": 4} if name == "grpo_cartpole" else {}
    cfg = resolve_config(name, num_envs=4, env_workers=2, seed=3, **extra)
    assert (cfg.env.num_envs, cfg.placement.env.num_workers, cfg.seed) == (4, 2, 3)
    assert resolve_config(name, env__num_envs=4, placement__env__num_workers=2, **extra).env.num_envs == 4


def test_a_bad_override_names_the_key_path():
    with pytest.raises(ConfigError, match=r"^algo\.lr: got -1"):
        resolve_config("sac_pendulum", algo__lr=-1)
    with pytest.raises(ConfigError, match=r"algo\.nope"):
        resolve_config("ppo_pushcube", algo__nope=1)
    with pytest.raises(ConfigError, match=r"^algo\.demos: got 'scripted:zero'"):
        resolve_config("rlpd_pushcube", algo__demos="scripted:zero")
    with pytest.raises(ConfigError, match=r"^algo\.group_size: got 8; must divide"):
        resolve_config("grpo_cartpole", num_envs=4)
    with pytest.raises(ConfigError, match=r"^recipe: got 'sac_pendulm'"):
        resolve_config("sac_pendulm")


# ----------------------------------------------------------------------------- cluster smoke

# Tiny budgets: a couple of updates each, gradient steps reached, small CPU reservations so that all
# runs fit on the cluster at once (they share the two cores; they all start together).
SMALL = {"placement__env__num_cpus": 0.05, "placement__rollout__num_cpus": 0.05,
         "placement__actor__num_cpus": 0.05, "budget__stop_metric": None, "budget__stop_value": None,
         "checkpoint__every": 0, "linger_s": 600}  # fmt: skip
SMOKE = {
    "sac_pendulum": {"budget__total_env_steps": 192, "algo__learning_starts": 64, "algo__batch_size": 32},
    "crossq_pendulum": {"budget__total_env_steps": 192, "algo__learning_starts": 64, "algo__batch_size": 32},
    # 2 env workers x 6 envs, groups of 4: group 1 spans both workers
    "grpo_cartpole": {
        "budget__total_env_steps": 1,
        "num_envs": 6,
        "env_workers": 2,
        "algo__group_size": 4,
        "algo__rollout_steps": 64,
    },  # fmt: skip
    "reinforcepp_cartpole": {"budget__total_env_steps": 1, "algo__rollout_steps": 64},
    "ppo_pushcube": {
        "budget__total_env_steps": 64,
        "num_envs": 2,
        "env_workers": 1,
        "algo__rollout_steps": 16,
    },
    "ppo_pickcube": {
        "budget__total_env_steps": 32,
        "num_envs": 2,
        "env_workers": 1,
        "algo__rollout_steps": 16,
    },
    "ppo_peginsertion": {
        "budget__total_env_steps": 32,
        "num_envs": 2,
        "env_workers": 1,
        "algo__rollout_steps": 16,
    },
    "rlpd_pushcube": {
        "budget__total_env_steps": 96,
        "num_envs": 2,
        "algo__demos": "scripted:2",
        "algo__learning_starts": 16,
        "algo__batch_size": 32,
        "algo__utd": 0.5,
    },  # fmt: skip
    "bc_peginsertion": {  # 2 noisy demo episodes (recorded with the features), 2 short iterations
        "budget__total_env_steps": 32,
        "num_envs": 2,
        "algo__dataset": "scripted:2",
        "algo__updates_per_iter": 5,
        "algo__eval_steps": 8,
    },
}
LOSSES = {"sac_pendulum": ["critic_loss", "actor_loss"], "crossq_pendulum": ["critic_loss", "actor_loss"],
          "grpo_cartpole": ["policy_loss"], "reinforcepp_cartpole": ["policy_loss"],
          "ppo_pushcube": ["policy_loss", "value_loss"], "ppo_pickcube": ["policy_loss", "value_loss"],
          "ppo_peginsertion": ["policy_loss", "value_loss"], "rlpd_pushcube": ["critic_loss", "actor_loss"],
          "bc_peginsertion": ["bc_loss", "action_mse"]}  # fmt: skip


@pytest.fixture(scope="module")
def smoke_runs(attached):
    """Every new recipe launched at once for a tiny budget; their finished handles by recipe name."""
    import rlinf_nb as rl

    tag = uuid.uuid4().hex[:6]
    runs = {name: rl.launch(name, name=f"smoke_{name}_{tag}", **SMALL, **SMOKE[name]) for name in NEW}
    for run in runs.values():
        run.wait(timeout=600, progress=False)
    return runs


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", NEW)
def test_new_recipe_runs_on_the_cluster_with_finite_losses(smoke_runs, name):
    run = smoke_runs[name]
    st = run.status()
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    assert len(df) >= 1 and df["env_steps"].iloc[-1] >= SMOKE[name]["budget__total_env_steps"]
    for key in LOSSES[name]:
        values = df[key].dropna() if key in df else []
        assert len(values) and all(math.isfinite(v) for v in values), (key, df.columns.tolist())
    if name == "rlpd_pushcube":
        demos = run.events().query("kind == 'demos'")
        assert len(demos) == 1 and demos["episodes"].iloc[0] == 2 and demos["transitions"].iloc[0] > 0
        assert df["demo_size"].iloc[-1] == demos["transitions"].iloc[0]
    if name == "bc_peginsertion":  # the dataset holds what the policy reads: features, then the state
        from rlinf_nb.data.transitions import dataset_to_transitions

        dataset = run.events().query("kind == 'dataset'").iloc[0]
        assert dataset["episodes"] == 2
        assert dataset_to_transitions(dataset["dataset"], obs_keys="observation.state")["obs"].shape[1] == 126


@pytest.mark.timeout(900)
def test_grpo_rollout_on_the_cluster_starts_each_group_from_one_state(smoke_runs):
    """The last GRPO batch: the first observations of a group's envs are equal, groups differ,
    also for the group whose envs live on two env workers."""
    obs0 = smoke_runs["grpo_cartpole"].batch().to_local(["obs"])["obs"][0]  # [12, 4]
    groups = np.asarray(obs0).reshape(3, 4, -1)
    assert (groups == groups[:, :1]).all()
    assert len({tuple(g[0]) for g in groups}) == 3


# ----------------------------------------------------------------------------- slow: learning


def _learn(name: str, metric: str, threshold: float, timeout: float) -> str:
    """Launch recipe ``name``, wait, assert it finished with ``metric >= threshold``; the run's name."""
    import rlinf_nb as rl

    t0 = time.time()
    run = rl.launch(name, name=f"learn_{name}_{uuid.uuid4().hex[:6]}", linger_s=60)
    st = run.wait(timeout=timeout, progress=False)
    df = run.metrics()
    reached = df[metric].iloc[-1]
    print(f"\n{name}: {metric}={reached:.3f} at {int(df['env_steps'].iloc[-1])} env steps, "
          f"{len(df)} updates, {time.time() - t0:.0f} s wall (launch included)")  # fmt: skip
    assert st["state"] == "finished", st["error"]
    assert reached >= threshold, df[["env_steps", metric]].tail(10)
    return run.name


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("attached")
def test_sac_pendulum_learns():
    _learn("sac_pendulum", "episode_return_mean", -250, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("attached")
def test_crossq_pendulum_learns():
    _learn("crossq_pendulum", "episode_return_mean", -250, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("attached")
def test_grpo_cartpole_learns():
    _learn("grpo_cartpole", "episode_return_mean", 475, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("attached")
def test_reinforcepp_cartpole_learns():
    _learn("reinforcepp_cartpole", "episode_return_mean", 475, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("attached")
def test_ppo_pushcube_learns():
    _learn("ppo_pushcube", "success_rate", 0.8, timeout=3000)


def _evaluate_run_policy(run_name: str, recipe: str, episodes: int, seed: int) -> float:
    """Success rate of a run's newest checkpointed policy (its mean action) over ``episodes`` episodes of
    the ``recipe``'s env played here, in this process: 8 envs seeded ``seed + i``, each playing its first
    ``episodes / 8`` episodes."""
    import torch

    from rlinf_nb.algorithms.init_from import load_policy_from_run
    from rlinf_nb.envs import make_env
    from rlinf_nb.policies import make_policy
    from rlinf_nb.run_config import policy_kwargs

    run_cfg = resolve_config(recipe)
    kwargs = {k: v for k, v in run_cfg.env.kwargs.items() if k != "render_mode"}
    env = make_env(run_cfg.env.id, 8, seed=seed, **kwargs)
    policy_cfg = {"name": run_cfg.policy.name, "kwargs": dict(run_cfg.policy.kwargs)}
    policy = make_policy(
        policy_cfg["name"], env.observation_space, env.action_space, **policy_kwargs(policy_cfg)
    )
    load_policy_from_run(policy, run_name)
    per_env = episodes // 8
    count, success = np.zeros(8, int), np.zeros(8, int)
    obs = env.reset()
    try:
        while (count < per_env).any():
            with torch.no_grad():
                action = policy.distribution(torch.as_tensor(obs)).mode().numpy()
            res = env.step(action)
            obs = res.obs
            for j, i in enumerate(np.flatnonzero(res.terminated | res.truncated)):
                if count[i] < per_env:
                    count[i] += 1
                    success[i] += int(res.successes[j])
    finally:
        env.close()
    return success.sum() / count.sum()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("attached")
def test_bc_peginsertion_inserts_the_peg():
    """PegInsertionSide-v1 to success on CPU physx by cloning (PPO does not get there on two cores): the
    run reaches its stop threshold, and its final policy, replayed here on 40 episodes the run never saw,
    inserts the peg in most of them."""
    name = _learn("bc_peginsertion", "success_rate", 0.9, timeout=1500)
    rate = _evaluate_run_policy(name, "bc_peginsertion", episodes=40, seed=20_000)
    print(f"bc_peginsertion: replayed success {rate:.3f} over 40 episodes (seeds 20000-20007)")
    assert rate >= 0.7


# PickCube-v1 and PegInsertionSide-v1 on two CPU cores: success needs millions of env steps (ManiSkill's
# GPU baselines); what a few hundred thousand show is the dense reward climbing. Measured (NOTES.md, session
# 8), mean normalised return of the last 20 episodes: PickCube 3.3 -> 11.0 of 50 over 300k env steps
# (~440 env-steps/s), PegInsertionSide 2.4 -> 5.2 of 100 over 250k (~210 env-steps/s); success ~0.
DENSE_CLIMB = {  # recipe: (env steps, min ratio last-20 / first-10, min last-20 mean)
    "ppo_pickcube": (300_000, 2.0, 7.0),
    "ppo_peginsertion": (250_000, 1.5, 4.0),
}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("attached")
@pytest.mark.parametrize("name", sorted(DENSE_CLIMB))
def test_hard_maniskill_tasks_improve_their_dense_return(name):
    import rlinf_nb as rl

    steps, ratio, floor = DENSE_CLIMB[name]
    run = rl.launch(name, name=f"learn_{name}_{uuid.uuid4().hex[:6]}", linger_s=60,
                    budget__total_env_steps=steps)  # fmt: skip
    st = run.wait(timeout=3000, progress=False)
    assert st["state"] == "finished", st["error"]
    returns = run.metrics()["episode_return_mean"].dropna()
    first, last = returns.head(10).mean(), returns.tail(20).mean()
    print(f"\n{name}: return {first:.2f} -> {last:.2f} over {steps} env steps")
    assert last >= ratio * first and last >= floor, returns.iloc[:: max(1, len(returns) // 12)]


# env steps: RLPD's measured curve (NOTES.md, session 6) passes success 0.3 at ~3k and holds 0.35-0.65
# over 3.5k-6k; compared on the mean success of the last quarter of the budget, not one noisy row
RLPD_VS_SAC_BUDGET = 5000
# A run is deterministic per seed on one machine only: another CPU's float paths give another trajectory
# (NOTES.md, session 24: session 16's own commit scored SAC 0.4625 there and 0.5525 on an AMD EPYC). So
# the comparison is over seeds, as in bench/bench_rlpd_vs_sac.py, not one seed with a margin.
RLPD_VS_SAC_SEEDS = (0, 1, 2)


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.usefixtures("attached")
def test_rlpd_with_10_demos_beats_sac_without_demos_on_the_same_budget():
    """Issue 5: RLPD with 10 scripted demo episodes beats SAC without demos on the same budget and seeds:
    ahead on every seed (last-quarter success), and learning at all (>= 0.3)."""
    import rlinf_nb as rl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_rlpd_vs_sac import arms, summarise  # the multi-seed bench's arms and summary

    late: dict[tuple[str, int], float] = {}
    for seed in RLPD_VS_SAC_SEEDS:
        configs = arms(seed, RLPD_VS_SAC_BUDGET, demos=10)
        for name in ("rlpd", "sac"):  # sac: the same run without demos (every shared SAC field)
            t0 = time.time()
            run = rl.launch(configs[name], name=f"rlpd_vs_sac_{name}_s{seed}_{uuid.uuid4().hex[:6]}",
                            linger_s=60)  # fmt: skip
            st = run.wait(timeout=1700, progress=False)
            assert st["state"] == "finished", st["error"]
            late[name, seed] = summarise(run.metrics(), RLPD_VS_SAC_BUDGET)["late"]
            print(f"\nseed {seed} {name}: success_rate {late[name, seed]:.3f} over the last quarter, "
                  f"{time.time() - t0:.0f} s wall")  # fmt: skip
    margins = {seed: late["rlpd", seed] - late["sac", seed] for seed in RLPD_VS_SAC_SEEDS}
    print(f"rlpd - sac per seed {margins}; mean {np.mean(list(margins.values())):+.3f}")
    # measured on an AMD EPYC (session 24): seed 0 0.620 vs 0.552, seed 1 0.574 vs 0.511
    assert all(late["rlpd", seed] >= 0.3 for seed in RLPD_VS_SAC_SEEDS), late
    assert all(m > 0 for m in margins.values()), late
