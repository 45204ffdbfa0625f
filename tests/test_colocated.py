"""``placement.env_to_rollout: colocated``: each env worker runs its own copy of the policy."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import gymnasium as gym
import numpy as np
import pytest
from rlinf_nb.runtime.inference import PolicyServer

from rlinf_nb.config import ConfigError, build
from rlinf_nb.run_config import RunConfig

T, N = 16, 2


def small_ppo(mode: str, **extra) -> dict:
    return {
        "algorithm": "ppo", "seed": 3,
        "env": {"id": "CartPole-v1", "num_envs": N},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
        "algo": {"rollout_steps": T, "epochs": 2, "minibatch_size": 16},
        "placement": {"env_to_rollout": mode},
        "budget": {"total_env_steps": 3 * T * N, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0}, "linger_s": 60, **extra,
    }  # fmt: skip


# ----------------------------------------------------------------------------- no cluster


def test_colocated_refuses_obs_and_actions_links_naming_the_key():
    section = {"env_to_rollout": "colocated", "links": {"obs": {"latency": {"kind": "constant", "ms": 20}}}}
    with pytest.raises(
        ConfigError, match=r"placement\.links\.obs: .*colocated policy has no obs/actions link"
    ):
        build(RunConfig, {"placement": section})
    # the trajectories link (env -> learner) still exists when the policy is colocated
    ok = {
        "env_to_rollout": "colocated",
        "links": {"trajectories": {"latency": {"kind": "constant", "ms": 20}}},
    }
    assert build(RunConfig, {"placement": ok}).placement.links.channel_link("trajectories") is not None


def test_an_unknown_mode_lists_colocated():
    with pytest.raises(ConfigError, match=r"placement\.env_to_rollout: got 'local'.*'colocated'"):
        build(RunConfig, {"placement": {"env_to_rollout": "local"}})


def _server() -> PolicyServer:
    """A torch server: it answers with its own seeded weights (version -1) before any are offered."""
    env = gym.make("CartPole-v1")
    return PolicyServer(
        {"name": "mlp", "kwargs": {"hidden_sizes": [8]}, "inference": "torch"},
        env.observation_space, env.action_space, 0,
    )  # fmt: skip


def _msg(obs: np.ndarray) -> dict:
    return {"obs": obs, "sender": 0, "final_obs": None, "final_mask": None, "value_only": False}


def test_offered_weights_load_before_the_next_decision_and_the_newest_wins():
    server, donor = _server(), _server()
    obs = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    before = server.answer([_msg(obs)])[0]
    assert (before["version"] == -1).all()
    weights = {k: v.numpy() * 0 + 0.5 for k, v in donor.policy.state_dict().items()}
    older = {k: v * 0 for k, v in weights.items()}
    server.offer_weights(weights, 7)
    server.offer_weights(older, 3)  # arrives late: an older version never replaces a newer one
    assert server.version == -1 and server.newest_version == 7  # parked: loaded at the next decision
    after = server.answer([_msg(obs)])[0]
    assert (after["version"] == 7).all()
    loaded = server.policy.state_dict()
    assert all(np.allclose(loaded[k].numpy(), 0.5) for k in weights)
    server.offer_weights(weights, 9)
    server.offer_weights(older, 3, replace=True)  # a learner restored from a checkpoint: older, but it wins
    assert server.newest_version == 7 and server.answer([_msg(obs)])[0]["version"][0] == 3
    assert all(np.allclose(server.policy.state_dict()[k].numpy(), 0.0) for k in older)


def test_weights_offered_from_another_thread_while_answering():
    server, donor = _server(), _server()
    obs = np.zeros((2, 4), np.float32)
    weights = {k: v.numpy() for k, v in donor.policy.state_dict().items()}
    seen: list[int] = []
    stop = threading.Event()

    def offer() -> None:
        for version in range(1, 200):
            server.offer_weights(weights, version)
        stop.set()

    thread = threading.Thread(target=offer)
    thread.start()
    while not stop.is_set():
        seen.append(int(server.answer([_msg(obs)])[0]["version"][0]))
    thread.join()
    seen.append(int(server.answer([_msg(obs)])[0]["version"][0]))
    assert seen == sorted(seen) and seen[-1] == 199  # versions only move forward; the last offer lands
    assert server.newest_version == 199


# ----------------------------------------------------------------------------- on the cluster


def _launch(cfg: dict, prefix: str):
    import rlinf_nb as rl

    return rl.launch(cfg, name=f"{prefix}_{uuid.uuid4().hex[:6]}")


@pytest.mark.usefixtures("attached")
def test_colocated_run_has_no_rollout_workers_and_matches_the_direct_path():
    """One env worker: its policy copy is seeded like rollout worker 0, so the two runs are identical."""
    runs = {}
    for mode in ("direct", "colocated"):
        run = _launch(small_ppo(mode), f"colo_{mode}")
        st = run.wait(timeout=600, progress=False)
        assert st["state"] == "finished", st.get("error")
        runs[mode] = (run, run.metrics(), run.batch().to_local())
    direct, colocated = runs["direct"], runs["colocated"]
    assert {p["group"] for p in colocated[0]._call("placement")} == {"env", "actor"}
    assert {p["group"] for p in direct[0]._call("placement")} == {"env", "rollout", "actor"}
    for key in ("actions", "logprobs", "values", "rewards", "versions", "advantages"):
        np.testing.assert_array_equal(colocated[2][key], direct[2][key], err_msg=key)
    assert colocated[2]["versions"].min() == 2  # the third rollout used the weights of update 2
    for col in ("env_steps", "episode_return_mean", "policy_staleness"):
        np.testing.assert_array_equal(colocated[1][col].to_numpy(float), direct[1][col].to_numpy(float), col)
    start = colocated[0].events().iloc[0]
    assert start["kind"] == "start" and 0 < start["setup_env_s"] <= start["setup_s"]
    # the env workers were asked for before the controller imported the algorithm (and torch)
    assert 0 < start["setup_env_requested_s"] < start["setup_config_s"] <= start["setup_begin_s"]


@pytest.mark.usefixtures("attached")
def test_a_learner_in_the_controller_trains_exactly_like_a_learner_worker():
    """placement.learner: controller runs the same learner code, seeded the same: the runs are identical."""
    runs = {}
    for where in ("worker", "controller"):
        cfg = small_ppo("colocated", checkpoint={"every": 2})
        cfg["placement"]["learner"] = where
        run = _launch(cfg, f"learner_{where}")
        st = run.wait(timeout=600, progress=False)
        assert st["state"] == "finished", st.get("error")
        runs[where] = (run, run.metrics(), run.batch().to_local(), run._call("placement"))
    worker, local = runs["worker"], runs["controller"]
    actor = [p for p in local[3] if p["group"] == "actor"]
    assert len(actor) == 1 and actor[0]["in_process"] is True  # no actor of its own: the controller's process
    assert not any(p.get("in_process") for p in worker[3])
    for key in ("actions", "logprobs", "values", "advantages", "versions"):
        np.testing.assert_array_equal(local[2][key], worker[2][key], err_msg=key)
    for col in ("env_steps", "episode_return_mean", "policy_loss", "value_loss", "policy_staleness"):
        np.testing.assert_array_equal(local[1][col].to_numpy(float), worker[1][col].to_numpy(float), col)
    assert (local[0].events()["kind"] == "checkpoint").any()  # the learner's state reached a checkpoint


def _small_sac(total_env_steps: int, env_workers: int = 1) -> dict:
    """A tiny colocated SAC run on Pendulum (weights synced every 2 updates, no stop threshold)."""
    return {
        "algorithm": "sac", "seed": 0,
        "env": {"id": "Pendulum-v1", "num_envs": 2},
        "algo": {"collect_steps": 16, "learning_starts": 64, "random_steps": 64, "batch_size": 32, "sync_every": 2},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
        "placement": {"env_to_rollout": "colocated", "env": {"num_workers": env_workers}},
        "budget": {"total_env_steps": total_env_steps, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0}, "linger_s": 60,
    }  # fmt: skip


@pytest.mark.usefixtures("attached")
def test_colocated_async_sac_loads_weights_while_collecting():
    """Off-policy collection runs during updates: the env workers' policy versions keep rising."""
    run = _launch(_small_sac(total_env_steps=800), "colo_sac")
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st.get("error")
    df = run.metrics()
    versions = run.batch().to_local(["versions"])["versions"]
    assert versions.min() >= 1  # the last segment ran on synced weights, not the initial -1
    assert df["policy_version"].iloc[-1] > 10 and df["policy_staleness"].notna().any()


