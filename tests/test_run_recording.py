"""Runs that record (``record:``): episodes stream from the env workers into crash-safe LeRobot
shards, merge into one dataset LeRobot itself reads, and feed behaviour cloning; the human in the
loop path keeps only the episodes a human touched, with the intervention flags per frame."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import rlinf_nb as rl
from rlinf_nb.data import merge
from rlinf_nb.data.transitions import dataset_to_transitions
from tests.test_human_runtime import hil_config

pytestmark = pytest.mark.usefixtures("attached")


def _finished(run):
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st.get("error")
    return run


def _load(path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{path.name}", root=path, video_backend="pyav")


def test_a_ppo_run_records_every_episode_into_lerobot_shards_of_each_env_worker(tmp_path):
    run = _finished(rl.launch(
        "ppo_cartpole", name=f"rec_{uuid.uuid4().hex[:6]}", num_envs=4, env_workers=2,
        budget__total_env_steps=2048, budget__stop_metric=None, budget__stop_value=None,
        record__enabled=True, record__shard_episodes=5,
    ))  # fmt: skip
    event = run.events().query("kind == 'recording'").iloc[-1]
    roots = sorted(event["roots"])
    assert [r.rsplit("/", 1)[-1] for r in roots] == ["env-0", "env-1"]
    assert all(r.startswith(str(run.path / "data")) for r in roots)
    out = run.recording(tmp_path / "cartpole")  # merges the run's data/: one root per env worker
    ds = _load(out)
    assert ds.meta.total_episodes == event["episodes"] == run.metrics()["episodes"].iloc[-1] > 10
    data = dataset_to_transitions(out, obs_keys="observation.state")
    assert data["obs"].shape[1:] == (4,) and set(np.unique(data["actions"])) <= {0, 1}
    assert np.all(data["rewards"] == 1.0)
    # CartPole episodes end by falling (terminated: next.done) or at 500 steps (truncated).
    lengths = np.bincount(data["episode_index"])
    ends = np.cumsum(lengths) - 1
    assert (
        np.all(data["terminated"][ends] | (lengths == 500))
        and data["terminated"].sum() == (lengths < 500).sum()
    )
    # Each recorded episode's frames are a real trajectory: the cart position moves by at most
    # 0.02 * velocity-ish per step, never jumps as a mixed-up interleaving of envs would.
    x = data["obs"][:, 0]
    same_ep = data["episode_index"][1:] == data["episode_index"][:-1]
    assert np.abs(np.diff(x))[same_ep].max() < 0.1


def test_the_human_in_the_loop_path_records_only_intervened_episodes_with_flags(tmp_path):
    cfg = hil_config(400)
    cfg["record"] = {"enabled": True, "episodes": "intervened", "shard_episodes": 2}
    run = _finished(rl.launch(cfg, name=f"rec_hil_{uuid.uuid4().hex[:6]}"))
    event = run.events().query("kind == 'recording'").iloc[-1]
    assert event["episodes"] > 0 and event["skipped"] > 0  # un-touched episodes were left out
    out = merge(run.path / "data", tmp_path / "hil")  # the same as run.recording(...)
    assert _load(out).meta.total_episodes == event["episodes"]
    data = dataset_to_transitions(out, extras=["complementary_info.is_intervention"])
    flags = data["is_intervention"].astype(bool)
    for ep in np.unique(data["episode_index"]):
        ep_flags = flags[data["episode_index"] == ep]
        assert ep_flags[:8].all() and not ep_flags[8:].any()  # the scripted human drives steps 0..7
    actions = data["actions"]
    assert actions.shape[1] == 3 and np.all(np.abs(actions) <= 1.0)  # the applied (clipped) actions
