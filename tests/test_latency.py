"""The real-world link simulator: delay distributions, obs/action delay wrappers, channel links."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from rlinf_nb.config import ConfigError, build, to_dict
from rlinf_nb.envs import VecEnv, make_env
from rlinf_nb.envs.latency import ActionDelay, ObsDelay, apply_link
from rlinf_nb.link import (
    ChannelLink,
    DelayDistribution,
    LinkClock,
    LinkConfig,
    delay_kinds,
    delay_steps,
    delivery_times,
)
from rlinf_nb.run_config import RunConfig

# ----------------------------------------------------------------------------- a deterministic env


class Counter(gym.Env):
    """obs = [1000 * episode + step, action applied last]; reward = the applied action; ends after ``length``."""

    observation_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float64)
    action_space = gym.spaces.Box(-100.0, 100.0, (1,), np.float64)

    def __init__(self, length: int = 100):
        self.length = length
        self.episode = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.array([1000.0 * self.episode, 0.0]), {}

    def step(self, action):
        self.t += 1
        a = float(np.asarray(action).reshape(-1)[0])
        return np.array([1000.0 * self.episode + self.t, a]), a, self.t >= self.length, False, {}


COUNTER = "rlinf_nb_test/Counter-v0"
if COUNTER not in gym.registry:
    gym.register(COUNTER, entry_point=Counter, disable_env_checker=True)


def counter(num_envs: int = 1, length: int = 100) -> VecEnv:
    return VecEnv(COUNTER, num_envs, seed=0, length=length)


def const(ms: float) -> DelayDistribution:
    return build(DelayDistribution, {"kind": "constant", "ms": ms})


# ----------------------------------------------------------------------------- distributions

KINDS = {
    "constant": {"kind": "constant", "ms": 20},
    "uniform": {"kind": "uniform", "low_ms": 10, "high_ms": 40},
    "exponential": {"kind": "exponential", "mean_ms": 15, "offset_ms": 5},
    "gaussian": {"kind": "gaussian", "mean_ms": 30, "std_ms": 10},
    "histogram": {"kind": "histogram", "edges_ms": [0, 10, 20, 50], "weights": [1, 0, 3]},
}


def test_every_kind_is_registered():
    assert delay_kinds() == ["none", *KINDS]


@pytest.mark.parametrize("name", list(KINDS))
def test_sampling_is_reproducible_given_the_seed(name):
    dist = build(DelayDistribution, KINDS[name])
    a = dist.sample(np.random.default_rng(7), 1000)
    assert a.dtype == np.float64 and a.shape == (1000,) and (a >= 0).all()
    np.testing.assert_array_equal(a, dist.sample(np.random.default_rng(7), 1000))
    if name != "constant":
        assert not np.array_equal(a, dist.sample(np.random.default_rng(8), 1000))


N = 200_000


def _close(x: np.ndarray, mean: float, std: float) -> None:
    """The sample mean is within 5 standard errors of ``mean``."""
    assert abs(x.mean() - mean) < 5 * std / np.sqrt(len(x)), (x.mean(), mean)


def test_means_and_bounds():
    rng = np.random.default_rng(0)
    assert (build(DelayDistribution, KINDS["constant"]).sample(rng, 100) == 20.0).all()
    assert (DelayDistribution().sample(rng, 100) == 0.0).all()

    u = build(DelayDistribution, KINDS["uniform"]).sample(rng, N)
    assert u.min() >= 10 and u.max() <= 40
    _close(u, 25.0, 30 / np.sqrt(12))

    e = build(DelayDistribution, KINDS["exponential"]).sample(rng, N)
    assert e.min() >= 5
    _close(e, 20.0, 15.0)

    g = build(DelayDistribution, KINDS["gaussian"]).sample(rng, N)
    assert g.min() >= 0
    _close(g, 30.0, 10.0)  # clipping moves the mean by 0.004 ms here
    # Mostly clipped: half the draws are exactly 0 and the mean is std / sqrt(2 pi).
    half = build(DelayDistribution, {"kind": "gaussian", "mean_ms": 0, "std_ms": 10}).sample(rng, N)
    assert half.min() == 0.0 and abs((half == 0).mean() - 0.5) < 0.01
    _close(half, 10 / np.sqrt(2 * np.pi), 10.0)


def test_histogram_draws_only_from_bins_with_weight():
    h = build(DelayDistribution, KINDS["histogram"]).sample(np.random.default_rng(1), N)
    assert h.min() >= 0 and h.max() < 50
    assert not ((h >= 10) & (h < 20)).any()  # the weight-0 bin
    share = (h < 10).mean()
    assert abs(share - 0.25) < 5 * np.sqrt(0.25 * 0.75 / N)
    _close(h[h >= 20], 35.0, 30 / np.sqrt(12))  # uniform inside its bin


@pytest.mark.parametrize(
    ("cfg", "field", "says"),
    [
        ({"kind": "poisson"}, "kind", "allowed values: 'none', 'constant', 'uniform'"),
        ({"kind": "uniform", "low_ms": 5}, "high_ms", "required by kind 'uniform'"),
        ({"kind": "uniform", "low_ms": 50, "high_ms": 10}, "high_ms", "must be >= low_ms"),
        ({"kind": "constant", "ms": 5, "std_ms": 1}, "std_ms", "not used by kind 'constant'"),
        ({"kind": "constant", "ms": -1}, "ms", "allowed range"),
        ({"kind": "gaussian", "mean_ms": 10, "std_ms": -2}, "std_ms", "allowed range"),
        ({"kind": "exponential"}, "mean_ms", "required"),
        ({"kind": "histogram", "edges_ms": [0, 20, 10], "weights": [1, 1]}, "edges_ms", "increasing"),
        ({"kind": "histogram", "edges_ms": [0, 10], "weights": [1, 1]}, "weights", "expected 1 weights"),
        ({"kind": "histogram", "edges_ms": [0, 10, 20], "weights": [0, 0]}, "weights", "not all 0"),
        ({"kind": "histogram", "edges_ms": [0, 10], "weights": [-1]}, "weights", ">= 0"),
        ({"kind": "uniform", "low_ms": "fast", "high_ms": 10}, "low_ms", "expected"),
    ],
)
def test_bad_parameters_name_the_field(cfg, field, says):
    with pytest.raises(ConfigError) as info:
        build(DelayDistribution, cfg, path="obs_delay")
    assert info.value.key_path == f"obs_delay.{field}"
    assert says in str(info.value)


def test_exponential_offset_is_optional():
    d = build(DelayDistribution, {"kind": "exponential", "mean_ms": 10})
    assert d.sample(np.random.default_rng(0), 10).min() >= 0


def test_delay_steps_rounds_up_to_the_next_tick():
    np.testing.assert_array_equal(
        delay_steps([0, 1, 10, 20, 20.5, 40, 41, 100], 20), [0, 1, 1, 1, 2, 2, 3, 5]
    )


# ----------------------------------------------------------------------------- observation delay


def _run(env, actions):
    """Step ``env`` through ``actions`` (one per step, for env 0); the results."""
    return [env.step(np.full((env.num_envs, 1), a, np.float64)) for a in actions]


def test_constant_obs_delay_shows_the_observation_from_k_steps_ago():
    env = ObsDelay(counter(2), const(40), dt_ms=20, seed=0)  # 40 ms at 20 ms = 2 steps
    assert env.reset()[:, 0].tolist() == [0, 0]
    seen = [r.obs[:, 0].tolist() for r in _run(env, range(8))]
    assert seen == [[max(0, t - 2)] * 2 for t in range(1, 9)]
    assert env.shown_index.tolist() == [6, 6]


def test_zero_delay_obs_is_the_env_itself():
    plain, wrapped = counter(), ObsDelay(counter(), const(0), dt_ms=20)
    plain.reset(), wrapped.reset()
    for a in range(5):
        np.testing.assert_array_equal(plain.step([[a]]).obs, wrapped.step([[a]]).obs)


def test_random_obs_delays_are_monotone_bounded_and_seeded():
    dist = build(DelayDistribution, {"kind": "uniform", "low_ms": 0, "high_ms": 100})

    def shown(seed):
        env = ObsDelay(counter(3, length=1000), dist, dt_ms=20, seed=seed)
        env.reset()
        return np.array([r.obs[:, 0] for r in _run(env, range(200))])

    s = shown(1)  # [T, N] step index of the observation shown (one episode: value = step)
    t = np.arange(1, 201)[:, None]
    assert (np.diff(s, axis=0) >= 0).all()  # never older than one already shown
    assert ((t - s >= 0) & (t - s <= 5)).all()  # at most ceil(100 / 20) steps old
    assert len(np.unique(t - s)) > 3  # the lag really varies
    np.testing.assert_array_equal(s, shown(1))
    assert not np.array_equal(s, shown(2))


def test_an_observation_from_before_a_reset_never_reaches_the_new_episode():
    env = ObsDelay(counter(1, length=5), const(60), dt_ms=20, seed=0)  # 3 steps
    env.reset()
    res = _run(env, range(12))
    # Episode 0 shows steps max(0, t - 3); its end reports the delayed view (step 2) as final_obs;
    # the new episode's first observation is shown at once, then again until step 1 lands.
    assert [r.obs[0, 0] for r in res] == [0, 0, 0, 1, 1000, 1000, 1000, 1000, 1001, 2000, 2000, 2000]
    assert res[4].terminated[0] and res[4].final_obs[0, 0] == 2
    assert res[9].terminated[0] and res[9].final_obs[0, 0] == 1002
    assert all(r.final_obs is None for i, r in enumerate(res) if i not in (4, 9))


# ----------------------------------------------------------------------------- action delay


def test_constant_action_delay_applies_the_action_decided_k_steps_ago():
    env = ActionDelay(counter(1), const(40), dt_ms=20, seed=0)  # 2 steps
    env.reset()
    res = _run(env, range(1, 9))  # the action decided at step t is t + 1
    assert [r.obs[0, 1] for r in res] == [0, 0, 1, 2, 3, 4, 5, 6]  # zero fill, then shifted by 2
    assert [r.reward[0] for r in res] == [0, 0, 1, 2, 3, 4, 5, 6]  # the env really got them
    assert env.applied_index[0] == 5


def test_random_action_delays_hold_the_newest_arrival():
    dist = build(DelayDistribution, {"kind": "exponential", "mean_ms": 30})
    env = ActionDelay(counter(4, length=1000), dist, dt_ms=20, seed=3)
    env.reset()
    applied, index = [], []
    for t in range(300):
        env.step(np.full((4, 1), t + 1.0))
        applied.append(env.last_applied[:, 0].copy())
        index.append(env.applied_index.copy())
    applied, index = np.array(applied), np.array(index)
    started = index >= 0
    assert (np.diff(index, axis=0) >= 0).all()  # monotone: an overtaken action is never applied
    np.testing.assert_array_equal(applied[started], index[started] + 1)  # the action decided at that step
    assert (applied[~started] == 0).all()  # zero fill before the first arrival
    assert (np.arange(300)[:, None] - index >= 0).all()
    assert len(np.unique(np.arange(300)[:, None] - index)) > 3


@pytest.mark.parametrize(("fill", "expected"), [("zero", [0, 0, 1, 0, 0, 4, 0, 0, 7]),
                                                 ("hold", [0, 0, 1, 1, 1, 4, 4, 4, 7])])  # fmt: skip
def test_actions_of_an_episode_never_reach_the_next(fill, expected):
    env = ActionDelay(counter(1, length=3), const(40), dt_ms=20, fill=fill, seed=0)  # 2 steps
    env.reset()
    applied = []
    for a in range(1, 10):
        env.step([[a]])
        applied.append(env.last_applied[0, 0])
    # Episodes of 3 steps: only the action decided at each episode's step 0 lands before its end;
    # the two decided after it are dropped at the reset and the fill covers the new episode's start.
    assert applied == expected


def test_zero_fill_is_clipped_into_the_action_space():
    env = ActionDelay(VecEnv("Pendulum-v1", 1, seed=0), const(20), dt_ms=20)
    env.reset()
    env.step(np.ones((1, 1), np.float32))
    assert env.last_applied.tolist() == [[0.0]]
    box = gym.spaces.Box(1.0, 2.0, (1,), np.float32)
    env.env.action_space = box  # a space without 0 in it
    env.reset()
    env.step(np.full((1, 1), 1.5, np.float32))
    assert env.last_applied.tolist() == [[1.0]]


# ----------------------------------------------------------------------------- both, make_env, config


LINK = {
    "obs_delay": {"kind": "uniform", "low_ms": 0, "high_ms": 40},
    "action_delay": {"kind": "gaussian", "mean_ms": 20, "std_ms": 10},
    "dt_ms": 20,
}


def test_apply_link_wraps_only_what_is_delayed():
    env = counter()
    assert apply_link(env, None) is env and apply_link(env, {}) is env
    assert apply_link(env, {"obs_delay": {"kind": "constant", "ms": 0}}) is env
    assert type(apply_link(env, {"obs_delay": {"kind": "constant", "ms": 5}})) is ObsDelay
    both = apply_link(env, LINK, seed=0)
    assert type(both) is ObsDelay and type(both.env) is ActionDelay and both.unwrapped is env


def test_link_is_deterministic_given_the_seed_and_reset_replays():
    def episode(env, seed=None):
        out = [env.reset(seed=seed)]
        out += [r.obs for r in _run(env, range(50))]
        return np.array(out)

    a = make_env(COUNTER, 2, seed=5, link=LINK, length=1000)
    b = make_env(COUNTER, 2, seed=5, link=LINK, length=1000)
    first = episode(a)
    np.testing.assert_array_equal(
        first[:, :, 1], episode(b)[:, :, 1]
    )  # same delays (column 0 counts episodes)
    np.testing.assert_array_equal(episode(a)[:, :, 1], first[:, :, 1])  # reset() replays the same delays
    assert not np.array_equal(episode(a, seed=6)[:, :, 1], first[:, :, 1])


def test_make_env_link_on_the_robot_backend():
    plain = make_env("robot:mock_arm/reach", 2, seed=0)
    env = make_env("robot:mock_arm/reach", 2, seed=0, link=LINK)
    assert env.observation_space == plain.observation_space and env.action_space == plain.action_space
    assert len(env.envs) == 2  # the robot envs stay reachable (human_command goes through them)
    obs = env.reset()
    for _ in range(5):
        res = env.step(np.zeros((2, 3), np.float32))
        assert res.obs.shape == obs.shape and res.obs.dtype == obs.dtype
    env.close(), plain.close()


def test_make_env_refuses_a_bad_link_before_making_the_env():
    with pytest.raises(ConfigError, match=r"link\.dt_ms: got 0"):
        make_env(COUNTER, 1, link={"dt_ms": 0})


def test_run_config_env_link_builds_and_reaches_make_env():
    cfg = build(RunConfig, {"env": {"id": COUNTER, "num_envs": 2, "link": LINK}})
    assert isinstance(cfg.env.link, LinkConfig) and cfg.env.link.enabled
    assert cfg.env.link.obs_delay == DelayDistribution(kind="uniform", low_ms=0.0, high_ms=40.0)
    env_cfg = to_dict(cfg.env)  # what the controller hands each EnvWorker
    assert build(RunConfig, to_dict(cfg)).env.link == cfg.env.link  # the resolved config.yaml reloads
    env = make_env(env_cfg["id"], env_cfg["num_envs"], seed=0, link=env_cfg["link"], **env_cfg["kwargs"])
    assert type(env) is ObsDelay
    default = to_dict(build(RunConfig, {}).env)
    assert type(make_env(COUNTER, 1, seed=0, link=default["link"])) is VecEnv  # off by default


def test_run_config_bad_kind_names_the_allowed_kinds():
    with pytest.raises(ConfigError) as info:
        build(RunConfig, {"env": {"link": {"action_delay": {"kind": "lognormal"}}}})
    assert info.value.key_path == "env.link.action_delay.kind"
    assert "'constant', 'uniform', 'exponential', 'gaussian', 'histogram'" in str(info.value)
    with pytest.raises(
        ConfigError, match=r"env\.link\.action_fill: got 'last'; allowed values: 'zero', 'hold'"
    ):
        build(RunConfig, {"env": {"link": {"action_fill": "last"}}})


# ----------------------------------------------------------------------------- channel links


def test_delivery_times_exact():
    # Latency only: each message is visible its latency after its put.
    out, _, _ = delivery_times([0.0, 0.01, 0.02], [10, 10, 10], [0.05] * 3)
    np.testing.assert_allclose(out, [0.05, 0.06, 0.07], rtol=0, atol=1e-12)
    # 1 MB/s, 100 kB each, put back to back: sends end at 0.1, 0.2, 0.3 s; an idle link starts at once.
    out, busy, last = delivery_times([0.0, 0.0, 0.0, 1.0], [100_000] * 4, [0.05] * 4, bandwidth_bytes_s=1e6)
    np.testing.assert_allclose(out, [0.15, 0.25, 0.35, 1.15], rtol=0, atol=1e-12)
    assert busy == pytest.approx(1.1) and last == pytest.approx(1.15)
    # In put order: a fast message waits for the slow one before it.
    out, _, _ = delivery_times([0.0, 0.01, 0.02], [0, 0, 0], [0.1, 0.0, 0.2])
    np.testing.assert_allclose(out, [0.1, 0.1, 0.22], rtol=0, atol=1e-12)
    # Carrying the state across calls is the same as one call.
    put, size, lat = [0.0, 0.05, 0.06, 0.3], [50_000, 200_000, 0, 10_000], [0.02, 0.01, 0.0, 0.03]
    whole, _, _ = delivery_times(put, size, lat, 2e6)
    head, busy, last = delivery_times(put[:2], size[:2], lat[:2], 2e6)
    tail, _, _ = delivery_times(put[2:], size[2:], lat[2:], 2e6, busy, last)
    np.testing.assert_allclose(np.concatenate([head, tail]), whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(whole, [0.045, 0.16, 0.16, 0.335], rtol=0, atol=1e-12)


def test_link_clock_samples_latency_and_queues_on_bandwidth():
    clock = LinkClock({"latency": {"kind": "constant", "ms": 50}, "bandwidth_bytes_s": 1e6})
    assert clock.deliver(10.0, 0) == pytest.approx(10.05)
    assert clock.deliver(10.0, 200_000) == pytest.approx(10.25)
    assert clock.deliver(10.0, 100_000) == pytest.approx(10.35)  # queued behind the 200 kB one
    a = LinkClock({"latency": {"kind": "uniform", "low_ms": 0, "high_ms": 100}, "seed": 3})
    b = LinkClock(
        ChannelLink(
            latency=build(DelayDistribution, {"kind": "uniform", "low_ms": 0, "high_ms": 100}), seed=3
        )
    )
    assert [a.deliver(i, 0) for i in range(20)] == [b.deliver(i, 0) for i in range(20)]


def test_channel_link_is_validated_in_the_caller():
    from rlinf_nb.runtime.channel import Channel

    with pytest.raises(ConfigError) as info:
        Channel.create(
            "test/badlink", link={"latency": {"kind": "bogus"}}
        )  # no actor made (no cluster needed)
    assert info.value.key_path == "link.latency.kind"
    with pytest.raises(ConfigError, match="link.bandwidth_bytes_s"):
        Channel.create("test/badlink", link={"bandwidth_bytes_s": -1})


def test_channel_with_latency_delivers_no_message_early(attached):
    from rlinf_nb.runtime.channel import Channel, ChannelTimeout

    ch = Channel.create("test/link", maxsize=8, link={"latency": {"kind": "constant", "ms": 50}})
    plain = Channel.create("test/nolink", maxsize=8)
    try:
        for i in range(5):
            t0 = time.monotonic()
            ch.put("k", i)
            assert ch.get("k") == i
            assert time.monotonic() - t0 >= 0.05
        # Pipelined puts: each item is seen no earlier than 50 ms after its own put began.
        starts = []
        for i in range(4):
            starts.append(time.monotonic())
            ch.put("p", np.full(3, i), block=False)
        for i in range(4):
            assert ch.get("p", as_torch=False).tolist() == [i] * 3
            assert time.monotonic() - starts[i] >= 0.05
        # A get only sees delivered items; ones in flight count in the depth.
        slow = Channel.create("test/slow", maxsize=4, link={"latency": {"kind": "constant", "ms": 3000}})
        try:
            t0 = time.monotonic()
            slow.put("s", "late")
            with pytest.raises(ChannelTimeout):
                slow.get("s", timeout=0.3)
            assert slow.metrics()["in_flight"] == 1 and slow.latest("s") is None
            assert slow.get_many("s", timeout=30) == ["late"]
            assert time.monotonic() - t0 >= 3.0
        finally:
            slow.kill()
        # Bandwidth: three 1 MB messages at 20 MB/s queue on the link (50 ms each).
        bw = Channel.create("test/bw", maxsize=8, link={"bandwidth_bytes_s": 20e6})
        try:
            t0 = time.monotonic()
            for _ in range(3):
                bw.put("big", np.zeros(1_000_000, np.uint8), block=False)
            for _ in range(3):
                bw.get("big", as_torch=False)
            assert time.monotonic() - t0 >= 0.15
        finally:
            bw.kill()
        # Without a link the channel is unchanged: FIFO, everything queued is visible, no link metrics.
        for i in range(3):
            plain.put("a", i)
        assert plain.get_many("a", max_items=8, timeout=5) == [0, 1, 2]
        assert "in_flight" not in plain.metrics() and "in_flight" in ch.metrics()
    finally:
        ch.kill()
        plain.kill()


def test_a_run_with_env_link_trains_through_the_delayed_env(attached):
    import uuid

    import rlinf_nb as rl

    link = {"obs_delay": {"kind": "constant", "ms": 40}, "action_delay": {"kind": "uniform", "low_ms": 0,
            "high_ms": 40}, "dt_ms": 20}  # fmt: skip
    with pytest.raises(ConfigError, match=r"env\.link\.obs_delay\.kind: got 'slow'; allowed values"):
        rl.launch("ppo_cartpole", name="badlink", env__link={"obs_delay": {"kind": "slow"}})
    run = rl.launch("ppo_cartpole", name=f"link_{uuid.uuid4().hex[:6]}", budget__total_env_steps=512,
                    linger_s=3, env__link=link)  # fmt: skip
    st = run.wait(timeout=300, progress=False)
    assert st["state"] == "finished" and st["env_steps"] >= 512, st
    saved = run.config()["env"]["link"]
    assert saved["obs_delay"]["ms"] == 40 and saved["action_delay"]["kind"] == "uniform"