@pytest.mark.usefixtures("attached")
def test_killed_colocated_env_worker_comes_back_with_weights():
    run = _launch(small_ppo("colocated", budget={"total_env_steps": 10**7, "stop_metric": None,
                                                 "stop_value": None}), "colo_kill")  # fmt: skip
    deadline = time.time() + 300
    while run.status()["update_step"] < 2 and time.time() < deadline:
        time.sleep(0.3)
    pid = next(h["pid"] for h in run.health()["groups"]["env"] if h["alive"])
    os.kill(pid, signal.SIGKILL)
    before = run.status()["update_step"]
    while run.status()["update_step"] < before + 3 and time.time() < deadline + 300:
        assert run.status()["state"] == "running", run.status()["error"]
        time.sleep(0.3)
    versions = run.batch().to_local(["versions"])["versions"]
    run.stop()
    events = run.events()
    assert (events["kind"] == "recovery").any()
    assert versions.min() >= before  # the restarted worker's policy copy was synced, not left at -1


@pytest.mark.usefixtures("attached")
def test_a_killed_env_worker_of_an_async_sac_run_is_restarted_and_collection_goes_on():
    """Off-policy collection runs while the learner updates: SIGKILL one of two env workers mid-run."""
    run = _launch(_small_sac(total_env_steps=10**7, env_workers=2), "sac_kill")
    deadline = time.time() + 300
    while run.status()["update_step"] < 10 and time.time() < deadline:
        time.sleep(0.3)
    pid = next(h["pid"] for h in run.health()["groups"]["env"] if h["alive"])
    os.kill(pid, signal.SIGKILL)
    before = run.status()
    while run.status()["update_step"] < before["update_step"] + 20 and time.time() < deadline + 300:
        assert run.status()["state"] == "running", run.status()["error"]
        time.sleep(0.3)
    after, health = run.status(), run.health()["groups"]["env"]
    events, df = run.events(), run.metrics()
    run.stop()
    recovery = events[events["kind"] == "recovery"]
    assert (
        len(recovery) >= 1
        and recovery.iloc[0]["group"] == "env"
        and "restarted" in recovery.iloc[0]["action"]
    )
    assert len(health) == 2 and all(h["alive"] for h in health) and pid not in {h["pid"] for h in health}
    assert after["env_steps"] > before["env_steps"] + 256
    assert (df["step"].diff().dropna() == 1).all()  # no gap in the update steps


