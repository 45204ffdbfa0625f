"""Lossless observation codec: bit-exact round trips, resync after lost frames, corrupt input."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf_nb import codec
from rlinf_nb.codec import (
    CodecConfig,
    CodecError,
    FrameDecoder,
    FrameEncoder,
    MissingFrameError,
    read_header,
)
from rlinf_nb.config import ConfigError, build

FAST = settings(
    deadline=None, derandomize=True, max_examples=80, suppress_health_check=[HealthCheck.too_slow]
)

DTYPES = [
    np.dtype(code)
    for code in (
        "?", "u1", "i1", "<u2", ">u2", "<i2", "<u4", "<i4", ">i4", "<u8", "<i8",
        "<f2", "<f4", ">f4", "<f8", ">f8", "<c8", "<c16", "<M8[ns]", "<m8[s]",
    )
]  # fmt: skip

configs = st.builds(
    CodecConfig,
    compressor=st.sampled_from(["zstd", "lz4", "none"]),
    level=st.sampled_from([0, 1, 3]),
    keyframe_interval=st.integers(1, 5),
    predictor=st.sampled_from(["auto", "previous", "denoise"]),
    delta=st.sampled_from(["sub", "xor"]),
    byte_planes=st.booleans(),
    spatial_keyframes=st.booleans(),
    tile=st.sampled_from([2, 3, 8]),
)


def assert_identical(decoded: np.ndarray, original: np.ndarray) -> None:
    """Same dtype (byte order included), same shape, same bytes (NaN payloads, -0.0...)."""
    assert decoded.dtype == original.dtype
    assert decoded.shape == original.shape
    assert decoded.tobytes() == np.ascontiguousarray(original).tobytes()


def roundtrip(frames: list[np.ndarray], config: CodecConfig | None = None) -> list[bytes]:
    """Encode ``frames`` as one stream, decode in order, check every frame; return the blobs."""
    encoder, decoder = FrameEncoder(config, stream_id=7), FrameDecoder()
    blobs = [encoder.encode(frame) for frame in frames]
    for frame, blob in zip(frames, blobs, strict=True):
        assert_identical(decoder.decode(blob), frame)
    return blobs


@st.composite
def streams(draw: st.DrawFn, max_frames: int = 5) -> list[np.ndarray]:
    """A few frames of one dtype and shape: random, repeated, or sparsely changed."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    frames = [draw(hnp.arrays(dtype, shape))]
    for _ in range(draw(st.integers(0, max_frames - 1))):
        kind = draw(st.sampled_from(["fresh", "repeat", "sparse"]))
        if kind == "fresh":
            frames.append(draw(hnp.arrays(dtype, shape)))
        elif kind == "repeat":
            frames.append(frames[-1].copy())
        else:
            changed = frames[-1].copy()
            if changed.size:
                index = draw(st.integers(0, changed.size - 1))
                changed.reshape(-1)[index] = draw(hnp.arrays(dtype, ())).item()
            frames.append(changed)
    return frames


@st.composite
def image_streams(draw: st.DrawFn) -> list[np.ndarray]:
    """uint8 HxWxC (or HxW) frames: a static scene with sensor noise and a moving block."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    height, width = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    shape = (height, width) if draw(st.booleans()) else (height, width, draw(st.integers(1, 4)))
    scene = rng.integers(0, 256, shape, dtype=np.uint8)
    sigma = draw(st.sampled_from([0.0, 1.0, 3.0, 40.0]))
    frames = []
    for t in range(draw(st.integers(1, 8))):
        frame = scene.astype(np.float64) + rng.normal(0.0, sigma, shape)
        frame[t % height : t % height + 3, : width // 2] = 255 - 20 * t
        frames.append(np.clip(np.rint(frame), 0, 255).astype(np.uint8))
    return frames


# ----------------------------------------------------------------------------- round trips


@FAST
@given(frames=streams(), config=configs)
def test_roundtrip_any_dtype_and_shape(frames: list[np.ndarray], config: CodecConfig) -> None:
    roundtrip(frames, config)


@FAST
@given(frames=image_streams(), config=configs)
def test_roundtrip_noisy_images_every_predictor(frames: list[np.ndarray], config: CodecConfig) -> None:
    roundtrip(frames, config)


@pytest.mark.parametrize("value", [0, 1, 127, 255])
def test_constant_frames_compress_to_almost_nothing(value: int) -> None:
    frames = [np.full((64, 64, 3), value, np.uint8)] * 10
    blobs = roundtrip(frames)
    assert all(len(b) < 200 for b in blobs)


@pytest.mark.parametrize(
    "frame",
    [
        np.array(3.5),
        np.array(True),
        np.zeros((0,), np.float32),
        np.zeros((3, 0, 2), np.uint8),
        np.zeros((), "u8"),
    ],
    ids=["0d-float", "0d-bool", "empty-1d", "empty-3d", "0d-uint64"],
)
def test_zero_dimensional_and_empty(frame: np.ndarray) -> None:
    roundtrip([frame, frame, frame])


def test_non_contiguous_input_is_copied_not_aliased() -> None:
    base = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    frames = [base[:, ::2], base.transpose(1, 0, 2)[:, :6], base[::-1]]
    encoder, decoder = FrameEncoder(stream_id=1), FrameDecoder()
    for frame in frames:
        blob = encoder.encode(frame)
        frame_copy = frame.copy()
        base += 1  # mutating the caller's buffer must not change what was encoded
        assert_identical(decoder.decode(blob), frame_copy)
        base -= 1


def test_decoded_frames_are_private() -> None:
    frames = [np.arange(48, dtype=np.uint8).reshape(4, 4, 3) + i for i in range(3)]
    encoder, decoder = FrameEncoder(stream_id=1), FrameDecoder()
    blobs = [encoder.encode(f) for f in frames]
    first = decoder.decode(blobs[0])
    first[:] = 0  # the caller scribbles on the result; the decoder's reference must not change
    assert_identical(decoder.decode(blobs[1]), frames[1])


class _TensorLike:
    """Stands in for a CPU torch tensor (importing torch would take seconds): only ``__array__``."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)


