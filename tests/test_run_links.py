"""``placement.links``: simulated latency/bandwidth on a run's obs, actions and trajectories streams."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from rlinf_nb.runtime.links import DirectLink, LinkDelays, RunLinks, link_enabled

from rlinf_nb.config import ConfigError, build
from rlinf_nb.link import ChannelLink
from rlinf_nb.run_config import RunConfig

# ----------------------------------------------------------------------------- config (no cluster)


def links_of(section: dict) -> RunLinks:
    return build(RunConfig, {"placement": {"links": section}}).placement.links


def test_links_are_off_by_default():
    links = RunConfig().placement.links
    assert links.active() == {} and links.describe() == {}
    assert all(links.channel_link(n) is None for n in ("obs", "actions", "trajectories"))


def test_an_unknown_stream_lists_the_allowed_ones():
    with pytest.raises(
        ConfigError, match=r"placement\.links\.frames: .*allowed keys: actions, obs, trajectories"
    ):
        links_of({"frames": {"latency": 10}})


@pytest.mark.parametrize(
    "section, says",
    [
        ({"obs": {"latency": {"kind": "slow"}}}, r"placement\.links\.obs\.latency\.kind: got 'slow'; allowed values: 'none'"),
        ({"actions": {"latency": {"kind": "uniform", "low_ms": 5}}}, r"placement\.links\.actions\.latency\.high_ms: got None; required by kind 'uniform'"),
        ({"obs": {"latency": {"kind": "constant", "ms": 5, "std_ms": 1}}}, r"placement\.links\.obs\.latency\.std_ms: got 1.*not used by kind 'constant'"),
        ({"trajectories": {"bandwidth_bytes_s": -1}}, r"placement\.links\.trajectories\.bandwidth_bytes_s: got -1.0; allowed range"),
    ],
)  # fmt: skip
def test_bad_link_fields_name_the_key_path(section, says):
    with pytest.raises(ConfigError, match=says):
        links_of(section)


def test_active_links_and_their_description():
    links = links_of(
        {"obs": {"latency": {"kind": "constant", "ms": 50}}, "trajectories": {"bandwidth_bytes_s": 1e6}}
    )
    assert set(links.active()) == {"obs", "trajectories"}
    assert links.channel_link("actions") is None and links.channel_link("obs").latency.ms == 50
    assert links.describe()["obs"] == {
        "latency": {"kind": "constant", "ms": 50.0},
        "bandwidth_bytes_s": 0.0,
        "seed": 0,
    }
    assert not link_enabled(ChannelLink()) and link_enabled(build(ChannelLink, {"bandwidth_bytes_s": 10}))


def _direct_link():
    """Constant 30 ms each way plus 1000 bytes at 100 kB/s (10 ms) on the reply."""
    return DirectLink(
        {"obs": {"latency": {"kind": "constant", "ms": 30}},
         "actions": {"latency": {"kind": "constant", "ms": 30}, "bandwidth_bytes_s": 1e5}},
        rank=0,
    )  # fmt: skip


def test_direct_link_waits_out_request_service_and_reply_and_leaves_the_data_alone():
    """The reply is handed over no sooner than the request's 30 ms, the policy's 20 ms of service and the
    reply's 30 + 10 ms; the recorded delays are the link's own maths, the reply is what the policy sent."""
    import time

    link = _direct_link()
    reply = {"actions": np.arange(250, dtype=np.float32)}  # 1000 bytes
    t0 = time.monotonic()
    out = link.submit(lambda msg: lambda: (reply, 0.020), {"obs": np.zeros(4, np.float32)})()
    assert out is reply
    assert time.monotonic() - t0 >= 0.030 + 0.020 + 0.040  # a lower bound: every part was waited out
    delays = link.take_delays()
    assert delays["obs"][0] == pytest.approx(0.030) and delays["obs"][1] == 1
    assert delays["actions"][0] == pytest.approx(0.040) and delays["actions"][1] == 1
    assert link.take_delays() == {}


def test_direct_link_submit_starts_the_request_at_once_and_waits_only_when_asked(monkeypatch):
    """A prefetched request reaches the policy straight away (its link delay is simulated, not slept), and
    nothing sleeps until the reply is asked for: the env keeps stepping meanwhile."""
    import threading
    import time

    sleeps: list[float] = []  # this thread's (another thread of the test process may sleep meanwhile)
    real_sleep, me = time.sleep, threading.get_ident()

    def sleep(seconds):
        if threading.get_ident() == me:
            sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    link = _direct_link()
    started = []

    def start(msg):
        started.append(msg)
        return lambda: ({"actions": np.zeros(250, np.float32)}, 0.0)

    t0 = time.monotonic()
    receive = link.submit(start, {"obs": np.zeros(4, np.float32)})
    assert len(started) == 1 and sleeps == []  # sent, and nothing slept yet
    assert link.take_delays()["obs"][0] == pytest.approx(0.030)
    receive()
    assert time.monotonic() - t0 >= 0.030 + 0.040  # a lower bound: the round trip was waited out, once asked


def delays_drawn(link, n: int = 20) -> np.ndarray:
    from rlinf_nb.link import LinkClock

    clock = LinkClock(link)
    return np.array([clock.deliver(float(i), 0) - i for i in range(n)])  # messages 1 s apart: no queueing


UNIFORM = {"latency": {"kind": "uniform", "low_ms": 0, "high_ms": 100}}


def test_streams_sharing_a_seed_draw_independent_latencies():
    """obs, actions and trajectories default to the same seed (0); each stream must still draw its
    own sequence (perfectly correlated request and reply delays would model no real network)."""
    links = links_of({"obs": UNIFORM, "actions": UNIFORM, "trajectories": UNIFORM})
    draws = {n: delays_drawn(links.channel_link(n)) for n in ("obs", "actions", "trajectories")}
    assert not np.allclose(draws["obs"], draws["actions"])
    assert not np.allclose(draws["obs"], draws["trajectories"])
    again = links_of({"obs": UNIFORM, "actions": UNIFORM, "trajectories": UNIFORM})
    np.testing.assert_array_equal(draws["obs"], delays_drawn(again.channel_link("obs")))  # reproducible
    other = links_of({"obs": {**UNIFORM, "seed": 1}})
    assert not np.allclose(draws["obs"], delays_drawn(other.channel_link("obs")))  # the seed still counts


def test_direct_links_draw_per_stream_and_per_env_worker():
    config = {"obs": UNIFORM, "actions": UNIFORM}

    def draws(rank: int) -> tuple[np.ndarray, np.ndarray]:
        link = DirectLink(config, rank=rank)
        obs = np.array([link.obs.deliver(float(i), 0) - i for i in range(20)])
        actions = np.array([link.actions.deliver(float(i), 0) - i for i in range(20)])
        return obs, actions

    (obs0, act0), (obs1, act1), (obs0_again, _) = draws(0), draws(1), draws(0)
    assert not np.allclose(obs0, act0) and not np.allclose(obs0, obs1) and not np.allclose(act0, act1)
    np.testing.assert_array_equal(obs0, obs0_again)
    assert obs0.min() >= 0 and obs0.max() <= 0.1


def test_link_delays_metrics():
    d = LinkDelays()
    d.add("obs", 0.05, 2)
    d.merge({"actions": [0.3, 2]})
    m = d.metrics()
    assert m["link_delay_ms/obs"] == pytest.approx(25.0) and m["link_delay_ms/actions"] == pytest.approx(
        150.0
    )
    assert m["link_delay_ms"] == pytest.approx(87.5)
    assert LinkDelays().metrics() == {}


# ----------------------------------------------------------------------------- on the cluster

T = 8  # rollout steps per segment: T + 1 policy calls (the last one for bootstrap values)
LINKS = {
    "obs": {"latency": {"kind": "constant", "ms": 50}},
    "actions": {"latency": {"kind": "constant", "ms": 50}},
    "trajectories": {"latency": {"kind": "constant", "ms": 200}},
}


def one_segment(mode: str, links: dict | None):
    import rlinf_nb as rl

    placement = {"env_to_rollout": mode, **({"links": links} if links else {})}
    run = rl.launch({
        "algorithm": "ppo", "seed": 5,
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
        "algo": {"rollout_steps": T, "epochs": 1, "minibatch_size": 16},
        "placement": placement,
        "budget": {"total_env_steps": 2 * T}, "checkpoint": {"every": 0}, "linger_s": 60,
    }, name=f"links_{mode}_{uuid.uuid4().hex[:6]}")  # fmt: skip
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st.get("error")
    return run, run.batch().to_local(), run.metrics().iloc[-1], st


@pytest.mark.usefixtures("attached")
def test_links_delay_both_rollout_paths_and_never_change_the_data():
    plain_run, plain, plain_m, plain_st = one_segment("direct", None)
    assert "link_delay_ms" not in plain_m.index and "links" not in plain_st
    assert "links" not in set(plain_run.events()["kind"])
    # the physics: every policy call crosses the obs link then the actions link (50 + 50 ms), and the
    # segment crosses the trajectories link (200 ms), so the controller's rollout stage takes at least
    bound_s = (T + 1) * (0.050 + 0.050) + 0.200
    for mode in ("direct", "channel"):
        run, batch, m, st = one_segment(mode, LINKS)
        assert m["time/rollout"] >= bound_s, (mode, m["time/rollout"])
        assert m["link_delay_ms/obs"] == pytest.approx(50.0, abs=1e-3), mode
        assert m["link_delay_ms/actions"] == pytest.approx(50.0, abs=1e-3), mode
        assert m["link_delay_ms/trajectories"] == pytest.approx(200.0, abs=1e-3), mode
        assert st["links"]["obs"]["latency"] == {"kind": "constant", "ms": 50.0}, mode
        events = run.events()
        ev = events[events["kind"] == "links"].iloc[0]
        assert ev["env_to_rollout"] == mode and ev["trajectories"]["latency"]["ms"] == 200.0
        for key in ("obs", "actions", "logprobs", "values", "rewards", "dones"):  # links only delay
            np.testing.assert_array_equal(batch[key], plain[key], err_msg=f"{mode}: {key}")


# ----------------------------------------------------------------------------- live links


def test_a_linked_streams_latency_and_bandwidth_are_live_params():
    from rlinf_nb.client import resolve_config
    from rlinf_nb.run_config import live_params

    cfg = resolve_config("ppo_cartpole", placement__env_to_rollout="direct",
                         placement__links={"obs": {"latency": {"kind": "exponential", "mean_ms": 20}},
                                           "trajectories": {"latency": {"kind": "constant", "ms": 100}}})  # fmt: skip
    live = live_params(cfg, ("obs", "trajectories"))
    links = sorted(k for k in live if k.startswith("placement.links."))
    assert (
        links
        == [
            "placement.links.obs.bandwidth_bytes_s",
            "placement.links.obs.latency.mean_ms",
            "placement.links.obs.latency.offset_ms",
            "placement.links.trajectories.bandwidth_bytes_s",
            "placement.links.trajectories.latency.ms",
        ]
    )  # the kinds' parameters (optional ones too); no kind, no seed, and nothing of the unlinked actions stream
    assert live["placement.links.obs.latency.mean_ms"].metadata["range"] == (0, None)
    assert not [k for k in live_params(cfg) if k.startswith("placement.links.")]  # no stream linked at launch


def test_a_retuned_clock_keeps_its_draws_and_queue():
    from rlinf_nb.link import LinkClock

    link = {"latency": {"kind": "uniform", "low_ms": 10, "high_ms": 20}, "seed": 3}
    a, b = LinkClock(link), LinkClock(link)
    # messages 10 s apart: each one's delivery is its put time plus its own latency
    assert [a.deliver(10.0 * i, 0) for i in range(3)] == [b.deliver(10.0 * i, 0) for i in range(3)]
    a.retune({"latency": {"kind": "uniform", "low_ms": 110, "high_ms": 120}, "seed": 99})
    # the same draw (the seed is kept), on the new range: 100 ms later
    assert a.deliver(30.0, 0) == pytest.approx(b.deliver(30.0, 0) + 0.1)
    assert a.link.seed == 3
    a.retune({"latency": {"kind": "constant", "ms": 0}, "bandwidth_bytes_s": 1000.0})
    assert a.deliver(40.0, 500) == pytest.approx(40.5)  # the new bandwidth: 500 bytes take 0.5 s
    assert a.deliver(40.0, 500) == pytest.approx(41.0)  # and queue behind each other


@pytest.mark.usefixtures("attached")
@pytest.mark.parametrize("mode", ["direct", "channel"])
def test_a_live_link_change_reaches_the_next_segments(mode):
    """A run with 10 ms links; ``set_hparams`` raises the obs latency to 40 ms and the trajectories one to
    300 ms: the rows after the change measure the new delays (direct: the env workers' own link; channel:
    the obs and trajectories channel actors), the rows before it the old ones."""
    import time

    import rlinf_nb as rl

    links = {"obs": {"latency": {"kind": "constant", "ms": 10}}, "actions": {"latency": {"kind": "constant", "ms": 10}},
             "trajectories": {"latency": {"kind": "constant", "ms": 10}}}  # fmt: skip
    run = rl.launch({
        "algorithm": "ppo", "seed": 0, "env": {"id": "CartPole-v1", "num_envs": 2},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
        "algo": {"rollout_steps": T, "epochs": 1, "minibatch_size": 16},
        "placement": {"env_to_rollout": mode, "links": links},
        "budget": {"total_env_steps": 10**7, "stop_metric": None, "stop_value": None}, "checkpoint": {"every": 0},
    }, name=f"livelink_{mode}_{uuid.uuid4().hex[:6]}")  # fmt: skip
    try:
        deadline = time.time() + 300
        while len(run.metrics()) < 2 and time.time() < deadline:  # two rows with the launch's links
            time.sleep(0.3)
        assert "placement.links.obs.latency.ms" in run.hparams
        with pytest.raises(ConfigError, match="not a live hyperparameter"):
            run.set_hparams(**{"placement.links.obs.latency.kind": "uniform"})
        run.set_hparams(
            **{"placement.links.obs.latency.ms": 40.0, "placement.links.trajectories.latency.ms": 300.0}
        )
        changed_at = None  # the update step when the change was applied (at a stage boundary of the next)
        while time.time() < deadline:
            events = run.events()
            applied = events[events["kind"] == "hparams"]
            if len(applied):
                changed_at = int(applied.iloc[0]["step"])
                if run.metrics()["step"].max() >= changed_at + 3:
                    break
            time.sleep(0.3)
        assert changed_at is not None, "the change was never applied"
    finally:
        run.stop()
    df = run.metrics()
    before, after = df[df["step"] <= changed_at], df[df["step"] >= changed_at + 2]
    assert len(before) >= 2 and len(after) >= 2
    assert np.allclose(before["link_delay_ms/obs"], 10.0, atol=1e-3)
    assert np.allclose(after["link_delay_ms/obs"], 40.0, atol=1e-3), after["link_delay_ms/obs"]
    assert np.allclose(after["link_delay_ms/trajectories"], 300.0, atol=1e-3)
    assert np.allclose(after["link_delay_ms/actions"], 10.0, atol=1e-3)
    assert (after["hp/placement.links.obs.latency.ms"] == 40.0).all()