@pytest.mark.usefixtures("attached")
def test_a_restarted_rollout_worker_gets_the_synced_weights_before_it_acts_again():
    """Direct mode: SIGKILL the rollout worker between iterations; Ray restarts it with its initial
    weights, and the controller sends the synced ones again before the next rollout (recorded)."""
    import rlinf_nb as rl

    cfg = small_ppo("direct", budget={"total_env_steps": 10**7, "stop_metric": None, "stop_value": None})
    run = rl.launch(cfg, name=f"roll_kill_{uuid.uuid4().hex[:6]}", paused=True)
    for _ in range(4):  # one whole iteration, stage by stage: its weights are synced as version 1
        run.step()
    assert run.status()["stage"] == "rollout" and run.status()["update_step"] == 1
    (worker,) = run.health()["groups"]["rollout"]
    os.kill(worker["pid"], signal.SIGKILL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        h["alive"] and h["pid"] != worker["pid"] for h in run.health()["groups"]["rollout"]
    ):
        time.sleep(0.3)
    run.step("rollout")
    status = run.status()
    assert status["state"] in ("paused", "stepping"), status.get("error")  # not failed: a new batch
    versions = run.batch().to_local(["versions"])["versions"]
    events = run.events()
    run.stop()
    assert (versions == 1).all(), np.unique(versions)  # not one action from the restarted initial weights
    recoveries = events[(events["kind"] == "recovery") & (events["group"] == "rollout")]
    resent = recoveries[recoveries["action"] == "weights_resent"]
    assert len(resent) == 1 and resent.iloc[0]["version"] == 1


@pytest.mark.usefixtures("attached")  # without it, run alone, rl.launch starts a cluster nothing stops
@pytest.mark.parametrize("mode,prefetch", [("direct", 0), ("channel", 0), ("direct", 2), ("channel", 2)])
def test_a_rollout_worker_killed_mid_rollout_is_restarted_and_the_rollout_repeated(mode, prefetch):
    """SIGKILL the rollout worker while env workers wait for its actions. In direct mode the env workers
    report the lost peer, in channel mode the rollout worker's own call fails. The controller waits for
    Ray's restart, resets the envs, sends the synced weights again and repeats the rollout: the run goes
    on, every action from synced weights. With ``prefetch`` (chunks of 4 asked for 2 steps early) the env
    workers have a request in flight when it dies."""
    import rlinf_nb as rl

    chunk = 4 if prefetch else 1
    steps = 2000 * chunk  # one call per decision: seconds of rollout, so the kill lands inside it
    policy = {"name": "mlp", "kwargs": {"hidden_sizes": [16]}, "chunk": chunk, "chunk_prefetch": prefetch}
    cfg = small_ppo(mode, algo={"rollout_steps": steps, "epochs": 1, "minibatch_size": steps * N},
                    budget={"total_env_steps": 10**7, "stop_metric": None, "stop_value": None},
                    policy=policy)  # fmt: skip
    run = rl.launch(cfg, name=f"roll_midkill_{uuid.uuid4().hex[:6]}", paused=True)
    (worker,) = run.health()["groups"]["rollout"]
    stepped: dict = {}
    stepper = threading.Thread(target=lambda: stepped.update(run.step("rollout")))
    stepper.start()
    deadline = time.time() + 60
    while run.status()["state"] != "stepping" and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(worker["pid"], signal.SIGKILL)
    stepper.join(timeout=300)
    status = run.status()
    events = run.events()
    alive = status["state"] in ("paused", "stepping")
    versions = run.batch().to_local(["versions"])["versions"] if alive else None
    run.stop()
    assert alive, status.get("error")
    assert stepped.get("stage") == "rollout" and status["env_steps"] == steps * N  # the repeated rollout only
    assert versions.shape == (steps // chunk, N) and (versions == 0).all(), np.unique(
        versions
    )  # synced at setup
    recoveries = events[(events["kind"] == "recovery") & (events["group"] == "rollout")]
    assert list(recoveries["action"]) == ["restarted", "weights_resent"], recoveries


