"""Size and speed of the observation codec on PushCube-v1 camera frames.

Records ``--frames`` 128x128 RGB base-camera frames of ManiSkill 3 PushCube-v1 with random
actions (CPU physics and rendering; episodes reset when they end, every 50 steps) and caches
them in ``bench/.cache/`` so reruns skip the simulator. A second stream adds independent
Gaussian sensor noise (sigma 2 per pixel and frame, rounded, clipped to uint8). For both
streams it prints the size ratio (compressed / raw bytes) and single-threaded throughput
(raw bytes per second of encode, of decode, and of encode + decode) of: raw bytes, plain
LZ4, plain zstd-3, a subtract-delta + zstd-3 baseline and ``rlinf_nb.codec`` in its default
and a few other configurations. Every codec's output is checked to round-trip bit-exactly.

Timing: each stream is coded ``--repeats`` times and every frame's fastest time is kept
(robust to other load on the machine); decoded frames are dropped as they come, as a
consumer would.

Usage::

    .venv/bin/python bench/bench_codec.py               # ~1 minute with a warm cache
    .venv/bin/python bench/bench_codec.py --frames 400 --repeats 7 --refresh
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lz4.block
import numpy as np
import zstandard

from rlinf_nb.codec import CodecConfig, FrameDecoder, FrameEncoder

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
TARGET_CLEAN = 0.10
TARGET_NOISY = 0.45
TARGET_MBPS = 300.0
NOISE_SIGMA = 2.0


# ----------------------------------------------------------------------------- frames


def record_frames(n_frames: int, seed: int) -> np.ndarray:
    """``n_frames`` base-camera RGB frames of PushCube-v1 under uniformly random actions."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the environments)

    env = gym.make("PushCube-v1", obs_mode="rgb", sim_backend="physx_cpu", render_backend="cpu")
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    frames = [_camera(obs)]
    while len(frames) < n_frames:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if bool(terminated) or bool(truncated):
            obs, _ = env.reset()
        frames.append(_camera(obs))
    env.close()
    return np.stack(frames)


def _camera(obs: dict) -> np.ndarray:
    rgb = obs["sensor_data"]["base_camera"]["rgb"]  # torch uint8, (num_envs=1, 128, 128, 3)
    return np.asarray(rgb.cpu())[0]


def load_frames(n_frames: int, seed: int, refresh: bool) -> np.ndarray:
    """The cached recording, or a fresh one (saved for next time)."""
    path = CACHE_DIR / f"pushcube_base_camera_{n_frames}f_seed{seed}.npz"
    if path.exists() and not refresh:
        return np.load(path)["frames"]
    print(
        f"recording {n_frames} PushCube-v1 frames (to be cached in {os.path.relpath(path)}) ...", flush=True
    )
    started = time.perf_counter()
    frames = record_frames(n_frames, seed)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / ".gitignore").write_text("# recordings of bench_codec.py; not for git\n*\n")
    np.savez_compressed(path, frames=frames)
    print(f"  recorded in {time.perf_counter() - started:.0f} s", flush=True)
    return frames