def test_array_like_input() -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (1, 16, 16, 3), dtype=np.uint8) for _ in range(3)]
    encoder, decoder = FrameEncoder(), FrameDecoder()
    for frame in frames:
        assert_identical(decoder.decode(encoder.encode(_TensorLike(frame))), frame)


# ----------------------------------------------------------------------------- keyframes and resync


def test_keyframe_interval_and_sequence_numbers() -> None:
    encoder = FrameEncoder(CodecConfig(keyframe_interval=4), stream_id=0xABCD)
    headers = [read_header(encoder.encode(np.zeros((4, 4), np.uint8))) for _ in range(10)]
    assert [h.keyframe for h in headers] == [True, False, False, False] * 2 + [True, False]
    assert [h.seq for h in headers] == list(range(10))
    assert {h.stream_id for h in headers} == {0xABCD}


def test_force_keyframe() -> None:
    encoder = FrameEncoder(stream_id=1)
    frame = np.zeros((4, 4), np.uint8)
    encoder.encode(frame)
    assert not read_header(encoder.encode(frame)).keyframe
    encoder.force_keyframe()
    assert read_header(encoder.encode(frame)).keyframe


@FAST
@given(
    frames=st.lists(hnp.arrays(np.uint8, (6, 5, 3)), min_size=2, max_size=12),
    interval=st.integers(1, 5),
    predictor=st.sampled_from(["previous", "denoise"]),
    data=st.data(),
)
def test_dropped_frames_resync_at_next_keyframe(
    frames: list[np.ndarray], interval: int, predictor: str, data: st.DataObject
) -> None:
    encoder = FrameEncoder(CodecConfig(keyframe_interval=interval, predictor=predictor), stream_id=3)
    blobs = [encoder.encode(f) for f in frames]
    delivered = data.draw(st.lists(st.booleans(), min_size=len(frames), max_size=len(frames)))
    decoder = FrameDecoder()
    in_sync = False  # whether the previous frame was decoded
    for frame, blob, arrived in zip(frames, blobs, delivered, strict=True):
        if not arrived:
            in_sync = False
            continue
        if read_header(blob).keyframe or in_sync:
            assert_identical(decoder.decode(blob), frame)
            in_sync = True
        else:
            with pytest.raises(MissingFrameError, match="keyframe"):
                decoder.decode(blob)


def test_missing_frame_error_is_a_codec_error_and_resyncs() -> None:
    frames = [np.full((8, 8), i, np.uint8) for i in range(6)]
    encoder = FrameEncoder(CodecConfig(keyframe_interval=3), stream_id=5)
    blobs = [encoder.encode(f) for f in frames]
    decoder = FrameDecoder()
    assert_identical(decoder.decode(blobs[0]), frames[0])
    with pytest.raises(CodecError, match=r"needs frame 1.*last frame decoded was 0.*next keyframe"):
        decoder.decode(blobs[2])  # frame 1 was lost
    assert_identical(decoder.decode(blobs[3]), frames[3])  # keyframe
    assert_identical(decoder.decode(blobs[4]), frames[4])