def test_colocated_refuses_obs_compression():
    cfg = {"placement": {"env_to_rollout": "colocated"}, "compression": {"obs": {"enabled": True}}}
    with pytest.raises(ConfigError, match=r"compression\.obs\.enabled: got True; observations never leave"):
        build(RunConfig, cfg)


# ----------------------------------------------------------------------------- algo.random_steps


def test_random_requests_get_uniform_actions_from_the_servers_own_generator():
    env = gym.make("Pendulum-v1")
    policy_cfg = {"name": "mlp", "kwargs": {"hidden_sizes": [8], "action_head": "squashed_gaussian"},
                  "inference": "torch"}  # fmt: skip
    a = PolicyServer(policy_cfg, env.observation_space, env.action_space, 11)
    obs = np.zeros((64, 3), np.float32)
    reply = a.answer([{**_msg(obs), "acting": "random"}])[0]
    expected = np.random.default_rng(11).uniform(-2.0, 2.0, size=(64, 1)).astype(np.float32)
    np.testing.assert_array_equal(reply["actions"], expected)  # not the policy's: the generator's draws
    assert (reply["logprobs"] == 0).all() and reply["values"].shape == (64,)
    policy_actions = a.answer([_msg(obs)])[0]["actions"]
    assert np.abs(policy_actions).max() < 2.0 and not np.array_equal(policy_actions, expected)


def test_random_actions_on_a_discrete_and_an_unbounded_space():
    env = gym.make("CartPole-v1")
    server = PolicyServer({"name": "mlp", "kwargs": {"hidden_sizes": [8]}}, env.observation_space,
                          env.action_space, 0)  # fmt: skip
    actions = server.uniform_actions(400)
    assert set(np.unique(actions)) == {0, 1}
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    server = PolicyServer(
        {"name": "mlp", "kwargs": {"hidden_sizes": [8]}}, env.observation_space, unbounded, 0
    )
    with pytest.raises(ValueError, match=r"algo\.random_steps: the action space .* is unbounded"):
        server.uniform_actions(1)


@pytest.mark.usefixtures("attached")
@pytest.mark.parametrize("mode", ["colocated", "channel"])
def test_sac_on_the_cluster_starts_with_random_steps_then_the_policy(mode):
    """The first segments' actions are the inference side's uniform draws; an event marks the switch."""
    T, N, random_steps = 8, 2, 32
    cfg = {
        "algorithm": "sac", "seed": 4,
        "env": {"id": "Pendulum-v1", "num_envs": N},
        "algo": {"collect_steps": T, "learning_starts": 10_000, "random_steps": random_steps},
        "policy": {"name": "mlp", "kwargs": {"hidden_sizes": [16], "action_head": "squashed_gaussian"}},
        "placement": {"env_to_rollout": mode},
        "budget": {"total_env_steps": 3 * random_steps, "stop_metric": None, "stop_value": None},
        "checkpoint": {"every": 0}, "linger_s": 60,
    }  # fmt: skip
    import rlinf_nb as rl

    run = rl.launch(cfg, name=f"colo_random_{mode}_{uuid.uuid4().hex[:6]}", paused=True)
    assert run.status()["update_step"] == 0 and run.status()["env_steps"] == 0  # held before the first stage
    first = None
    for _ in range(12):  # step until the first collect has produced a batch
        run.step()
        b = run.batch().to_local()
        if "actions" in b and b["actions"].size:
            first = b
            break
    assert first is not None, "no collected batch"
    # the inference side's generator (seed + 7919 * (rank + 1)) drew exactly these actions, step by step
    rng = np.random.default_rng(4 + 7919)
    expected = np.stack([rng.uniform(-2.0, 2.0, size=(N, 1)).astype(np.float32) for _ in range(T)])
    np.testing.assert_array_equal(first["actions"], expected)
    run.resume()
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st.get("error")
    events = run.events()
    done = events[events["kind"] == "random_steps_done"]
    assert len(done) == 1 and int(done.iloc[0]["env_steps"]) >= random_steps
