"""rlinf_nb.data: sharded LeRobot recording, crash safety, merge/filter/info, transitions.

Every dataset written here is read back by LeRobot itself (``LeRobotDataset(..., video_backend=
"pyav")``) and compared value by value with what was recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from rlinf_nb.config import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

# The episodes recorded below; exec'd here and in the SIGKILLed subprocess, so both agree.
GEN = textwrap.dedent(
    """
    import numpy as np

    FEATURES = {
        "observation.images.cam": {"dtype": "image", "shape": (16, 16, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (3,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }

    def make_episode(i):
        rng = np.random.default_rng(i)
        n = 4 + (3 * i) % 5
        frames = [
            {
                "observation.images.cam": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
                "observation.state": rng.standard_normal(3).astype(np.float32),
                "action": rng.standard_normal(2).astype(np.float32),
                "reward": float(rng.random()),
                "done": t == n - 1 and i % 3 != 2,
                "intervention": i % 2 == 1 and t == 1,
            }
            for t in range(n)
        ]
        return frames, f"task-{i % 2}", i % 2 == 0  # frames, task, success

    def record(rec, i):
        frames, task, success = make_episode(i)
        for f in frames:
            rec.add_frame(f)
        return rec.end_episode(task=task, success=success)
    """
)
G: dict = {}
exec(GEN, G)  # noqa: S102 - our own generator code
make_episode, record, FEATURES = G["make_episode"], G["record"], G["FEATURES"]


def load(path: Path):
    from rlinf_nb.data import open_dataset

    ds = open_dataset(path)
    assert ds.video_backend == "pyav"
    return ds


def assert_dataset_holds(path: Path, episode_ids: list[int]) -> None:
    """LeRobot loads ``path``; its episodes are ``make_episode(i)`` for ``episode_ids``, in order,
    numbered 0.. with contiguous frame indices, every value equal to what was recorded."""
    ds = load(path)
    expected = [make_episode(i) for i in episode_ids]
    assert ds.num_episodes == len(expected)
    assert ds.num_frames == sum(len(f) for f, _, _ in expected)
    j = 0
    for ep, (frames, task, success) in enumerate(expected):
        for t, f in enumerate(frames):
            item = ds[j]
            assert int(item["index"]) == j and int(item["episode_index"]) == ep
            assert int(item["frame_index"]) == t and item["task"] == task
            img = (item["observation.images.cam"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            np.testing.assert_array_equal(img, f["observation.images.cam"])
            np.testing.assert_array_equal(item["observation.state"].numpy(), f["observation.state"])
            np.testing.assert_array_equal(item["action"].numpy(), f["action"])
            assert item["next.reward"].item() == np.float32(f["reward"])
            assert bool(item["next.done"]) == f["done"]
            assert bool(item["complementary_info.is_intervention"]) == f["intervention"]
            assert bool(item["next.success"]) == (success and t == len(frames) - 1)
            j += 1


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    from rlinf_nb.data import Recorder

    root = tmp_path_factory.mktemp("data") / "rec"
    with Recorder(root, fps=10, features=FEATURES, shard_episodes=2) as rec:
        for i in range(5):
            assert record(rec, i) == i
    return root


@pytest.fixture(scope="module")
def merged(recording: Path) -> Path:
    from rlinf_nb.data import merge

    return merge(recording, recording.parent / "merged")


def test_recorder_writes_finalized_shards_lerobot_reads(recording: Path):
    from rlinf_nb.data import info

    names = sorted(p.name for p in recording.iterdir() if p.name.startswith("shard-"))
    assert names == ["shard-000000", "shard-000001", "shard-000002"]
    marker = json.loads((recording / "shard-000001" / ".complete").read_text())
    assert (
        marker["episodes"] == 2 and marker["first_episode"] == 2 and marker["tasks"] == ["task-0", "task-1"]
    )
    assert_dataset_holds(recording / "shard-000000", [0, 1])
    assert_dataset_holds(recording / "shard-000002", [4])
    d = info(recording)
    assert (d.kind, d.episodes, d.frames) == ("recording", 5, sum(len(make_episode(i)[0]) for i in range(5)))
    assert d.shards_unfinished == [] and len(d.shards_finalized) == 3 and not d.writer_active
    assert sorted(d.tasks) == ["task-0", "task-1"]
    assert d.features["observation.images.cam"] == {"dtype": "image", "shape": [16, 16, 3]}


def test_merge_renumbers_and_round_trips(merged: Path):
    assert_dataset_holds(merged, [0, 1, 2, 3, 4])
    from rlinf_nb.data import merge

    with pytest.raises(FileExistsError):
        merge(merged.parent / "rec", merged)


def test_filter_by_flags_length_task_and_expression(merged: Path, tmp_path: Path):
    from rlinf_nb.data import episode_summaries, filter_dataset

    s = episode_summaries(merged)
    assert [x.length for x in s] == [4, 7, 5, 8, 6]
    assert [x.success for x in s] == [True, False, True, False, True]
    assert [x.intervention for x in s] == [False, True, False, True, False]
    assert [x.done for x in s] == [True, True, False, True, True]
    assert s[1].intervention_frames == 1
    assert s[0].total_reward == pytest.approx(
        sum(np.float32(f["reward"]) for f in make_episode(0)[0]), rel=1e-6
    )

    assert filter_dataset(merged, tmp_path / "ok", success=True) == [0, 2, 4]
    assert_dataset_holds(tmp_path / "ok", [0, 2, 4])
    assert load(tmp_path / "ok").meta.total_tasks == 1  # only the kept episodes' task

    assert filter_dataset(merged, tmp_path / "human", intervention=True, min_length=8) == [3]
    assert_dataset_holds(tmp_path / "human", [3])
    assert filter_dataset(merged, tmp_path / "len", min_length=5, max_length=7, task="task-0") == [2, 4]
    assert filter_dataset(merged, tmp_path / "expr", where=lambda e: e.index in (1, 4)) == [1, 4]
    assert_dataset_holds(tmp_path / "expr", [1, 4])
    assert filter_dataset(merged, tmp_path / "all", min_length=1) == [0, 1, 2, 3, 4]  # copied as is
    assert_dataset_holds(tmp_path / "all", [0, 1, 2, 3, 4])

    with pytest.raises(ValueError, match="no episode"):
        filter_dataset(merged, tmp_path / "none", max_length=2)
    with pytest.raises(ValueError, match="recording root"):
        filter_dataset(merged.parent / "rec", tmp_path / "x")
    with pytest.raises(ValueError, match="names you can use"):
        filter_dataset(merged, tmp_path / "bad", where="lenght > 3")
    assert not (tmp_path / "none").exists() and not (tmp_path / "bad").exists()


def test_cli_info_merge_filter(recording: Path, tmp_path: Path, capsys):
    from rlinf_nb.cli import main

    assert main(["data", "info", str(recording), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["episodes"] == 5 and len(d["shards_finalized"]) == 3
    assert main(["data", "merge", str(recording), str(tmp_path / "m")]) == 0
    where = "not intervention and 'task-0' in task and length < 6"
    assert main(["data", "filter", str(tmp_path / "m"), str(tmp_path / "f"), "--where", where]) == 0
    assert_dataset_holds(tmp_path / "f", [0, 2])
    assert main(["data", "filter", str(tmp_path / "m"), str(tmp_path / "g"), "--failed", "--intervened"]) == 0
    capsys.readouterr()
    assert main(["data", "info", str(tmp_path / "g"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kind"], d["episodes"], d["tasks"]) == ("dataset", 2, ["task-1"])
    assert main(["data", "info", str(tmp_path / "nope")]) == 2


def test_transitions_and_demo_buffer(merged: Path):
    from rlinf_nb.algorithms.replay import ReplayBuffer
    from rlinf_nb.data import dataset_to_transitions, load_into_buffer

    tr = dataset_to_transitions(merged, extras=["complementary_info.is_intervention"])
    eps = [make_episode(i)[0] for i in range(5)]
    frames = [f for ep in eps for f in ep]
    n = len(frames)
    assert tr["actions"].shape == (n, 2) and tr["rewards"].dtype == np.float32
    assert tr["obs"]["images.cam"].shape == (n, 16, 16, 3) and tr["obs"]["images.cam"].dtype == np.uint8
    np.testing.assert_array_equal(tr["obs"]["state"], np.stack([f["observation.state"] for f in frames]))
    np.testing.assert_array_equal(
        tr["obs"]["images.cam"], np.stack([f["observation.images.cam"] for f in frames])
    )
    # next_obs is the next frame's obs within an episode, the frame's own at the episode's end
    ends = np.cumsum([len(e) for e in eps]) - 1
    for t in range(n):
        want = t if t in ends else t + 1
        np.testing.assert_array_equal(tr["next_obs"]["state"][t], frames[want]["observation.state"])
    np.testing.assert_array_equal(tr["terminated"], [f["done"] for f in frames])
    assert np.flatnonzero(tr["truncated"]).tolist() == [ends[2]]  # episode 2 ends without done
    np.testing.assert_array_equal(tr["is_intervention"], [f["intervention"] for f in frames])

    only_state = dataset_to_transitions(merged, obs_keys="observation.state", drop_truncated=True)
    assert only_state["obs"].shape == (n - 1, 3)
    buf = ReplayBuffer(1000)
    assert load_into_buffer(merged, buf, obs_keys="observation.state") == n
    assert len(buf) == n and buf.fields == ["actions", "next_obs", "obs", "rewards", "terminated"]


def test_video_shards_by_time_merge_and_read_back(tmp_path: Path):
    from rlinf_nb.data import Recorder, image, info, merge, vector

    feats = {"observation.images.front": image(32, 32), "action": vector(1)}
    colours = []
    # shard_seconds tiny: every episode end finalizes its shard
    with Recorder(
        tmp_path / "rec", fps=10, features=feats, video=True, shard_seconds=1e-6, done=False
    ) as rec:
        for ep in range(2):
            for t in range(6):
                c = 40 * ep + 20 * t
                colours.append(c)
                rec.add_frame(
                    {
                        "observation.images.front": np.full((32, 32, 3), c, np.uint8),
                        "action": [t],
                        "reward": 0,
                    }
                )
            rec.end_episode(task=f"v{ep}")
    assert info(tmp_path / "rec").shards_finalized == ["shard-000000", "shard-000001"]
    out = merge(tmp_path / "rec", tmp_path / "m")
    ds = load(out)
    assert ds.meta.video_keys == ["observation.images.front"] and ds.num_episodes == 2
    assert ds.hf_dataset.with_format("numpy")[:]["index"].tolist() == list(range(12))
    for j, c in enumerate(colours):
        item = ds[j]
        frame = item["observation.images.front"].numpy() * 255
        assert abs(frame.mean() - c) < 3, (j, frame.mean(), c)  # lossy codec, flat frames
        assert item["action"].item() == j % 6 and int(item["episode_index"]) == j // 6
    # SVT-AV1 makes the encoding thread SCHED_FIFO 99 when run as root; the recorder undoes that
    # (a real-time process that spins starves the whole machine).
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


_CHILD = """
import sys, time
from rlinf_nb.data import Recorder
{gen}
rec = Recorder(sys.argv[1], fps=10, features=FEATURES, shard_episodes=2)
for i in range(5):
    record(rec, i)
frames, _, _ = make_episode(5)
for f in frames[:3]:
    rec.add_frame(f)
print("READY", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
def test_sigkill_mid_episode_keeps_every_finalized_episode(tmp_path: Path):
    from rlinf_nb.data import Recorder, info, merge

    root = tmp_path / "rec"
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(gen=GEN))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "READY" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "READY" in line, "the recorder subprocess never got mid-episode"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()

    d = info(root)
    # episodes 0-3 are in finalized shards; episode 4 (saved) and 5 (half) were in the open shard
    assert (d.shards_finalized, d.shards_unfinished, d.episodes) == (
        ["shard-000000", "shard-000001"],
        ["shard-000002"],
        4,
    )
    assert not d.writer_active
    assert_dataset_holds(merge(root, tmp_path / "m1"), [0, 1, 2, 3])

    with Recorder(root, fps=10, features=FEATURES, shard_episodes=2) as rec:
        assert [p.name for p in rec.recovered] == ["shard-000002"]
        assert rec.episodes_written == 4
        assert record(rec, 6) == 4
        assert rec.current_shard.name == "shard-000003"  # numbering continues past the dead shard
    d = info(root)
    assert (
        d.shards_finalized == ["shard-000000", "shard-000001", "shard-000003"] and d.shards_unfinished == []
    )
    assert d.shards_quarantined == ["shard-000002"]
    assert_dataset_holds(merge(root, tmp_path / "m2"), [0, 1, 2, 3, 6])


def test_recorder_validation_and_lock(tmp_path: Path):
    from rlinf_nb.data import Recorder, image

    with pytest.raises(ValueError, match="dtype 'float16' is not supported"):
        Recorder(tmp_path / "a", 10, {"x": {"dtype": "float16", "shape": (2,)}})
    with pytest.raises(ValueError, match="'index' is reserved"):
        Recorder(tmp_path / "a", 10, {"index": (1,)})
    with pytest.raises(ValueError, match="too small for vcodec 'libsvtav1'"):
        Recorder(tmp_path / "a", 10, {"cam": image(16, 16)}, video=True)
    with pytest.raises(ConfigError, match="shard_episodes"):
        Recorder(tmp_path / "a", 10, FEATURES, shard_episodes=0)
    with pytest.raises(ConfigError, match="on_unfinished.*allowed values"):
        Recorder(tmp_path / "a", 10, FEATURES, on_unfinished="keep")
    with pytest.raises(ValueError, match="fps"):
        Recorder(tmp_path / "a", 0, FEATURES)

    rec = Recorder(tmp_path / "b", 10, FEATURES)
    frame = make_episode(0)[0][0]
    with pytest.raises(ValueError, match="missing feature 'action'"):
        rec.add_frame({k: v for k, v in frame.items() if k != "action"})
    with pytest.raises(ValueError, match="'observation.state' has shape"):
        rec.add_frame({**frame, "observation.state": np.zeros(4)})
    with pytest.raises(ValueError, match="unknown key 'speed'"):
        rec.add_frame({**frame, "speed": 1.0})
    with pytest.raises(RuntimeError, match="another Recorder"):
        Recorder(tmp_path / "b", 10, FEATURES)
    rec.add_frame(frame)
    with pytest.warns(UserWarning, match="discarding an unfinished episode"):
        rec.close()
    assert not any(p.name.startswith("shard-") for p in (tmp_path / "b").iterdir())  # nothing was saved

    with Recorder(tmp_path / "b", 10, FEATURES) as rec:
        assert rec.end_episode() is None  # nothing to save
        rec.add_frame(frame)
        with pytest.raises(RuntimeError, match="episode is in progress"):
            rec.flush()
        rec.discard_episode()
        assert record(rec, 0) == 0
        assert rec.flush().name == "shard-000000" and rec.current_shard is None
    with pytest.raises(ValueError, match="other features"):
        Recorder(tmp_path / "b", 10, {**FEATURES, "action": (3,)})
    with pytest.raises(ValueError, match="fps=10"):
        Recorder(tmp_path / "b", 30, FEATURES)