def test_delta_before_any_keyframe_and_from_another_stream() -> None:
    frame = np.zeros((4, 4), np.uint8)
    a, b = FrameEncoder(stream_id=1), FrameEncoder(stream_id=2)
    a_blobs = [a.encode(frame), a.encode(frame)]
    b_blobs = [b.encode(frame), b.encode(frame)]
    decoder = FrameDecoder()
    with pytest.raises(MissingFrameError, match="nothing has been decoded"):
        decoder.decode(a_blobs[1])
    decoder.decode(a_blobs[0])
    with pytest.raises(MissingFrameError, match="stream"):
        decoder.decode(b_blobs[1])  # same seq, other stream: never applied to a's frame
    decoder.decode(b_blobs[0])
    assert_identical(decoder.decode(b_blobs[1]), frame)


@FAST
@given(
    frames=st.lists(streams(max_frames=1), min_size=1, max_size=6).map(lambda s: [f for fs in s for f in fs])
)
def test_dtype_or_shape_change_forces_keyframe(frames: list[np.ndarray]) -> None:
    blobs = roundtrip(frames, CodecConfig(keyframe_interval=1000))
    for previous, frame, blob in zip(frames, frames[1:], blobs[1:], strict=False):
        if (previous.dtype, previous.shape) != (frame.dtype, frame.shape):
            assert read_header(blob).keyframe


def test_auto_predictor_switches_with_noise() -> None:
    rng = np.random.default_rng(0)
    scene = rng.integers(20, 230, (32, 32, 3), dtype=np.uint8)
    noisy = [np.clip(scene + rng.normal(0, 2, scene.shape), 0, 255).astype(np.uint8) for _ in range(6)]
    encoder = FrameEncoder(CodecConfig(keyframe_interval=1000), stream_id=1)
    transforms = [read_header(encoder.encode(f)).transform for f in [*noisy, *[scene] * 4]]
    assert transforms[:3] == ["key-left", "delta-sub", "delta-denoise"]
    assert transforms[3:6] == ["delta-denoise"] * 3
    # the first clean frame still differs from the noisy one before it; the second is identical
    assert transforms[6:] == ["delta-denoise", "delta-denoise", "delta-sub", "delta-sub"]


# ----------------------------------------------------------------------------- corrupt input


def _stream(config: CodecConfig) -> tuple[list[np.ndarray], list[bytes]]:
    """Noisy uint8 images (denoise frames), then float32 frames, as one stream."""
    rng = np.random.default_rng(1)
    scene = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    frames = [np.clip(scene + rng.normal(0, 2, scene.shape), 0, 255).astype(np.uint8) for _ in range(4)]
    frames += [np.linspace(0, 1, 30, dtype=np.float32).reshape(5, 6) + i for i in range(3)]
    encoder = FrameEncoder(config, stream_id=9)
    return frames, [encoder.encode(f) for f in frames]


STREAMS = [_stream(CodecConfig()), _stream(CodecConfig(compressor="lz4"))]
FRAMES, BLOBS = STREAMS[0]
frame_indices = st.integers(0, len(BLOBS) - 1)


