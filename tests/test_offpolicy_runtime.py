"""SAC on the real cluster: async collection (one segment in flight while the learner trains),
replay on the learner, weight sync with bounded staleness, replay buffer in the checkpoint."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

import rlinf_nb as rl
from rlinf_nb.algorithms.sac import sac_policy_kwargs

pytestmark = pytest.mark.usefixtures("attached")


def sac_config(total: int) -> dict:
    return {
        "algorithm": "sac",
        "env": {"id": "Pendulum-v1", "num_envs": 4},
        "policy": {"name": "mlp", "kwargs": sac_policy_kwargs([64, 64])},
        "algo": {"collect_steps": 16, "learning_starts": 256, "batch_size": 64, "utd": 0.25},
        "budget": {"total_env_steps": total, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 10},
        "linger_s": 30,
    }


def test_sac_runs_async_on_the_cluster_with_replay_and_checkpoints():
    name = f"sac_{uuid.uuid4().hex[:6]}"
    run = rl.launch(sac_config(1600), name=name)
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st["error"]
    df = run.metrics()
    assert df["env_steps"].iloc[-1] >= 1600
    # Every collect stage took one finished segment: 16 steps x 4 envs.
    assert set(np.diff(df["env_steps"].to_numpy())) == {64}
    assert df["replay_size"].iloc[-1] == df["env_steps"].iloc[-1]  # every transition reached the replay
    trained = df[df["replay_size"] >= 256]
    assert len(trained) and all(math.isfinite(x) for x in trained["critic_loss"])
    # Weights are synced every update and the rollout acts one segment behind the learner at most.
    assert df["policy_staleness"].max() <= 1.0 + 1e-9
    ckpt = run.run_dir.latest_checkpoint()
    state = run.run_dir.load_checkpoint(ckpt)
    learner = state["learner"]["learner"]
    assert "replay" in learner or any("replay" in k for k in learner), list(learner)