def add_noise(frames: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    """Independent Gaussian noise per pixel and frame, rounded and clipped to uint8."""
    noise = np.random.default_rng(seed).normal(0.0, sigma, frames.shape)
    return np.clip(np.rint(frames + noise), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- codecs


@dataclass
class Codec:
    """A named pair of stream-coder factories, each returning a fresh per-frame callable.

    ``make_decoder`` gets the first frame, for the baselines that need its dtype and shape.
    """

    name: str
    make_encoder: Callable[[], Callable[[np.ndarray], bytes]]
    make_decoder: Callable[[np.ndarray], Callable[[bytes], np.ndarray]]


def _stateless(
    name: str, compress: Callable[[bytes], bytes], decompress: Callable[[bytes, int], bytes]
) -> Codec:
    def make_encoder() -> Callable[[np.ndarray], bytes]:
        return lambda frame: compress(frame.tobytes())

    def make_decoder(like: np.ndarray) -> Callable[[bytes], np.ndarray]:
        return lambda blob: np.frombuffer(decompress(blob, like.nbytes), like.dtype).reshape(like.shape)

    return Codec(name, make_encoder, make_decoder)


def _sub_delta_zstd3() -> Codec:
    """The reference baseline: frame minus previous frame (mod 256), zstd level 3."""

    def make_encoder() -> Callable[[np.ndarray], bytes]:
        compressor, previous = zstandard.ZstdCompressor(level=3), [None]

        def encode(frame: np.ndarray) -> bytes:
            residual = frame if previous[0] is None else frame - previous[0]
            previous[0] = frame
            return compressor.compress(residual.tobytes())

        return encode

    def make_decoder(like: np.ndarray) -> Callable[[bytes], np.ndarray]:
        decompressor, previous = zstandard.ZstdDecompressor(), [None]

        def decode(blob: bytes) -> np.ndarray:
            residual = np.frombuffer(decompressor.decompress(blob), like.dtype).reshape(like.shape)
            previous[0] = residual.copy() if previous[0] is None else residual + previous[0]
            return previous[0]

        return decode

    return Codec("sub-delta + zstd-3", make_encoder, make_decoder)


def _ours(name: str, **overrides) -> Codec:
    config = CodecConfig(**overrides)
    return Codec(name, lambda: FrameEncoder(config, stream_id=0).encode, lambda like: FrameDecoder().decode)


def codecs() -> list[Codec]:
    zstd3, unzstd = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    return [
        _stateless("raw", bytes, lambda blob, n: blob),
        _stateless(
            "plain lz4",
            lambda data: lz4.block.compress(data, store_size=False),
            lambda blob, n: lz4.block.decompress(blob, uncompressed_size=n),
        ),
        _stateless("plain zstd-3", zstd3.compress, lambda blob, n: unzstd.decompress(blob)),
        _sub_delta_zstd3(),
        _ours("codec: default"),
        _ours("codec: predictor=previous", predictor="previous"),
        _ours("codec: denoise, keyframe 200", predictor="denoise", keyframe_interval=200),
        _ours("codec: lz4, previous", compressor="lz4", level=0, predictor="previous"),
    ]


# ----------------------------------------------------------------------------- measuring


@dataclass
class Result:
    codec: str
    ratio: float
    encode_mbps: float
    decode_mbps: float
    combined_mbps: float


def _fastest_per_frame(run_stream: Callable[[list[float]], None], n_frames: int, repeats: int) -> float:
    """Total of each frame's fastest time over ``repeats`` runs of a whole stream."""
    best = np.full(n_frames, np.inf)
    for _ in range(repeats):
        times: list[float] = []
        run_stream(times)
        best = np.minimum(best, times)
    return float(best.sum())


def measure(codec: Codec, frames: Sequence[np.ndarray], repeats: int) -> Result:
    """Size ratio and throughput of ``codec`` on ``frames``; checks the round trip first."""
    blobs = _encode_all(codec, frames)
    decode = codec.make_decoder(frames[0])
    for frame, blob in zip(frames, blobs, strict=True):
        if not np.array_equal(decode(blob), frame):
            raise AssertionError(f"{codec.name}: round trip is not bit-exact")

    def encode_stream(times: list[float]) -> None:
        encode = codec.make_encoder()
        for frame in frames:
            started = time.perf_counter()
            encode(frame)
            times.append(time.perf_counter() - started)

    def decode_stream(times: list[float]) -> None:
        decode = codec.make_decoder(frames[0])
        for blob in blobs:
            started = time.perf_counter()
            decode(blob)
            times.append(time.perf_counter() - started)

    encode_s = _fastest_per_frame(encode_stream, len(frames), repeats)
    decode_s = _fastest_per_frame(decode_stream, len(frames), repeats)
    raw = sum(f.nbytes for f in frames)

    def mbps(seconds: float) -> float:
        return raw / seconds / 1e6

    return Result(
        codec.name, sum(map(len, blobs)) / raw, mbps(encode_s), mbps(decode_s), mbps(encode_s + decode_s)
    )


def _encode_all(codec: Codec, frames: Sequence[np.ndarray]) -> list[bytes]:
    encode = codec.make_encoder()
    return [encode(frame) for frame in frames]


def print_table(title: str, results: list[Result], target_ratio: float) -> None:
    print(f"\n{title}")
    print(f"  {'codec':34s} {'size':>7s} {'enc MB/s':>9s} {'dec MB/s':>9s} {'enc+dec MB/s':>13s}")
    for r in results:
        print(
            f"  {r.codec:34s} {r.ratio:7.1%} {r.encode_mbps:9.0f} {r.decode_mbps:9.0f} {r.combined_mbps:13.0f}"
        )
    default = next(r for r in results if r.codec == "codec: default")
    ok = "meets" if default.ratio <= target_ratio else "MISSES"
    print(f"  target: default codec size <= {target_ratio:.0%}: {default.ratio:.1%} ({ok})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200, help="frames to record (default 200)")
    parser.add_argument("--repeats", type=int, default=7, help="timing runs per stream (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="env, action and noise seed")
    parser.add_argument("--refresh", action="store_true", help="re-record even if cached")
    args = parser.parse_args(argv)

    clean = load_frames(args.frames, args.seed, args.refresh)
    noisy = add_noise(clean, NOISE_SIGMA, args.seed)
    print(f"{len(clean)} frames of {clean.shape[1:]} {clean.dtype} ({clean[0].nbytes} bytes each)")
    all_codecs = codecs()
    clean_results = [measure(c, list(clean), args.repeats) for c in all_codecs]
    print_table("clean stream", clean_results, TARGET_CLEAN)
    default = next(r for r in clean_results if r.codec == "codec: default")
    ok = "meets" if default.combined_mbps >= TARGET_MBPS else "MISSES"
    print(f"  target: default codec encode+decode >= {TARGET_MBPS:.0f} MB/s on one core: "
          f"{default.combined_mbps:.0f} MB/s ({ok})")  # fmt: skip
    noisy_results = [measure(c, list(noisy), args.repeats) for c in all_codecs]
    print_table(
        f"noisy stream (Gaussian sigma={NOISE_SIGMA:g} per pixel and frame)", noisy_results, TARGET_NOISY
    )


if __name__ == "__main__":
    main()