@FAST
@given(index=frame_indices, data=st.data())
def test_any_bit_flip_raises_codec_error(index: int, data: st.DataObject) -> None:
    blob = bytearray(BLOBS[index])
    bit = data.draw(st.integers(0, 8 * len(blob) - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    decoder = _decoder_ready_for(BLOBS, index)
    with pytest.raises(CodecError):
        decoder.decode(bytes(blob))
    assert_identical(decoder.decode(BLOBS[index]), FRAMES[index])  # the state survived


@FAST
@given(index=frame_indices, data=st.data())
def test_truncated_or_overlong_blob_raises_codec_error(index: int, data: st.DataObject) -> None:
    blob = BLOBS[index]
    cut = data.draw(st.integers(0, len(blob) - 1))
    decoder = _decoder_ready_for(BLOBS, index)
    with pytest.raises(CodecError, match="truncated|not a codec blob"):
        decoder.decode(blob[:cut])
    with pytest.raises(CodecError, match="overlong"):
        decoder.decode(blob + b"\0")


def test_foreign_blobs_raise_codec_error() -> None:
    for junk in (b"", b"RLFC", b"\x89PNG\r\n\x1a\n" + bytes(64), bytes(100)):
        with pytest.raises(CodecError):
            FrameDecoder().decode(junk)
    future = bytearray(BLOBS[0])
    future[4] = 99  # version
    with pytest.raises(CodecError, match="version"):
        FrameDecoder().decode(bytes(future))


_FIXED_HEADER = codec._FIXED.size  # magic, version, flags, ..., seq, payload length, CRC-32 (last)


def _with_valid_crc(blob: bytearray) -> bytes:
    """Recompute the CRC, as a hostile sender would, so that the structural checks are reached."""
    offset = codec._CRC_OFFSET
    crc = zlib.crc32(memoryview(blob)[offset + 4 :], zlib.crc32(memoryview(blob)[:offset]))
    blob[offset : offset + 4] = struct.pack("<I", crc)
    return bytes(blob)


@settings(deadline=None, derandomize=True, max_examples=250)
@given(stream=st.sampled_from(STREAMS), index=frame_indices, data=st.data())
def test_hostile_blobs_only_raise_codec_error(
    stream: tuple[list[np.ndarray], list[bytes]], index: int, data: st.DataObject
) -> None:
    """Mutated blobs with a fixed-up CRC: decode raises CodecError or returns a well-formed array."""
    blobs = stream[1]
    blob = bytearray(blobs[index])
    regions = {"header": (5, _FIXED_HEADER - 9), "dtype+shape": (_FIXED_HEADER, _FIXED_HEADER + 30)}
    regions["payload"] = (_FIXED_HEADER + 30, len(blob) - 1)  # approximately: dtype+shape is short
    for _ in range(data.draw(st.integers(1, 3))):
        low, high = regions[data.draw(st.sampled_from(sorted(regions)))]
        position = data.draw(st.integers(low, min(high, len(blob) - 1)))
        blob[position] = data.draw(st.integers(0, 255))
    hostile = _with_valid_crc(blob)
    decoder = _decoder_ready_for(blobs, index)
    try:
        header = read_header(hostile)
        decoded = decoder.decode(hostile)
    except CodecError:
        return
    assert decoded.dtype == header.dtype and decoded.shape == header.shape


def _decoder_ready_for(blobs: list[bytes], index: int) -> FrameDecoder:
    """A decoder that has decoded every frame before ``index``."""
    decoder = FrameDecoder()
    for blob in blobs[:index]:
        decoder.decode(blob)
    return decoder


def test_max_frame_bytes_guard() -> None:
    blob = FrameEncoder().encode(np.zeros((64, 64), np.uint8))
    with pytest.raises(CodecError, match="max_frame_bytes"):
        FrameDecoder(max_frame_bytes=1000).decode(blob)


def test_unsupported_dtype_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cannot encode dtype"):
        FrameEncoder().encode(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="cannot encode dtype"):
        FrameEncoder().encode(np.array([object()]))


# ----------------------------------------------------------------------------- compression and config


def _slow_stream(n: int = 20) -> list[np.ndarray]:
    """A smooth 64x64 RGB scene with a small block drifting one pixel per frame."""
    y, x = np.mgrid[0:64, 0:64]
    scene = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)
    frames = []
    for t in range(n):
        frame = scene.copy()
        frame[20:28, 5 + t : 13 + t] = (255, 0, 0)
        frames.append(frame)
    return frames


@pytest.mark.parametrize("delta", ["sub", "xor"])
def test_delta_beats_keyframes_only(delta: str) -> None:
    frames = _slow_stream()
    with_delta = sum(map(len, roundtrip(frames, CodecConfig(delta=delta))))
    keyframes_only = sum(map(len, roundtrip(frames, CodecConfig(keyframe_interval=1))))
    assert with_delta < 0.5 * keyframes_only


def test_denoise_beats_previous_on_noisy_stream() -> None:
    rng = np.random.default_rng(0)
    frames = [np.clip(f + rng.normal(0, 2, f.shape), 0, 255).astype(np.uint8) for f in _slow_stream(24)]
    denoise = sum(map(len, roundtrip(frames, CodecConfig(predictor="denoise"))))
    previous = sum(map(len, roundtrip(frames, CodecConfig(predictor="previous"))))
    assert denoise < 0.95 * previous


def test_byte_planes_help_smooth_floats() -> None:
    frames = [np.sin(np.linspace(0, 3, 4096) + 0.01 * t).astype(np.float32) for t in range(8)]
    planar = sum(map(len, roundtrip(frames, CodecConfig(byte_planes=True))))
    interleaved = sum(map(len, roundtrip(frames, CodecConfig(byte_planes=False))))
    assert planar < interleaved


def test_config_is_validated() -> None:
    assert build(CodecConfig, {"compressor": "lz4", "level": 9}).level == 9
    with pytest.raises(ConfigError, match="compressor"):
        build(CodecConfig, {"compressor": "brotli"})
    with pytest.raises(ConfigError, match="lz4 levels"):
        build(CodecConfig, {"compressor": "lz4", "level": 20})
    with pytest.raises(ConfigError, match="keyframe_interval"):
        build(CodecConfig, {"keyframe_interval": 0})
    with pytest.raises(ConfigError, match="lz4 levels"):
        FrameEncoder(CodecConfig(compressor="lz4", level=20))  # built directly: validated by the encoder
