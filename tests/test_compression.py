"""Channel compression (runtime/compression.py): bit-exact obs streams per sender and key, small
arrays passed through, resync after an aborted rollout or a restarted sender, frame drops tolerated."""

from __future__ import annotations

import numpy as np
import pytest
from rlinf_nb.runtime.compression import ChannelCompression, Encoded, ObsDecoder, ObsEncoder

from rlinf_nb.codec import MissingFrameError
from rlinf_nb.config import build


def _stream(seed: int, n: int = 12):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    for _ in range(n):
        img = img.copy()
        img[:, rng.integers(32), :, :] = rng.integers(0, 256, (2, 32, 3), dtype=np.uint8)  # a moving row
        yield {"state": rng.normal(size=(2, 5)).astype(np.float32), "cam": img}


def _cfg(**kw):
    return build(ChannelCompression, {"enabled": True, **kw})


def test_dict_obs_from_two_senders_decode_bit_exactly_and_small_arrays_pass_through():
    encoders, decoder = {0: ObsEncoder(_cfg()), 1: ObsEncoder(_cfg())}, ObsDecoder()
    for a, b in zip(_stream(0), _stream(1), strict=True):
        for sender, obs in ((0, a), (1, b)):
            sent = encoders[sender].encode(obs)
            assert isinstance(sent["cam"], Encoded) and isinstance(
                sent["state"], np.ndarray
            )  # 40 B < min_bytes
            got = decoder.decode(sent, sender)
            np.testing.assert_array_equal(got["cam"], obs["cam"])
            assert got["cam"].dtype == np.uint8 and got["state"] is obs["state"]
    stats = encoders[0].stats()
    assert stats["raw_bytes"] == 12 * 2 * 32 * 32 * 3 and stats["ratio"] < 0.5  # one changed row per frame


def test_disabled_compression_is_the_identity():
    obs = next(_stream(0))
    assert ObsEncoder(build(ChannelCompression, {})).encode(obs) is obs
    assert ObsEncoder(None).encode(obs["cam"]) is obs["cam"]


def test_an_aborted_rollout_is_repaired_by_the_keyframe_at_the_next_rollouts_start():
    enc, dec = ObsEncoder(_cfg()), ObsDecoder()
    frames = list(_stream(2))
    for obs in frames[:3]:
        dec.decode(enc.encode(obs), 0)
    enc.encode(frames[3])  # sent, never decoded (the rollout was aborted)
    with pytest.raises(MissingFrameError):
        dec.decode(enc.encode(frames[4]), 0)  # the obs path never hides a gap
    enc.restart()
    np.testing.assert_array_equal(dec.decode(enc.encode(frames[5]), 0)["cam"], frames[5]["cam"])


def test_a_restarted_sender_and_a_dropping_frames_channel_resync():
    dec = ObsDecoder(drop_missing=True)
    first, second = ObsEncoder(_cfg()), ObsEncoder(_cfg())  # the same env rank before and after a restart
    frames = list(_stream(3))
    dec.decode(first.encode(frames[0]["cam"]), 0)
    np.testing.assert_array_equal(dec.decode(second.encode(frames[1]["cam"]), 0), frames[1]["cam"])
    # A drop-oldest channel skipped a blob: None (the UI keeps its last frame) until the next keyframe.
    key8 = ObsEncoder(_cfg(codec={"keyframe_interval": 4}))
    blobs = [key8.encode(f["cam"]) for f in frames[:8]]
    got = [dec.decode(b, 1) for i, b in enumerate(blobs) if i != 1]  # blob 1 dropped
    assert got[0] is not None and got[1] is None and got[2] is None  # blobs 2, 3: deltas without a reference
    np.testing.assert_array_equal(got[3], frames[4]["cam"])  # blob 4 is a keyframe


# ----------------------------------------------------------------------------- on the cluster


@pytest.mark.usefixtures("attached")
def test_compressed_camera_observations_reach_the_policy_bit_exactly():
    """Same seed with and without ``compression.obs``: the rollout worker's values and log-probs
    (computed on what it decoded) are identical, and the obs bytes actually shrank."""
    import uuid

    import rlinf_nb as rl

    def one_rollout(compress: bool):
        run = rl.launch({
            "algorithm": "ppo", "seed": 3,
            "env": {"id": "robot:mock_arm/reach", "num_envs": 2, "kwargs": {"obs_mode": "dict", "max_steps": 6}},
            "policy": {"name": "cnn"},
            "algo": {"rollout_steps": 16, "epochs": 1, "minibatch_size": 32},
            "budget": {"total_env_steps": 32}, "checkpoint": {"every": 0},
            "compression": {"obs": {"enabled": compress, "min_bytes": 1024}},
        }, name=f"codec_{compress}_{uuid.uuid4().hex[:6]}")  # fmt: skip
        st = run.wait(timeout=600, progress=False)
        assert st["state"] == "finished", st.get("error")
        return run.batch().to_local(), run.metrics()

    plain, plain_m = one_rollout(False)
    packed, packed_m = one_rollout(True)
    cams = [k for k in plain["obs"] if k != "state"]
    assert cams and plain["obs"][cams[0]].dtype == np.uint8
    np.testing.assert_array_equal(packed["obs"][cams[0]], plain["obs"][cams[0]])  # same env stream
    np.testing.assert_array_equal(packed["values"], plain["values"])  # the policy saw the same pixels
    np.testing.assert_array_equal(packed["logprobs"], plain["logprobs"])
    assert "obs_compression" not in plain_m.columns
    assert 0 < packed_m["obs_compression"].iloc[-1] < 0.9


@pytest.mark.usefixtures("attached")
def test_compressed_dashboard_frames_arrive_decoded_and_smaller():
    import time
    import uuid

    from rlinf_nb.widgets import CARTPOLE_WITH_FRAMES

    import rlinf_nb as rl

    run = rl.launch(
        "ppo_cartpole", name=f"codec_frames_{uuid.uuid4().hex[:6]}", env__id=CARTPOLE_WITH_FRAMES,
        env__render_every=16, budget__total_env_steps=10**7, budget__stop_metric=None, budget__stop_value=None,
        compression__frames__enabled=True, linger_s=30,
    )  # fmt: skip
    try:
        deadline, frames, health = time.time() + 300, {}, {}
        while time.time() < deadline:
            frames = run.latest_frames()
            health = run.health()["channels"]["frames"]
            if frames and health.get("puts", 0) >= 5:
                break
            time.sleep(0.5)
        frame = frames[0]["frame"]
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3  # decoded
        assert health["bytes_in"] / health["puts"] < 0.5 * frame.nbytes  # what travelled was a blob
    finally:
        run.stop(wait=True)
