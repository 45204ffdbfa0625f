"""The run timeline (``run.trace()``): span logs, the Trace Event Format, and real runs on the cluster."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from rlinf_nb.runtime.trace import SpanLog, chrome_trace

# ------------------------------------------------------------------ pure parts


def test_a_span_log_keeps_the_newest_spans_and_marks_a_raising_block():
    log = SpanLog(maxlen=3)
    for i in range(5):
        log.record(f"call{i}", start_ns=1000 * i, dur_ns=10, iteration=i)
    assert [s["name"] for s in log.since()] == ["call2", "call3", "call4"]
    assert [s["name"] for s in log.since(3000)] == ["call3", "call4"]
    with pytest.raises(ValueError), log.span("bad", stage="x"):
        raise ValueError("boom")
    bad = log.since()[-1]
    assert bad["name"] == "bad" and bad["ok"] is False and bad["stage"] == "x" and bad["dur_ns"] >= 0


def test_chrome_trace_names_each_process_and_converts_to_microseconds():
    trace = chrome_trace([("controller r", [{"name": "update", "start_ns": 2_000_000, "dur_ns": 500_000, "ok": True,
                                             "iteration": 3}]),
                          ("env 0", [{"name": "rollout", "start_ns": 1_000, "dur_ns": 3_000, "ok": False}])])  # fmt: skip
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "controller r", 2: "env 0"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans[0] == {"name": "update", "cat": "controller", "ph": "X", "pid": 1, "tid": 0, "ts": 2000.0,
                        "dur": 500.0, "args": {"ok": True, "iteration": 3}}  # fmt: skip
    assert spans[1]["ts"] == 1.0 and spans[1]["dur"] == 3.0 and spans[1]["cname"] == "terrible"
    json.dumps(trace)  # what a trace viewer loads


def _figure_spans(fig) -> list[tuple[str, str, float, float, str]]:
    """(name, row, start s, duration s, outline colour) of every bar of a timeline figure."""
    out = []
    for bar in fig.data:
        for row, base, width, line in zip(bar.y, bar.base, bar.x, bar.marker.line.color, strict=True):
            out.append((bar.name, row, round(base, 6), round(width, 6), line))
    return sorted(out, key=lambda t: t[2])


def test_the_timeline_figure_draws_a_row_per_process_and_a_bar_per_span_in_its_window():
    from rlinf_nb.widgets.timeline_view import timeline_figure

    s = 1_000_000_000  # ns
    trace = chrome_trace([
        ("controller r", [{"name": "rollout", "start_ns": 0, "dur_ns": s, "ok": True},
                          {"name": "update", "start_ns": 9 * s, "dur_ns": s, "ok": True}]),
        ("env 0", [{"name": "rollout_colocated", "start_ns": s // 10, "dur_ns": s // 2, "ok": True}]),
        ("actor 0", [{"name": "update", "start_ns": 9 * s, "dur_ns": s // 2, "ok": False}]),
    ])  # fmt: skip
    fig = timeline_figure(trace, last_s=None)
    assert list(fig.layout.yaxis.categoryarray) == ["actor 0", "env 0", "controller r"]  # top to bottom
    assert _figure_spans(fig) == [  # x: seconds before the newest span's end (10 s)
        ("rollout", "controller r", -10.0, 1.0, "rgba(0,0,0,0)"),
        ("rollout_colocated", "env 0", -9.9, 0.5, "rgba(0,0,0,0)"),
        ("update", "controller r", -1.0, 1.0, "rgba(0,0,0,0)"),
        ("update", "actor 0", -1.0, 0.5, "#d62728"),  # failed: red outline
    ]
    recent = timeline_figure(trace, last_s=2)  # spans that end in the last 2 s
    assert [t[1] for t in _figure_spans(recent)] == ["controller r", "actor 0"]
    capped = timeline_figure(trace, last_s=None, max_bars=2)  # the newest two
    assert len(_figure_spans(capped)) == 2 and "2 of 4 spans" in capped.layout.title.text
    assert timeline_figure(chrome_trace([("controller r", [])])).layout.title.text == "no spans yet"


# ------------------------------------------------------------------ on the cluster


def _spans(trace: dict, label_prefix: str) -> list[dict]:
    pids = {e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"
            and e["args"]["name"].startswith(label_prefix)}  # fmt: skip
    return sorted(
        (e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] in pids), key=lambda e: e["ts"]
    )


def _overlap(a: dict, b: dict) -> bool:
    return a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]


@pytest.mark.usefixtures("attached")
def test_an_on_policy_run_traces_its_stages_in_order_and_never_rolls_out_while_it_updates(tmp_path):
    """PPO: the stages run one after another; the env worker's rollouts and the learner's updates never
    overlap. The run writes its timeline when it ends, and that is what a run without a controller gives."""
    import rlinf_nb as rl

    run = rl.launch("ppo_cartpole", name=f"trace_ppo_{uuid.uuid4().hex[:6]}", num_envs=4, algo__rollout_steps=32,
                    budget__total_env_steps=4 * 32 * 5, budget__stop_metric=None, budget__stop_value=None, checkpoint__every=0,
                    linger_s=0)  # fmt: skip
    st = run.wait(timeout=600, progress=False)
    assert st["state"] == "finished", st["error"]
    deadline = time.time() + 60
    while rl.get_run(run.name).live and time.time() < deadline:  # linger_s 0: it exits right after the end
        time.sleep(0.5)
    assert not rl.get_run(run.name).live
    path = run.trace(tmp_path / "ppo.json")
    trace = json.loads(path.read_text())
    assert trace == json.loads(run.path.joinpath("trace.json").read_text())
    fig = rl.timeline(run, last_s=None)  # the notebook view of the same spans
    assert {b.name for b in fig.data} >= {"setup", "rollout", "update", "sync_weights"}
    assert sum(len(b.y) for b in fig.data) == sum(1 for e in trace["traceEvents"] if e["ph"] == "X")

    stages = _spans(trace, "controller")
    assert stages[0]["name"] == "setup"
    names = [s["name"] for s in stages[1:]]
    assert names == ["rollout", "advantages", "update", "sync_weights"] * 5
    assert [s["args"]["iteration"] for s in stages[1::4]] == [0, 1, 2, 3, 4]
    for a, b in zip(stages, stages[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"] + 1.0  # one after another (1 us of rounding)

    rollouts = [s for s in _spans(trace, "env 0") if s["name"].startswith("rollout")]
    updates = [s for s in _spans(trace, "actor 0") if s["name"] == "update"]
    assert len(rollouts) == 5 and len(updates) == 5 and all(s["args"]["ok"] for s in rollouts + updates)
    assert not any(_overlap(r, u) for r in rollouts for u in updates)
    # a rollout call's span says where its time went: stepping the envs, asking the policy (colocated: its forward)
    for r in rollouts:
        env_s, policy_s = r["args"]["env_s"], r["args"]["policy_s"]
        assert r["args"]["env_steps"] == 4 * 32 and env_s > 0 and policy_s > 0
        assert env_s + policy_s <= r["dur"] / 1e6
    # ... and the metrics rows carry the same split, inside the rollout stage's time
    df = run.metrics()
    assert (df["time/rollout_env"] > 0).all() and (df["time/rollout_policy"] > 0).all()
    assert (df["time/rollout_env"] + df["time/rollout_policy"] <= df["time/rollout"]).all()
    np.testing.assert_allclose(df["time/rollout_env"], [r["args"]["env_s"] for r in rollouts], atol=1e-6)
    # each worker call sits inside the controller stage that made it
    for r, stage in zip(rollouts, [s for s in stages if s["name"] == "rollout"], strict=True):
        assert stage["ts"] <= r["ts"] and r["ts"] + r["dur"] <= stage["ts"] + stage["dur"] + 1.0


@pytest.mark.usefixtures("attached")
def test_an_async_off_policy_run_traces_collection_running_while_the_learner_updates():
    """SAC keeps a collection segment in flight while it trains: the live timeline (read from the
    workers mid-run) shows an env worker's rollout call overlapping a learner update."""
    import rlinf_nb as rl

    run = rl.launch("sac_pendulum", name=f"trace_sac_{uuid.uuid4().hex[:6]}", num_envs=4, algo__collect_steps=64,
                    algo__learning_starts=256, algo__batch_size=64, algo__utd=0.25, budget__total_env_steps=10**7,
                    budget__stop_metric=None, budget__stop_value=None, checkpoint__every=0, linger_s=30)  # fmt: skip
    try:
        deadline = time.time() + 300
        while run.status()["update_step"] < 12 and time.time() < deadline:
            assert run.status()["state"] in ("starting", "running"), run.status()["error"]
            time.sleep(0.5)
        trace = json.loads(run.trace().read_text())  # default path: the run directory's trace.json
        assert run.path.joinpath("trace.json").exists()
    finally:
        run.stop()
    stage_names = {s["name"] for s in _spans(trace, "controller")}
    assert {"setup", "collect", "update", "sync_weights"} <= stage_names
    rollouts = [s for s in _spans(trace, "env 0") if s["name"].startswith("rollout")]
    updates = [s for s in _spans(trace, "actor 0") if s["name"] == "update"]
    assert len(rollouts) >= 5 and len(updates) >= 10
    overlapping = [u for u in updates if any(_overlap(r, u) for r in rollouts)]
    assert len(overlapping) >= len(updates) // 2, (len(overlapping), len(updates))
