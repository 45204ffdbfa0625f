"""Runs on the real local cluster: learning, persistence, fault recovery, step mode, live tuning."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import time
import uuid

import numpy as np
import pytest
import torch

import rlinf_nb as rl
from rlinf_nb.algorithms import functional as F
from rlinf_nb.config import ConfigError
from tests.helpers import learner_recovery, run_py, sigkill_worker, wait_while_running

pytestmark = pytest.mark.usefixtures("attached")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def wait_for_step(run, step: int, timeout: float = 300) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = run.status()
        if st["update_step"] >= step:
            return st
        if st["state"] in ("failed", "finished", "stopped"):
            raise AssertionError(f"run ended early: {st['state']}\n{st['error']}")
        time.sleep(0.3)
    raise AssertionError(f"step {step} not reached in {timeout} s: {run.status()}")


def step_until(run, stage: str) -> None:
    """Step single stages until ``stage`` is the next one to run."""
    for _ in range(8):
        if run.status()["stage"] == stage:
            return
        run.step()
    raise AssertionError(f"never reached stage {stage!r}")


def assert_consecutive_steps(df) -> None:
    steps = df["step"].tolist()
    assert steps == list(range(1, len(steps) + 1)), steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_cartpole_solves(seed):
    run = rl.launch("ppo_cartpole", name=unique(f"solve{seed}"), seed=seed)
    status = run.wait(timeout=900, progress=False)
    assert status["state"] == "finished", status["error"]
    df = run.metrics()
    assert df["episode_return_mean"].iloc[-1] >= 475, df.tail()
    assert df["env_steps"].iloc[-1] <= 100_000  # within the recipe's default budget
    assert_consecutive_steps(df)
    assert {"step", "env_steps", "wall_time", "episode_return_mean"} <= set(df.columns)
    assert df["env_steps"].is_monotonic_increasing and df["wall_time"].is_monotonic_increasing


def test_run_survives_its_launching_client():
    name = unique("orphan")
    code = textwrap.dedent(
        f"""
        import os, rlinf_nb as rl
        rl.attach(start=False, quiet=True)
        run = rl.launch("ppo_cartpole", name={name!r}, budget__total_env_steps=10**7, budget__stop_metric=None,
                        budget__stop_value=None)
        print("LAUNCHED", flush=True)
        os._exit(0)  # the kernel dies abruptly
        """
    )
    proc = run_py(code, timeout=300)
    assert "LAUNCHED" in proc.stdout, proc.stderr
    run = rl.get_run(name)
    first = run.status()["update_step"]
    wait_for_step(run, first + 3)
    df = run.metrics()
    assert_consecutive_steps(df)
    assert len(run.run_dir.metrics.read()) >= first + 3  # the log on disk has the history too
    run.stop()
    assert run.status()["state"] == "stopped"


def test_killed_env_worker_is_restarted_and_recorded():
    run = rl.launch("ppo_cartpole", name=unique("envkill"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None)  # fmt: skip
    wait_for_step(run, 2)
    pid = next(h["pid"] for h in run.health()["groups"]["env"] if h["alive"])
    os.kill(pid, signal.SIGKILL)
    before = run.status()["update_step"]
    wait_for_step(run, before + 3, timeout=300)
    events = run.events()
    recovery = events[events["kind"] == "recovery"]
    assert len(recovery) >= 1 and recovery.iloc[0]["group"] == "env"
    assert "restarted" in recovery.iloc[0]["action"]
    assert_consecutive_steps(run.metrics())
    run.stop()


def test_workers_in_the_middle_of_a_long_call_answer_health_pings():
    """A long call holds a worker's main thread: a rollout segment (env workers, and the rollout workers'
    ``serve`` in channel mode) or an update (the learner). Pings are answered beside it, on the worker's
    ``control`` thread, so ``run.health()`` (the cluster view) does not report a busy worker as dead."""
    run = rl.launch(
        "ppo_cartpole",
        name=unique("busyping"),
        algo__rollout_steps=2048,
        budget__total_env_steps=10**7,
        budget__stop_metric=None,
        budget__stop_value=None,
        placement__env_to_rollout="channel",
        placement__learner="worker",
    )  # a rollout worker per step round and 640 gradient steps per update: long stages, so polls land in them
    busy_groups = {"rollout": ("env", "rollout"), "update": ("actor",)}
    try:
        wait_for_step(run, 1)
        polls: dict[str, list[dict[str, list[bool]]]] = {stage: [] for stage in busy_groups}
        deadline = time.time() + 180
        while min(len(p) for p in polls.values()) < 3 and time.time() < deadline:
            stage = run.status()["stage"]
            if stage in busy_groups:
                groups = run.health()["groups"]
                polls[stage].append({g: [h["alive"] for h in groups[g]] for g in busy_groups[stage]})
            time.sleep(0.1)
        assert min(len(p) for p in polls.values()) >= 3, polls
        assert all(all(all(alive) for alive in poll.values()) for p in polls.values() for poll in p), polls
    finally:
        run.stop()


def wait_for_learner_recovery(run, steps_after: int = 4) -> tuple[dict, object]:
    """Wait until the run restored its learner and ran ``steps_after`` steps past the checkpoint it went back to."""

    def restored_and_past(st):
        rec = learner_recovery(run)
        return (
            (st, rec)
            if rec is not None and st["update_step"] >= int(rec["from_step"]) + steps_after
            else None
        )

    return wait_while_running(run, restored_and_past, 300, "a learner recovery")


def learner_pid(run) -> int | None:
    return next((h["pid"] for h in run.health()["groups"]["actor"] if h["alive"]), None)


@pytest.mark.parametrize("when", ["running", "paused"])
def test_killed_learner_worker_is_restored_from_the_last_checkpoint(when):
    """The learner (its own actor, ``placement.learner: worker``) is SIGKILLed: Ray restarts it, the run loads
    the newest complete checkpoint into it and goes back to that step. ``running``: a learner call fails.
    ``paused``: Ray has restarted the learner before the next call, which succeeds on a learner at its
    initial state; its weights version gives it away. Either way the weights version matches ``step`` on
    every row afterwards (a learner left at its initial state would count from 1 again) and ``step`` has
    no gap."""
    run = rl.launch("ppo_cartpole", name=unique(f"learnerkill_{when}"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None, checkpoint__every=2,
                    placement__learner="worker")  # fmt: skip
    wait_for_step(run, 5)
    if when == "paused":
        run.pause()
        deadline = time.time() + 120
        while run.status()["state"] != "paused" and time.time() < deadline:
            time.sleep(0.2)
    pid = sigkill_worker(run, "actor")
    if when == "paused":  # Ray restarts it with its initial state; nothing calls it meanwhile
        deadline = time.time() + 120
        while learner_pid(run) in (None, pid) and time.time() < deadline:
            time.sleep(0.5)
        assert learner_pid(run) not in (None, pid)
        run.resume()
    st, rec = wait_for_learner_recovery(run)
    assert rec["action"] == "restored" and int(rec["from_step"]) >= 4 and int(rec["from_step"]) % 2 == 0
    assert int(rec["weights_version"]) == int(rec["from_step"])
    if when == "paused":
        # update (version 1) or get_weights/state_dict (version 0), whichever stage came next
        assert re.search(r"answered with weights version [01], not \d+", rec["detail"]), rec["detail"]
    df = run.metrics()
    assert_consecutive_steps(df)
    assert (df["policy_version"] == df["step"]).all(), df[["step", "policy_version"]]
    # on-policy: every rollout acted with the weights the update started from, the restored ones included
    assert (df["policy_staleness"] == 0).all(), df[["step", "policy_staleness"]]
    assert sum(w["env_steps"] for w in st["env_workers"]) == st["env_steps"]
    run.stop()


def test_a_learner_lost_before_the_end_checkpoint_is_restored_and_the_run_stops_cleanly():
    """Paused, the learner is SIGKILLed and restarted by Ray; ``stop()`` then goes straight to the end
    checkpoint, whose ``state_dict`` finds the learner at its initial state. The run restores it from the
    newest checkpoint and writes the end checkpoint from that state, instead of failing."""
    run = rl.launch("ppo_cartpole", name=unique("learnerend"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None, checkpoint__every=2,
                    placement__learner="worker")  # fmt: skip
    wait_for_step(run, 3)
    run.pause()
    deadline = time.time() + 120
    while run.status()["state"] != "paused" and time.time() < deadline:
        time.sleep(0.2)
    pid = sigkill_worker(run, "actor")
    while learner_pid(run) in (None, pid) and time.time() < deadline:
        time.sleep(0.5)
    st = run.stop(timeout=300)
    assert st["state"] == "stopped", st.get("error")
    rec = learner_recovery(run)
    assert rec is not None and rec["action"] == "restored", run.events().tail()
    assert "state_dict answered with weights version 0" in rec["detail"], rec["detail"]
    events = run.events()
    end = events[(events["kind"] == "checkpoint") & (events["reason"] == "end")]
    # written once, from the restored state: the checkpoint's step, not the one the learner was lost at
    assert end["path"].tolist() == [f"ckpt-{int(rec['from_step']):08d}"], events.tail()
    assert_consecutive_steps(run.metrics())


def test_a_lost_learner_without_a_checkpoint_fails_the_run_with_the_reason():
    run = rl.launch("ppo_cartpole", name=unique("learnernockpt"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None, checkpoint__every=0,
                    placement__learner="worker")  # fmt: skip
    wait_for_step(run, 2)
    sigkill_worker(run, "actor")
    st = run.wait(timeout=300, progress=False)
    assert st["state"] == "failed"
    assert "no complete checkpoint to restore it from (checkpoint.every: 0)" in st["error"], st["error"]


def test_killed_controller_resumes_from_last_complete_checkpoint():
    name = unique("ctlkill")
    run = rl.launch("ppo_cartpole", name=name, budget__total_env_steps=10**7, budget__stop_metric=None,
                    budget__stop_value=None, checkpoint__every=2)  # fmt: skip
    wait_for_step(run, 5)
    os.kill(run.status()["pid"], signal.SIGKILL)
    time.sleep(2)
    ckpt = run.run_dir.latest_checkpoint()
    assert ckpt is not None and ckpt.step >= 4
    lost = rl.get_run(name).status()  # the controller is gone: its last written status, marked lost
    assert lost["state"] == "lost" and lost["live"] is False, lost
    # its timeline as of its newest checkpoint (written after each one) is in the run directory
    trace = json.loads(rl.get_run(name).trace().read_text())
    rows = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    spans = [(rows[e["pid"]].split(" ")[0], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans.count(("controller", "update")) >= ckpt.step - 2  # killed between a checkpoint and its trace
    assert spans.count(("env", "rollout_colocated")) >= ckpt.step - 2, sorted(set(spans))
    resumed = rl.launch(None, name=name, resume=True)
    st = wait_for_step(resumed, ckpt.step + 2)
    assert st["update_step"] >= ckpt.step + 2
    assert sum(w["env_steps"] for w in st["env_workers"]) == st["env_steps"]  # per-worker counts resumed too
    events = resumed.events()
    resume_rows = events[events["kind"] == "resume"]
    assert len(resume_rows) == 1 and int(resume_rows.iloc[0]["from_step"]) == ckpt.step
    df = resumed.metrics()
    assert_consecutive_steps(df)  # rows re-run after the checkpoint replace the lost ones: no gap, no dupes
    resumed.stop()


def test_step_mode_inspect_override_and_revert():
    run = rl.launch("ppo_cartpole", name=unique("step"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None)  # fmt: skip
    run.pause()
    deadline = time.time() + 120
    while run.status()["state"] != "paused" and time.time() < deadline:
        time.sleep(0.2)
    assert run.status()["state"] == "paused"

    # Step one PPO iteration, stage by stage.
    stages = run.status()["stages"]
    assert stages == ["rollout", "advantages", "update", "sync_weights"]
    summaries = {}
    step_until(run, "rollout")
    paused_at = run.status()["update_step"]
    for stage in stages:
        summaries[stage] = run.step()
        assert summaries[stage]["stage"] == stage
    assert run.status()["update_step"] == paused_at + 1
    assert summaries["sync_weights"]["weights_version"] == paused_at + 1

    # Inspect the batch after rollout + advantages, and check GAE against a local recompute.
    run.step("rollout")
    run.step("advantages")
    view = run.batch()
    assert {"obs", "actions", "rewards", "advantages", "returns"} <= set(view.keys())
    b = view.to_local()
    T, N = b["rewards"].shape
    assert b["obs"].shape == (T, N, 4)
    hp = run.hparams
    adv, _ = F.gae(*(torch.as_tensor(b[k]) for k in ("rewards", "values", "dones", "truncated", "last_values",
                                                     "bootstrap_values")),
                   gamma=hp["algo.gamma"]["value"], lam=hp["algo.gae_lambda"]["value"])  # fmt: skip
    np.testing.assert_allclose(b["advantages"], adv.numpy(), rtol=1e-5, atol=1e-5)

    # Replace the advantage stage with a function defined here (shipped with cloudpickle).
    def constant_advantages(ctx):
        ctx.batch["advantages"] = np.full_like(ctx.batch["rewards"], 0.5)
        ctx.batch["returns"] = ctx.batch["values"] + 0.5
        return {"custom": True}

    run.override("advantages", constant_advantages)
    step_until(run, "advantages")
    summary = run.step("advantages")
    assert summary.get("custom") is True
    assert np.all(run.batch().to_local(["advantages"])["advantages"] == 0.5)
    assert "advantages" in run.status()["overrides"]
    assert run.revert("advantages")
    step_until(run, "advantages")
    summary = run.step("advantages")
    assert "custom" not in summary
    assert not np.all(run.batch().to_local(["advantages"])["advantages"] == 0.5)

    # A rollout that takes the policy's most likely action (what BC's evaluate stage does): each logprob
    # is then the larger of CartPole's two, never below log(1/2); sampled rollouts pick the other one too.
    def greedy_rollout(ctx):
        return ctx.collect_rollout(ctx.hp.rollout_steps, acting="mode")

    run.override("rollout", greedy_rollout)
    step_until(run, "rollout")
    run.step("rollout")
    greedy = run.batch().to_local(["logprobs"])["logprobs"]
    assert (greedy >= np.log(0.5) - 1e-6).all()
    assert run.revert("rollout")
    step_until(run, "rollout")
    run.step("rollout")
    assert (run.batch().to_local(["logprobs"])["logprobs"] < np.log(0.5) - 1e-3).any()

    kinds = run.events()["kind"].tolist()
    assert "override" in kinds and "revert" in kinds and "pause" in kinds
    run.resume()
    wait_for_step(run, run.status()["update_step"] + 1)
    run.stop()


def test_set_hparams_is_validated_applied_and_logged():
    run = rl.launch("ppo_cartpole", name=unique("hp"), budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None)  # fmt: skip
    wait_for_step(run, 1)
    resolved = run.set_hparams(lr=3e-4, ent_coef=0.01)
    assert resolved == {"algo.lr": 3e-4, "algo.ent_coef": 0.01}
    with pytest.raises(ConfigError, match="not a live hyperparameter") as exc:
        run.set_hparams(rollout_steps=64)
    assert exc.value.key_path == "algo.rollout_steps"
    with pytest.raises(ConfigError, match="allowed range") as exc:
        run.set_hparams(lr=5.0)
    assert exc.value.key_path == "algo.lr" and exc.value.value == 5.0
    step = run.status()["update_step"]
    wait_for_step(run, step + 2)
    events = run.events()
    hp_events = events[events["kind"] == "hparams"]
    assert len(hp_events) == 1
    assert hp_events.iloc[0]["changes"]["algo.lr"] == {"old": 4e-3, "new": 3e-4}
    df = run.metrics()
    assert df["hp/algo.lr"].iloc[-1] == 3e-4 and df["hp/algo.lr"].iloc[0] == 4e-3
    assert run.hparams["algo.ent_coef"]["value"] == 0.01
    run.stop()


def test_bad_override_key_fails_before_launch():
    with pytest.raises(ConfigError) as exc:
        rl.launch("ppo_cartpole", name=unique("bad"), algo__clip=0.1)
    assert exc.value.key_path == "algo.clip" and "clip_eps" in str(exc.value)


def test_unsatisfiable_placement_fails_fast_naming_group_and_resource():
    t0 = time.time()
    with pytest.raises(RuntimeError) as exc:
        rl.launch("ppo_cartpole", name=unique("noplace"), placement__env__resources={"robot:nope": 1})
    msg = str(exc.value)
    assert "'env'" in msg and "robot:nope" in msg and "no node provides it" in msg
    assert time.time() - t0 < 60


def test_list_and_get_runs():
    names = [r["name"] for r in rl.list_runs()]
    assert names, "earlier tests launched runs"
    with pytest.raises(ValueError, match="no run named"):
        rl.get_run("does_not_exist")


def test_finished_controller_frees_itself_after_linger_and_history_stays():
    name = unique("linger")
    run = rl.launch("ppo_cartpole", name=name, budget__total_env_steps=512, linger_s=3)
    assert run.wait(timeout=300, progress=False)["state"] == "finished"
    live_rows = run.metrics()
    deadline = time.time() + 60
    while rl.get_run(name).live and time.time() < deadline:
        time.sleep(0.5)
    again = rl.get_run(name)
    assert not again.live, "the finished run's controller did not exit after linger_s"
    st = again.status()
    assert st["state"] == "finished" and st["live"] is False and st["env_steps"] >= 512, st
    assert again.metrics()["step"].tolist() == live_rows["step"].tolist()
    assert "finished" in again.events()["kind"].tolist()
    rows, cursor = again.metrics_since(1)
    assert cursor == len(live_rows) and len(rows) == len(live_rows) - 1
    assert again.stop()["state"] == "finished"  # stopping an ended run just reports it
    with pytest.raises(RuntimeError, match="no live controller"):
        again.pause()


def test_stop_metric_waits_for_a_full_window_of_episodes():
    """A stop threshold met by the first few episodes does not end the run before metrics_window episodes."""
    always = {"budget__stop_metric": "episode_return_mean", "budget__stop_value": 0.0}  # any return meets it
    full = rl.launch("ppo_cartpole", name=unique("stopwin"), metrics_window=60, **always)
    full.wait(timeout=300)
    m = full.metrics()
    assert full.status()["state"] == "finished"
    assert len(m) > 1 and m["episodes"].iloc[-1] >= 60 > m["episodes"].iloc[-2]
    eager = rl.launch("ppo_cartpole", name=unique("stopnow"), budget__stop_min_episodes=0, **always)
    eager.wait(timeout=300)
    assert len(eager.metrics()) == 1  # the first row meets the threshold
