"""Simulated network links: delay distributions, an env link config, and a channel link model.

Three pieces, all pure numpy (no Ray, no gymnasium), so configs and channel actors import them cheaply:

* :class:`DelayDistribution`: a typed config for a delay in milliseconds, one ``kind`` of
  ``none``, ``constant``, ``uniform``, ``exponential``, ``gaussian`` (clipped at 0) or ``histogram``
  (bin edges plus weights). Kinds are registered with :func:`register_delay`; each kind names the
  fields it uses, and a field another kind uses is refused. ``dist.sample(rng, n)`` draws ``n``
  delays from a seeded ``numpy.random.Generator``.
* :class:`LinkConfig`: ``env.link`` of a run config, the observation and action delays that
  :func:`rlinf_nb.envs.latency.apply_link` adds to any :class:`~rlinf_nb.envs.VecEnv`.
* :class:`ChannelLink` and :func:`delivery_times`: latency plus bandwidth on a channel between node
  groups. A message put at ``t`` is serialised on the link (one at a time, so back-to-back large
  messages queue), then travels for its sampled latency; getters see it at its delivery time.

    dist = DelayDistribution(kind="uniform", low_ms=0, high_ms=40)
    dist.sample(np.random.default_rng(0), 3)        # -> array([25.5, 10.8, 32.9]) (ms)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlinf_nb.config import ConfigError, build, param

__all__ = [
    "ChannelLink",
    "DelayDistribution",
    "LinkClock",
    "LinkConfig",
    "delay_kinds",
    "delay_steps",
    "delivery_times",
    "stream_seed",
    "register_delay",
]

# ----------------------------------------------------------------------------- delay distributions


@dataclass(frozen=True)
class _DelayKind:
    fields: tuple[str, ...]  # the DelayDistribution fields this kind needs
    optional: tuple[str, ...]  # fields it may be given (None = their default)
    check: Callable[[DelayDistribution], None]  # raises ConfigError naming the field
    sample: Callable[[DelayDistribution, np.random.Generator, int], np.ndarray]  # ms, float64 [n]


_KINDS: dict[str, _DelayKind] = {}


def register_delay(
    kind: str,
    fields: tuple[str, ...],
    check: Callable[[DelayDistribution], None] | None = None,
    optional: tuple[str, ...] = (),
) -> Callable:
    """Decorator: ``sample(dist, rng, n) -> ms [n]`` serves ``DelayDistribution(kind=kind, ...)``.

    ``fields`` are the parameters the kind needs, ``optional`` those it may be given; ``check``
    validates them (raising :class:`ConfigError` naming the field).
    """

    def decorator(sample: Callable[[DelayDistribution, np.random.Generator, int], np.ndarray]):
        _KINDS[kind] = _DelayKind(tuple(fields), tuple(optional), check or (lambda d: None), sample)
        return sample

    return decorator


def delay_kinds() -> list[str]:
    """The registered delay kinds."""
    return list(_KINDS)


_PARAMS = ("ms", "low_ms", "high_ms", "mean_ms", "std_ms", "offset_ms", "edges_ms", "weights")


@dataclass
class DelayDistribution:
    """A delay in milliseconds: ``kind`` picks the distribution, the other fields are its parameters."""

    kind: str = param("none", doc="none, constant, uniform, exponential, gaussian or histogram")
    ms: float | None = param(None, doc="constant: the delay (ms)", range=(0, None))
    low_ms: float | None = param(None, doc="uniform: the lower bound (ms)", range=(0, None))
    high_ms: float | None = param(None, doc="uniform: the upper bound (ms)", range=(0, None))
    mean_ms: float | None = param(
        None, doc="exponential: mean of the exponential part; gaussian: the mean (ms)", range=(0, None)
    )
    std_ms: float | None = param(
        None, doc="gaussian: standard deviation (ms; draws below 0 become 0)", range=(0, None)
    )
    offset_ms: float | None = param(
        None,
        doc="exponential: the minimum delay added to the exponential part (ms, default 0)",
        range=(0, None),
    )
    edges_ms: list[float] | None = param(None, doc="histogram: k+1 increasing bin edges (ms, >= 0)")
    weights: list[float] | None = param(None, doc="histogram: k bin weights (>= 0, not all 0)")

    def validate(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError("kind", self.kind, f"allowed values: {', '.join(repr(k) for k in _KINDS)}")
        spec = _KINDS[self.kind]
        for name in _PARAMS:
            value = getattr(self, name)
            if name in spec.fields and value is None:
                raise ConfigError(name, None, f"required by kind {self.kind!r} (it uses: {_uses(spec)})")
            if name not in spec.fields + spec.optional and value is not None:
                raise ConfigError(name, value, f"not used by kind {self.kind!r} (it uses: {_uses(spec)})")
        spec.check(self)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` delays in ms (float64, all >= 0) drawn from ``rng`` (call :meth:`validate` first)."""
        return np.asarray(_KINDS[self.kind].sample(self, rng, n), dtype=np.float64)

    def scalar_params(self) -> tuple[str, ...]:
        """The numeric parameters this kind uses (a live link may change them; its kind stays)."""
        spec = _KINDS[self.kind]
        return tuple(f for f in spec.fields + spec.optional if f not in ("edges_ms", "weights"))

    @property
    def is_zero(self) -> bool:
        """Whether every draw is 0 ms (so a wrapper can be skipped)."""
        return self.kind == "none" or (self.kind == "constant" and self.ms == 0)

    @classmethod
    def of(
        cls, value: DelayDistribution | Mapping[str, Any] | float | None, path: str = ""
    ) -> DelayDistribution:
        """A distribution from itself, a mapping (validated), a number of ms (constant) or None (none)."""
        if isinstance(value, DelayDistribution):
            value.validate()
            return value
        if value is None:
            return cls()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return build(cls, {"kind": "constant", "ms": float(value)}, path=path)
        if isinstance(value, Mapping):
            return build(cls, value, path=path)
        raise ConfigError(path, value, "expected a delay: a mapping with a kind, a number of ms, or None")


