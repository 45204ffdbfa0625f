"""GRPO/DAPO group seeds: each rollout resets every env, the envs of a group from one shared seed.

No cluster: the stage runs against a recording context, and the env workers are constructed
in-process (they are plain classes; Ray only hosts them).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from rlinf_nb.runtime.controller import RunControllerImpl
from rlinf_nb.runtime.workers import EnvWorker, answered_at_once

from rlinf_nb.algorithms.grpo import GRPOConfig, group_reset_seeds, group_rollout_stage
from rlinf_nb.algorithms.registry import get_algorithm
from rlinf_nb.config import ConfigError


def test_group_seeds_are_shared_within_groups_fresh_per_step_and_reproducible():
    seeds = group_reset_seeds(run_seed=3, update_step=0, num_envs=12, group_size=4)
    groups = np.asarray(seeds).reshape(3, 4)
    assert (groups == groups[:, :1]).all()  # one seed per group
    assert len(set(groups[:, 0])) == 3  # groups differ
    assert seeds == group_reset_seeds(3, 0, 12, 4)  # a pure function of (run seed, step)
    assert set(seeds).isdisjoint(group_reset_seeds(3, 1, 12, 4))  # fresh every update
    assert set(seeds).isdisjoint(group_reset_seeds(4, 0, 12, 4))  # and per run seed
    assert all(0 <= s < 2**31 for s in seeds)
    with pytest.raises(ConfigError, match="algo.group_size"):
        group_reset_seeds(0, 0, num_envs=10, group_size=4)


def test_grpo_and_dapo_rollouts_ask_for_group_resets_reinforcepp_does_not():
    calls = []
    ctx = SimpleNamespace(
        cfg=SimpleNamespace(seed=0, env=SimpleNamespace(num_envs=6), placement=SimpleNamespace(env=SimpleNamespace(num_workers=2))),
        hp=GRPOConfig(group_size=4, rollout_steps=7),
        update_step=5,
        collect_rollout=lambda steps, reset_seeds=None: calls.append((steps, reset_seeds)) or {},
    )  # fmt: skip
    group_rollout_stage(ctx)
    assert calls == [(7, group_reset_seeds(0, 5, 12, 4))]
    for name in ("grpo", "dapo"):
        assert get_algorithm(name).stages[0].fn is group_rollout_stage
    assert get_algorithm("reinforcepp").stages[0].fn is not group_rollout_stage


def _first_obs(worker: EnvWorker, steps: int = 3) -> np.ndarray:
    """Run a short rollout in-process (constant actions) and return the recorded obs ``[T, N, ...]``."""
    published = {}

    def ask(msg):
        n = len(msg["obs"])
        return {"actions": np.zeros(n, np.int64), "logprobs": np.zeros(n, np.float32),
                "values": np.zeros(n, np.float32), "version": np.zeros(n, np.int64), "bootstrap_values": None}  # fmt: skip

    traj = SimpleNamespace(put=lambda key, item, **kw: published.update(item))
    worker._rollout(steps, answered_at_once(ask), traj, None, transitions=False)
    return published["batch"]["obs"]


def test_controller_resets_every_worker_with_its_slice_and_groups_start_equal():
    # Two in-process env workers of 6 CartPole envs each; groups of 4 (group 1 spans both workers).
    workers = [EnvWorker(r, 2, "env", {"id": "CartPole-v1", "num_envs": 6}, seed=0) for r in range(2)]

    class FakeGroup:
        def __len__(self):
            return len(workers)

        def call(self, method, rank_args):
            for w, args in zip(workers, rank_args, strict=True):
                getattr(w, method)(*args)
            return SimpleNamespace(get=lambda timeout=None: [None] * len(workers))

    fake = SimpleNamespace(cfg=SimpleNamespace(env=SimpleNamespace(num_envs=6)), groups={"env": FakeGroup()})
    seeds = group_reset_seeds(0, 0, num_envs=12, group_size=4)
    RunControllerImpl._reset_envs(fake, seeds)
    obs0 = np.concatenate([_first_obs(w)[0] for w in workers])  # [12, 4]: first obs of every env
    groups = obs0.reshape(3, 4, -1)
    assert (groups == groups[:, :1]).all(), "the envs of one group must start from the same state"
    firsts = groups[:, 0]
    assert not np.allclose(firsts[0], firsts[1]) and not np.allclose(firsts[1], firsts[2])
    # The next update's seeds give other starts; the same seeds give the same starts again.
    RunControllerImpl._reset_envs(fake, group_reset_seeds(0, 1, 12, 4))
    assert not np.allclose(np.concatenate([w.obs for w in workers]), obs0)
    RunControllerImpl._reset_envs(fake, seeds)
    assert np.array_equal(np.concatenate([w.obs for w in workers]), obs0)
    with pytest.raises(ValueError, match="got 5 seeds for 12 envs"):
        RunControllerImpl._reset_envs(fake, seeds[:5])


def test_run_config_rejects_groups_that_do_not_divide_the_envs():
    from rlinf_nb.client import resolve_config

    with pytest.raises(ConfigError, match=r"algo.group_size.*env.num_envs 6 x placement.env.num_workers 1"):
        resolve_config({"algorithm": "grpo", "env": {"num_envs": 6}, "algo": {"group_size": 4}})
    assert resolve_config({"algorithm": "grpo", "env": {"num_envs": 6}, "algo": {"group_size": 4}},
                          env_workers=2).algo.group_size == 4  # fmt: skip
