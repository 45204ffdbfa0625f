"""Replay next_obs frames kept as links to obs frames (rlinf_nb.algorithms.replay): same samples, less memory."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from rlinf_nb.algorithms.replay import ReplayBuffer, segment_successors

H, W = 6, 5


class FrameStream:
    """``N`` envs stepped in segments of ``T``: frame ``k`` of an env is a unique image; an episode ends
    every ``ep`` steps, and its true last frame is one no obs ever shows (as with auto-resetting envs)."""

    def __init__(self, N: int, ep: int, seed: int = 0):
        self.N, self.ep, self.t = N, ep, 0
        self.rng = np.random.default_rng(seed)
        self.obs = self._frames()

    def _frames(self) -> np.ndarray:
        return self.rng.integers(0, 256, (self.N, H, W, 3), dtype=np.uint8)

    def segment(self, T: int) -> dict:
        obs, nxt, done = [], [], []
        for _ in range(T):
            self.t += 1
            ended = np.full(self.N, self.t % self.ep == 0)
            following, last = self._frames(), self._frames()  # the next obs; the true last obs at an end
            obs.append(self.obs)
            nxt.append(np.where(ended[:, None, None, None], last, following))
            done.append(ended)
            self.obs = following
        state = self.rng.normal(size=(T, self.N, 2)).astype(np.float32)
        return {"obs": {"cam": np.stack(obs), "state": state}, "next_obs": {"cam": np.stack(nxt), "state": state + 1},
                "actions": self.rng.normal(size=(T, self.N, 1)).astype(np.float32),
                "rewards": self.rng.normal(size=(T, self.N)).astype(np.float32),
                "terminated": np.stack(done).astype(np.float32)}  # fmt: skip


def _flat(seg: dict) -> dict:
    """``[T, N, ...]`` -> ``[T * N, ...]``, nested like the input."""
    return {k: ({kk: vv.reshape(-1, *vv.shape[2:]) for kk, vv in v.items()} if isinstance(v, dict)
                else v.reshape(-1, *v.shape[2:])) for k, v in seg.items()}  # fmt: skip


def _fill(capacity: int, segments: int, T: int = 4, N: int = 3, ep: int = 7, hints: bool = True):
    buf, stream, fed = ReplayBuffer(capacity), FrameStream(N, ep), []
    for _ in range(segments):
        seg = stream.segment(T)
        buf.extend(_flat(seg), next_of=segment_successors((T, N)) if hints else None)
        fed.append(_flat(seg))
    return buf, fed


def _recount(buf: ReplayBuffer) -> int:
    """What :meth:`ReplayBuffer.stored_bytes` keeps a running count of, summed from scratch."""
    own = sum(f.nbytes for fr in buf.next_frames.values() for f in fr.own if f is not None)
    return sum(v[: len(buf)].nbytes for v in buf.data.values()) + own


def _newest(fed: list[dict], key: str, leaf: str, n: int) -> np.ndarray:
    return np.concatenate([f[key][leaf] for f in fed])[-n:]


@pytest.mark.parametrize(
    "capacity", [13, 24, 500]
)  # 12 transitions per segment: wraps mid-segment, on a seam, never
def test_linked_frames_come_back_exactly_through_wraps(capacity):
    buf, fed = _fill(capacity, segments=10)
    n = len(buf)
    assert n == min(capacity, 120)
    ordered = buf.ordered()
    for key in ("obs", "next_obs"):
        np.testing.assert_array_equal(ordered[f"{key}/cam"], _newest(fed, key, "cam", n), err_msg=key)
        np.testing.assert_array_equal(ordered[f"{key}/state"], _newest(fed, key, "state", n))
    # sampled next frames are the ones fed, transition by transition
    idx = buf.sample_indices(200, np.random.default_rng(0))
    got = buf.gather(idx)
    start = buf.pos if len(buf) == buf.capacity else 0
    age = (idx - start) % buf.capacity  # position in oldest-first order
    np.testing.assert_array_equal(got["next_obs"]["cam"], ordered["next_obs/cam"][age])
    assert buf.stored_bytes() == _recount(buf)  # the running count survives overwrites


def test_only_frames_seen_nowhere_else_are_copies():
    T, N, ep = 4, 3, 7
    buf, fed = _fill(500, segments=10, T=T, N=N, ep=ep)
    frames = buf.next_frames["next_obs/cam"]
    own = np.array([f is not None for f in frames.own[: len(buf)]]).reshape(10, T, N)
    ended = np.stack([f["terminated"].reshape(T, N) for f in fed]) > 0
    expected = ended.copy()
    expected[:, -1] = True  # each segment's last row: its next frame arrives with the next segment
    np.testing.assert_array_equal(own, expected)
    plain, _ = _fill(500, segments=10, T=T, N=N, ep=ep, hints=False)  # no hints: every next frame a copy
    frame = H * W * 3
    assert plain.stored_bytes() - buf.stored_bytes() == (own.size - own.sum()) * frame
    assert buf.stored_bytes() < 0.75 * plain.stored_bytes()  # T = 4: a quarter of the rows, plus episode ends


def test_a_wrong_hint_costs_memory_never_correctness():
    rng = np.random.default_rng(1)
    cam = rng.integers(0, 256, (4, H, W, 3), dtype=np.uint8)
    nxt = rng.integers(0, 256, (4, H, W, 3), dtype=np.uint8)
    nxt[2] = cam[0]  # equal to an *earlier* obs frame: a link there would dangle once slot 0 is reused
    nxt[1] = cam[3]  # equal to a later one: linked
    batch = {"obs": {"cam": cam}, "next_obs": {"cam": nxt}, "rewards": np.zeros(4, np.float32)}
    buf = ReplayBuffer(4)
    buf.extend(batch, next_of=np.array([2, 3, 0, 5]))  # 0: frames differ; 2: backwards; 3: out of range
    frames = buf.next_frames["next_obs/cam"]
    assert frames.ref.tolist() == [-1, 3, -1, -1]
    buf.extend({k: {"cam": v["cam"][:1]} if isinstance(v, dict) else v[:1] for k, v in batch.items()})
    np.testing.assert_array_equal(buf.ordered()["next_obs/cam"][:3], nxt[1:])  # slot 0 reused: no harm


def test_state_dict_keeps_links_and_loads_every_format():
    buf, fed = _fill(50, segments=6)
    state = buf.state_dict()
    saved = state["next_frames"]["next_obs/cam"]
    assert len(saved["own"]) < len(buf) and "next_obs/cam" not in state["data"]  # the checkpoint is smaller
    blob = io.BytesIO()
    torch.save(state, blob)
    again = ReplayBuffer(50)
    again.load_state_dict(torch.load(io.BytesIO(blob.getvalue()), weights_only=False))
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a, b = buf.sample(64, rng_a), again.sample(64, rng_b)
    for k, v in a["next_obs"].items():
        np.testing.assert_array_equal(b["next_obs"][k], v)
    assert again.stored_bytes() == buf.stored_bytes() == _recount(again)
    # a checkpoint written before frames were linked: next_obs frames stored in full under "data"
    in_slots = buf.gather(np.arange(len(buf)))["next_obs"]["cam"]  # slot order, as the old format kept them
    old = {k: v for k, v in state.items() if k != "next_frames"}
    old["data"] = {**state["data"], "next_obs/cam": in_slots}
    legacy = ReplayBuffer(50)
    legacy.load_state_dict(old)
    for k, v in buf.ordered().items():
        np.testing.assert_array_equal(legacy.ordered()[k], v, err_msg=k)
    assert (
        legacy.stored_bytes() == _recount(legacy) > buf.stored_bytes()
    )  # old checkpoints: every frame a copy
    smaller = ReplayBuffer(20)  # another capacity: re-appended, the newest kept
    smaller.load_state_dict(state)
    for k, v in buf.ordered().items():
        np.testing.assert_array_equal(smaller.ordered()[k], v[-20:], err_msg=k)
    assert smaller.stored_bytes() == _recount(smaller)


def test_one_call_larger_than_the_capacity_keeps_the_newest_and_their_links():
    stream = FrameStream(N=2, ep=5)
    seg = _flat(stream.segment(10))  # 20 transitions into 7 slots
    buf = ReplayBuffer(7)
    buf.extend(seg, next_of=segment_successors((10, 2)))
    np.testing.assert_array_equal(buf.ordered()["next_obs/cam"], seg["next_obs"]["cam"][-7:])
    assert (buf.next_frames["next_obs/cam"].ref >= 0).any()


def test_segment_successors_point_to_the_same_env_one_step_later():
    assert segment_successors((3, 2)).tolist() == [2, 3, 4, 5, -1, -1]
    assert segment_successors((5,)) is None