def _uses(spec: _DelayKind) -> str:
    names = [*spec.fields, *(f"{f} (optional)" for f in spec.optional)]
    return ", ".join(names) or "no parameters"


@register_delay("none", ())
def _none(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    return np.zeros(n)


@register_delay("constant", ("ms",))
def _constant(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    return np.full(n, float(d.ms))


def _check_uniform(d: DelayDistribution) -> None:
    if d.high_ms < d.low_ms:
        raise ConfigError("high_ms", d.high_ms, f"must be >= low_ms ({d.low_ms})")


@register_delay("uniform", ("low_ms", "high_ms"), _check_uniform)
def _uniform(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(d.low_ms, d.high_ms, n)


@register_delay("exponential", ("mean_ms",), optional=("offset_ms",))
def _exponential(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    return (d.offset_ms or 0.0) + rng.exponential(d.mean_ms, n)


@register_delay("gaussian", ("mean_ms", "std_ms"))
def _gaussian(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    return np.maximum(0.0, rng.normal(d.mean_ms, d.std_ms, n))


def _check_histogram(d: DelayDistribution) -> None:
    edges, weights = list(d.edges_ms), list(d.weights)
    if len(edges) < 2:
        raise ConfigError("edges_ms", edges, "expected at least 2 bin edges (k+1 edges for k bins)")
    if any(not math.isfinite(e) or e < 0 for e in edges) or any(
        b <= a for a, b in zip(edges[:-1], edges[1:], strict=True)
    ):
        raise ConfigError("edges_ms", edges, "expected finite, non-negative, strictly increasing edges")
    if len(weights) != len(edges) - 1:
        raise ConfigError("weights", weights, f"expected {len(edges) - 1} weights (one per bin of edges_ms)")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError("weights", weights, "expected finite weights >= 0, not all 0")


@register_delay("histogram", ("edges_ms", "weights"), _check_histogram)
def _histogram(d: DelayDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    """An empirical histogram: a bin drawn by weight, then a uniform point inside it."""
    edges = np.asarray(d.edges_ms, dtype=np.float64)
    w = np.asarray(d.weights, dtype=np.float64)
    bins = rng.choice(len(w), size=n, p=w / w.sum())
    return edges[bins] + rng.uniform(0.0, 1.0, n) * (edges[bins + 1] - edges[bins])


def delay_steps(ms: np.ndarray | float, dt_ms: float) -> np.ndarray:
    """Control steps a message delayed ``ms`` waits: it is used at the first tick at or after it lands.

    ``ceil(ms / dt_ms)``: 0 ms -> 0, 10 ms -> 1 and 40 ms -> 2 at ``dt_ms = 20`` (a tolerance of
    1e-9 steps keeps exact multiples exact).
    """
    return np.ceil(np.asarray(ms, dtype=np.float64) / dt_ms - 1e-9).astype(np.int64)


# ----------------------------------------------------------------------------- the env link (env.link)


@dataclass
class LinkConfig:
    """Observation and action delays between the policy and the env (``env.link``; off by default).

    Each message gets its own sampled delay, turned into control steps with ``dt_ms``
    (:func:`delay_steps`). The policy acts on the newest observation that has arrived; the env
    applies the newest action that has arrived and holds it until a newer one lands. See
    :mod:`rlinf_nb.envs.latency` for the rules at episode starts.
    """

    obs_delay: DelayDistribution = param(
        factory=DelayDistribution, doc="delay of each observation on its way to the policy"
    )
    action_delay: DelayDistribution = param(
        factory=DelayDistribution, doc="delay of each action on its way to the env"
    )
    dt_ms: float = param(20.0, doc="the env's control period in ms (one env step)", range=(1e-3, None))
    action_fill: str = param(
        "zero",
        doc="what the env applies before the episode's first action arrives: 'zero' (zeros, clipped into "
        "the action space) or 'hold' (the last action applied before the reset; zeros at the very start)",
        choices=("zero", "hold"),
    )

    @property
    def enabled(self) -> bool:
        """Whether any delay is non-zero."""
        return not (self.obs_delay.is_zero and self.action_delay.is_zero)


# ----------------------------------------------------------------------------- the channel link


@dataclass
class ChannelLink:
    """Latency and bandwidth of a channel between node groups (off when both are 0/none)."""

    latency: DelayDistribution = param(factory=DelayDistribution, doc="one-way latency of each message")
    bandwidth_bytes_s: float = param(
        0.0, doc="link bandwidth in bytes/s (0 = unlimited); messages are sent one at a time", range=(0, None)
    )
    seed: int = param(
        0, doc="seed of the latency draws; each stream (and each env worker's line) mixes its own name in"
    )

    @classmethod
    def of(cls, value: ChannelLink | Mapping[str, Any]) -> ChannelLink:
        if isinstance(value, ChannelLink):
            value.latency.validate()
            return value
        return build(cls, value, path="link")


def stream_seed(seed: int, *keys: str | int) -> int:
    """A seed for one stream of a link config: ``seed`` mixed with the stream's ``keys``.

    Links that share a config seed (every run's obs and actions links default to 0) then draw
    independent latencies, while the same seed and keys always give the same draws.
    """
    words = [int(seed)] + [zlib.crc32(str(k).encode()) for k in keys]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])


def delivery_times(
    put_s: Sequence[float] | np.ndarray,
    nbytes: Sequence[int] | np.ndarray,
    latency_s: Sequence[float] | np.ndarray,
    bandwidth_bytes_s: float = 0.0,
    busy_until: float = -math.inf,
    last_delivery: float = -math.inf,
) -> tuple[np.ndarray, float, float]:
    """When each message of a link becomes visible to getters (seconds; messages in put order).

    Message ``i`` starts sending at ``max(put_s[i], end of the previous send)``, takes
    ``nbytes[i] / bandwidth_bytes_s`` (0 when the bandwidth is 0 = unlimited), then travels for
    ``latency_s[i]``. Delivery keeps put order (one ordered stream, like TCP): a message never
    becomes visible before the one put before it.

    Returns ``(delivery [n], busy_until, last_delivery)``; pass the last two back in for the next
    messages of the same link.
    """
    put = np.asarray(put_s, dtype=np.float64)
    size = np.asarray(nbytes, dtype=np.float64)
    lat = np.asarray(latency_s, dtype=np.float64)
    if not put.shape == size.shape == lat.shape:
        raise ValueError(
            f"delivery_times: shapes differ: put {put.shape}, nbytes {size.shape}, latency {lat.shape}"
        )
    out = np.empty_like(put)
    for i in range(len(put)):
        start = max(put[i], busy_until)
        busy_until = start + (size[i] / bandwidth_bytes_s if bandwidth_bytes_s > 0 else 0.0)
        last_delivery = max(busy_until + lat[i], last_delivery)
        out[i] = last_delivery
    return out, float(busy_until), float(last_delivery)


class LinkClock:
    """A channel's link state: samples each message's latency and returns its delivery time."""

    def __init__(self, link: ChannelLink | Mapping[str, Any]):
        self.link = ChannelLink.of(link)
        self._rng = np.random.default_rng(self.link.seed)
        self.busy_until = -math.inf
        self.last_delivery = -math.inf

    def retune(self, link: ChannelLink | Mapping[str, Any]) -> None:
        """New latency and bandwidth from now on; the draws and the queue carry on (the seed is kept)."""
        self.link = replace(ChannelLink.of(link), seed=self.link.seed)

    def deliver(self, put_s: float, nbytes: int) -> float:
        """The delivery time (same clock as ``put_s``) of one message put now."""
        latency = self.link.latency.sample(self._rng, 1) / 1000.0
        out, self.busy_until, self.last_delivery = delivery_times(
            [put_s], [nbytes], latency, self.link.bandwidth_bytes_s, self.busy_until, self.last_delivery
        )
        return float(out[0])
