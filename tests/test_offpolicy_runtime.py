"""SAC on the real cluster: async collection (one segment in flight while the learner trains),
replay on the learner, weight sync with bounded staleness, replay buffer in the checkpoint."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

import rlinf_nb as rl
from rlinf_nb.algorithms.sac import sac_policy_kwargs
from tests.helpers import learner_recovery, sigkill_worker, wait_while_running

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


def wait_for_update(run, step: int) -> None:
    wait_while_running(run, lambda st: st["update_step"] >= step, 300, f"update {step}", poll=0.2)


def test_a_killed_env_worker_mid_async_collection_is_restarted_and_no_transition_is_lost_or_doubled():
    """SAC keeps a segment in flight while it trains; SIGKILL the env worker: Ray restarts it, the run
    records the recovery, repeats the lost segment and goes on. Each collect stage still counts one whole
    segment, and the replay holds exactly the counted transitions (none from the lost segment)."""
    run = rl.launch(sac_config(10**7), name=f"sackill_{uuid.uuid4().hex[:6]}")
    try:
        wait_for_update(run, 20)
        sigkill_worker(run, "env")
        before = run.status()["update_step"]
        wait_while_running(run, lambda st: st["update_step"] >= before + 10 and (run.events()["kind"] == "recovery").any(),
                           300, "a recovery and 10 more updates")  # fmt: skip
        run.pause()
        events = run.events()
        recovery = events[events["kind"] == "recovery"]
        assert len(recovery) >= 1 and recovery.iloc[0]["group"] == "env", events.tail()
        assert recovery.iloc[0]["action"] == "restarted"
        df = run.metrics()
        assert (np.diff(df["step"].to_numpy()) == 1).all()
        assert set(np.diff(df["env_steps"].to_numpy())) == {64}
        assert df["replay_size"].iloc[-1] == df["env_steps"].iloc[-1]
    finally:
        run.stop(timeout=120)


@pytest.mark.parametrize("mode", ["direct", "colocated"])
def test_a_killed_learner_is_restored_with_its_replay_buffer_from_the_checkpoint(mode):
    """SAC's replay lives on the learner. SIGKILL the learner: the run goes back to the newest checkpoint,
    whose replay buffer comes back with it, and the segment in flight is dropped: the replay then holds
    exactly the env steps the run counts, the weights version matches ``step`` again, and the envs act
    with the restored weights, not the lost newer ones (staleness never negative)."""
    config = {**sac_config(10**7), "placement": {"env_to_rollout": mode}}
    run = rl.launch(config, name=f"saclearnerkill_{mode}_{uuid.uuid4().hex[:6]}")
    try:
        wait_for_update(run, 25)
        sigkill_worker(run, "actor")

        def restored_and_past(st):
            rec = learner_recovery(run)
            return rec if rec is not None and st["update_step"] >= int(rec["from_step"]) + 5 else None

        rec = wait_while_running(run, restored_and_past, 300, "a learner recovery and 5 more updates")
        run.pause()
        assert rec["action"] == "restored" and int(rec["from_step"]) >= 20 and int(rec["from_step"]) % 10 == 0
        df = run.metrics()
        assert (np.diff(df["step"].to_numpy()) == 1).all()
        after = df[df["step"] > int(rec["from_step"])]
        assert (after["policy_version"] == after["step"]).all()
        assert (after["policy_staleness"] >= 0).all(), after[["step", "policy_staleness"]]
        assert set(np.diff(df["env_steps"].to_numpy())) == {64}
        assert df["replay_size"].iloc[-1] == df["env_steps"].iloc[-1]
    finally:
        run.stop(timeout=120)
