"""Simulated network links on a run's channels (``placement.links``; off by default).

A run's ``placement.links`` section gives each message stream between node groups a
:class:`~rlinf_nb.link.ChannelLink` (a latency distribution plus a bandwidth):

* ``obs``: env workers -> rollout workers (observations),
* ``actions``: rollout workers -> env workers (actions, values),
* ``trajectories``: env workers -> the controller/learner (one rollout's arrays per segment).

Both env -> rollout paths honour it. With ``placement.env_to_rollout: channel`` the ``obs`` and
``actions`` channels get the links themselves (items become visible at their delivery time). With
``direct`` (one actor call per step) each env worker keeps a :class:`DirectLink`: it waits until the
simulated delivery time of its request before sending it, and of the reply before using it, with the
same :class:`~rlinf_nb.link.LinkClock` maths and payload sizes as a channel. Links only delay
messages, never change them: the same seed gives the same batches with and without links.

    placement:
      links:
        obs: {latency: {kind: constant, ms: 50}}
        actions: {latency: {kind: uniform, low_ms: 20, high_ms: 80}, bandwidth_bytes_s: 1.0e6}
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_nb.config import build, param, to_dict
from rlinf_nb.link import ChannelLink, DelayDistribution, LinkClock, stream_seed

__all__ = ["LINK_NAMES", "DirectLink", "LinkDelays", "RunLinks", "link_enabled"]

LINK_NAMES = ("obs", "actions", "trajectories")


def link_enabled(link: ChannelLink) -> bool:
    """Whether ``link`` delays anything (a non-zero latency or a bandwidth limit)."""
    return not link.latency.is_zero or link.bandwidth_bytes_s > 0


@dataclass
class RunLinks:
    """Simulated links between a run's node groups, one per message stream (all off by default)."""

    obs: ChannelLink = param(
        factory=ChannelLink,
        doc="env -> rollout: each observation (the obs channel, or each direct request)",
    )
    actions: ChannelLink = param(
        factory=ChannelLink,
        doc="rollout -> env: each action reply (the actions channel, or each direct reply)",
    )
    trajectories: ChannelLink = param(
        factory=ChannelLink,
        doc="env -> learner: each env worker's rollout segment (the trajectories channel)",
    )

    def active(self) -> dict[str, ChannelLink]:
        """The links that delay anything, by stream name (empty = links off)."""
        return {name: getattr(self, name) for name in LINK_NAMES if link_enabled(getattr(self, name))}

    def channel_link(self, name: str) -> ChannelLink | None:
        """The link of channel ``name`` with its stream's own seed (None when it is off, so the channel
        runs without one)."""
        return self.stream_link(name) if name in self.active() else None

    def stream_link(self, name: str) -> ChannelLink:
        """Stream ``name``'s link with its own seed, on or off (a live change may have zeroed it)."""
        link = getattr(self, name)
        return dataclasses.replace(link, seed=stream_seed(link.seed, name))

    def live_fields(self, streams: Sequence[str]) -> dict[str, dataclasses.Field]:
        """The fields of ``streams``' links that may change mid-run, by dotted path under ``placement.links``.

        A link's latency parameters (those its kind uses) and its bandwidth; its kind and seed stay. Only
        the streams linked at launch: a stream without a link may have skipped its channel actor (lanes).
        """
        delay_fields = {f.name: f for f in dataclasses.fields(DelayDistribution)}
        link_fields = {f.name: f for f in dataclasses.fields(ChannelLink)}
        out = {}
        for name in streams:
            link = getattr(self, name)
            for param_name in link.latency.scalar_params():
                out[f"placement.links.{name}.latency.{param_name}"] = delay_fields[param_name]
            out[f"placement.links.{name}.bandwidth_bytes_s"] = link_fields["bandwidth_bytes_s"]
        return out

    def describe(self, streams: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The links of ``streams`` (default: the active ones) as plain dicts (for the run's events and status)."""
        out = {}
        for name in self.active() if streams is None else streams:
            d = to_dict(getattr(self, name))
            d["latency"] = {k: v for k, v in d["latency"].items() if v is not None}
            out[name] = d
        return out


class LinkDelays:
    """Running totals of simulated delays per stream: ``{name: [seconds, messages]}``."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float, messages: int = 1) -> None:
        tot = self.totals.setdefault(name, [0.0, 0])
        tot[0] += seconds
        tot[1] += messages

    def merge(self, other: Mapping[str, list[float]]) -> None:
        for name, (seconds, messages) in other.items():
            self.add(name, seconds, int(messages))

    def metrics(self) -> dict[str, float]:
        """``link_delay_ms`` (mean over every message) and ``link_delay_ms/<stream>``."""
        out = {f"link_delay_ms/{n}": 1000.0 * s / m for n, (s, m) in self.totals.items() if m}
        seconds = sum(s for s, _ in self.totals.values())
        messages = sum(m for _, m in self.totals.values())
        if messages:
            out["link_delay_ms"] = 1000.0 * seconds / messages
        return out


class DirectLink:
    """The ``obs``/``actions`` links of one env worker's direct requests (``env_to_rollout: direct``).

    Each env worker draws its own latencies (seeded by the link's seed, the stream and its rank) and
    has its own bandwidth, as if it had its own line to its rollout worker.
    """

    def __init__(self, links: Mapping[str, Any], rank: int):
        def clock(name: str) -> LinkClock | None:
            if name not in links:
                return None
            link = build(ChannelLink, links[name], path=f"placement.links.{name}")
            return LinkClock(dataclasses.replace(link, seed=stream_seed(link.seed, name, rank)))

        self.obs, self.actions = clock("obs"), clock("actions")
        self.delays = LinkDelays()

    def retune(self, links: Mapping[str, Any]) -> None:
        """The streams' latency and bandwidth as ``links`` says now (a live change); draws carry on."""
        for name in ("obs", "actions"):
            clock = getattr(self, name)
            if clock is not None and name in links:
                clock.retune(build(ChannelLink, links[name], path=f"placement.links.{name}"))

    def submit(self, start: Callable[[Any], Callable[[], tuple[Any, float]]], msg: Any) -> Callable[[], Any]:
        """Send ``msg`` over ``obs`` to the policy and return what waits for its reply over ``actions``.

        ``start(msg)`` starts the request at once and returns what waits for ``(reply, service seconds)``.
        The request reaches the policy when the ``obs`` link delivers it; the reply leaves its service time
        later and is handed over when the ``actions`` link delivers it (or when it really came, if later).
        Nothing waits until the returned function is called, so a prefetched request's delays run while the
        env steps.
        """
        sent = time.monotonic()
        arrives = self._due("obs", self.obs, msg, sent)
        wait_reply = start(msg)

        def receive() -> Any:
            reply, service_s = wait_reply()
            due = self._due("actions", self.actions, reply, arrives + service_s)
            while (left := due - time.monotonic()) > 0:
                time.sleep(left)
            return reply

        return receive

    def take_delays(self) -> dict[str, list[float]]:
        """The delays since the last call, ``{stream: [seconds, messages]}``."""
        out, self.delays = self.delays.totals, LinkDelays()
        return out

    def _due(self, name: str, clock: LinkClock | None, payload: Any, put_s: float) -> float:
        """When ``payload``, put on stream ``name`` at ``put_s``, is delivered (``put_s`` without a link)."""
        if clock is None:
            return put_s
        from .channel import to_wire

        due = clock.deliver(put_s, to_wire(payload)[1])
        self.delays.add(name, due - put_s)
        return due
