"""Robots as cluster resources: each env worker claims one named robot, exactly one holds it.

The config checks and the claim rules run without a cluster. The cluster tests start one
three-node cluster here (a ``train`` node and two robot nodes, ``robot:arm0`` and
``robot:arm1``) and drive it from one fresh interpreter: two mock arms on two Ray nodes train
one PPO policy while a second claim of ``arm0`` and a claim of the unknown ``arm9`` fail, and
once that run is stopped a new run takes ``arm0``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from rlinf_nb.robots.spec import SPECS_DIR
from rlinf_nb.runtime.cluster_spec import ClusterSpec
from rlinf_nb.runtime.robot_claims import RobotClaimsImpl, env_id_for, rank_resources, robot_of
from rlinf_nb.runtime.worker import GroupPlacement

from rlinf_nb.client import resolve_config
from rlinf_nb.config import ConfigError, build
from tests.helpers import run_cli, run_py

# ---------------------------------------------------------------------------- without a cluster


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env_workers": 2, "placement__env__robots": ["arm0", "arm0"]},
         r"placement\.env\.robots: got \['arm0', 'arm0'\]; 'arm0' listed more than once"),
        ({"env_workers": 1, "placement__env__robots": ["arm0", "arm1"]},
         r"placement\.env\.robots: got \['arm0', 'arm1'\]; one robot per env worker: 2 robots for "
         r"placement\.env\.num_workers=1; allowed: a list of 1 distinct names"),
        ({"placement__env__robots": ["arm 0"]}, r"placement\.env\.robots: got \['arm 0'\]; robot names"),
        ({"env_id": "robot:/specs/{robot}.yaml/reach"},
         r"env\.id: got '.*\{robot\}.*'; '\{robot\}' is replaced by each env worker's robot: set placement\.env\.robots"),
    ],
)  # fmt: skip
def test_bad_robot_claims_name_the_key_the_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config("ppo_cartpole", **overrides)


def test_env_workers_get_one_robot_each_as_a_ray_resource():
    cfg = resolve_config("ppo_cartpole", env_workers=2, placement__env__robots=["arm0", "arm1"])
    assert cfg.placement.env.robots == ["arm0", "arm1"]
    assert rank_resources(cfg.placement.env.robots) == [{"robot:arm0": 1.0}, {"robot:arm1": 1.0}]
    place = GroupPlacement(2, 0.25, 0.0, "robots", {"slot": 1.0}, rank_resources(["arm0", "arm1"]))
    assert place.actor_resources(1) == {"slot": 1.0, "robot:arm1": 1.0, "node_group:robots": 0.001}
    assert place.actor_resources() == {"slot": 1.0, "node_group:robots": 0.001}  # what every worker asks
    with pytest.raises(ValueError, match="rank_resources has 1 entries for 2 workers"):
        GroupPlacement(2, rank_resources=[{"robot:arm0": 1.0}])
    assert [robot_of(["arm0", "arm1"], r) for r in (0, 1)] == ["arm0", "arm1"]
    assert robot_of([], 0) is None
    assert env_id_for("robot:/s/{robot}.yaml/reach", "arm1") == "robot:/s/arm1.yaml/reach"
    assert env_id_for("robot:mock_arm/reach", None) == "robot:mock_arm/reach"


def test_a_claim_is_all_or_nothing_and_stale_holders_can_be_evicted():
    reg = RobotClaimsImpl()
    assert reg.claim("a", ["arm0", "arm1"]) == {"ok": True}
    refused = reg.claim("b", ["arm2", "arm1"])
    assert (
        not refused["ok"] and refused["held"]["arm1"]["run"] == "a" and refused["held"]["arm1"]["rank"] == 1
    )
    assert "arm2" not in reg.holders()  # nothing of a refused claim is kept
    assert reg.claim("a", ["arm1"])["ok"]  # the same run (a resumed one) claims again: only its new list
    assert {r: (h["run"], h["rank"]) for r, h in reg.holders().items()} == {"arm1": ("a", 0)}
    assert reg.claim("b", ["arm1"], evict=["a"]) == {
        "ok": True
    }  # a's controller is gone: its claims are stale
    assert {r: h["run"] for r, h in reg.holders().items()} == {"arm1": "b"}
    assert reg.release("b") == ["arm1"] and reg.holders() == {}


# ---------------------------------------------------------------------------- on a three-node cluster

CLUSTER_YAML = """\
object_store_memory: 256MiB
node_groups:
  - label: train
    num_cpus: 1
  - label: robot0
    num_cpus: 1
    robots: [arm0]
  - label: robot1
    num_cpus: 1
    robots: [arm1]
"""

DRIVER = """
import json, subprocess, sys, time
import ray, rlinf_nb as rl

rl.attach(start=False, quiet=True)
SPECS = {specs!r}

def config(robots, total, env_id="robot:mock_arm/reach", **env_kwargs):
    return {{
        "algorithm": "ppo",
        "env": {{"id": env_id, "num_envs": 1, "kwargs": {{"max_steps": 16, **env_kwargs}}}},
        "policy": {{"name": "mlp", "kwargs": {{"hidden_sizes": [16, 16]}}}},
        "algo": {{"rollout_steps": 16, "epochs": 1, "minibatch_size": 16}},
        "placement": {{"env": {{"num_workers": len(robots), "robots": robots}},
                       "rollout": {{"node_group": "train"}}, "actor": {{"node_group": "train"}}}},
        "budget": {{"total_env_steps": total, "stop_metric": None, "stop_value": None}},
        "checkpoint": {{"every": 0}},
        "linger_s": 30,
    }}

def refused(robots, name, **overrides):
    try:
        rl.launch(config(robots, 64), name=name, **overrides)
    except RuntimeError as exc:
        return str(exc)
    return None

out = {{"robot_nodes": {{k[len("robot:"):]: n["NodeID"] for n in ray.nodes() for k in n["Resources"]
                        if k.startswith("robot:")}}}}
first = rl.launch(config(["arm0", "arm1"], 10**7, env_id="robot:" + SPECS + "/{{robot}}.yaml/reach"), name="two_arms")
deadline = time.time() + 300
while time.time() < deadline:
    st = first.status()
    if st["update_step"] >= 3 and all(w["episodes"] > 0 for w in st["env_workers"]):
        break
    time.sleep(0.5)
out["placement"] = first._call("placement")
out["while"] = {{"status": first.status(), "robots": rl.cluster_info()["robots"]}}
out["cli_status"] = subprocess.run([sys.executable, "-m", "rlinf_nb.cli", "cluster", "status"],
                                   capture_output=True, text=True, timeout=120).stdout
t0 = time.time()
out["second_arm0"] = refused(["arm0"], "second_arm0")
out["second_arm0_s"] = time.time() - t0
out["unknown_arm9"] = refused(["arm9"], "unknown_arm9")
out["wrong_group"] = refused(["arm1"], "wrong_group", placement__env__node_group="train")
out["first_alive_after_refusals"] = first.status()["state"]
final = first.stop()
out["first_final"] = final
out["robots_after_stop"] = rl.cluster_info()["robots"]
try:  # claims arm0, then its env worker fails to build its env: the run fails and lets go of arm0
    rl.launch(config(["arm0"], 64, bogus_option=1), name="failing_arm0")
    out["failing"] = None
except RuntimeError as exc:
    out["failing"] = str(exc)
after = rl.launch(config(["arm0"], 64), name="after_arm0")
out["after"] = after.wait(timeout=300, progress=False)
out["after_placement"] = after._call("placement")
out["robots_after_finish"] = rl.cluster_info()["robots"]
print("RESULT" + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def two_robot_session():
    """Start the three-node cluster, run the whole scenario in one fresh interpreter, stop the cluster."""
    home = Path(tempfile.mkdtemp(prefix="rnbrb-", dir="/tmp"))
    specs = home / "specs"  # one spec file per robot: env.id's {robot} picks it
    specs.mkdir()
    for robot in ("arm0", "arm1"):
        text = (SPECS_DIR / "mock_arm.yaml").read_text().replace("name: mock_arm", f"name: {robot}")
        (specs / f"{robot}.yaml").write_text(text)
    (home / "cluster.yaml").write_text(CLUSTER_YAML)
    try:
        up = run_cli("cluster", "up", "--config", str(home / "cluster.yaml"), home=home, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        proc = run_py(textwrap.dedent(DRIVER.format(specs=str(specs))), home=home, timeout=900)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
        assert line, proc.stdout[-4000:] + proc.stderr[-8000:]
        yield json.loads(line[len("RESULT") :])
    finally:
        down = run_cli("cluster", "down", home=home, timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        assert down.returncode == 0, down.stderr


def test_two_robots_on_two_ray_nodes_train_one_policy(two_robot_session):
    out = two_robot_session
    status = out["while"]["status"]
    assert status["state"] == "running" and status["update_step"] >= 3
    workers = status["env_workers"]
    assert [w["robot"] for w in workers] == ["arm0", "arm1"]
    # each env worker ran on the node that advertises its robot, so on two different Ray nodes
    assert [w["node_id"] for w in workers] == [out["robot_nodes"]["arm0"], out["robot_nodes"]["arm1"]]
    assert workers[0]["node_id"] != workers[1]["node_id"]
    assert all(w["env_steps"] > 0 and w["episodes"] > 0 for w in workers)
    assert sum(w["env_steps"] for w in workers) == status["env_steps"]
    env_ids = {p["rank"]: p["env_id"] for p in out["placement"] if p["group"] == "env"}
    assert env_ids[0].endswith("/arm0.yaml/reach") and env_ids[1].endswith("/arm1.yaml/reach")
    # the learner and the rollout worker: one each, on the train node
    others = {p["group"]: p["node_id"] for p in out["placement"] if p["group"] != "env"}
    assert set(others) == {"rollout", "actor"} and not set(others.values()) & set(out["robot_nodes"].values())


def test_the_cluster_lists_robots_and_their_holders(two_robot_session):
    out = two_robot_session
    held = {r["robot"]: r["held_by"] for r in out["while"]["robots"]}
    assert {r: (h["run"], h["rank"]) for r, h in held.items()} == {
        "arm0": ("two_arms", 0),
        "arm1": ("two_arms", 1),
    }
    assert "held by run 'two_arms', env worker 0" in out["cli_status"]
    assert "held by run 'two_arms', env worker 1" in out["cli_status"]
    assert all(r["held_by"] is None for r in out["robots_after_stop"])
    assert {r["robot"] for r in out["robots_after_stop"]} == {"arm0", "arm1"}


def test_a_second_claim_of_a_held_robot_fails_naming_the_holder(two_robot_session):
    out = two_robot_session
    msg = out["second_arm0"]
    assert msg is not None, "a second claim of arm0 started a run"
    assert "RobotClaimError" in msg
    assert "robot 'arm0' is held by run 'two_arms', env worker 0" in msg
    assert "free robots: (none)" in msg
    assert out["first_alive_after_refusals"] == "running"  # the refused claims left the holder alone


def test_a_claim_of_an_unknown_robot_fails_naming_it(two_robot_session):
    msg = two_robot_session["unknown_arm9"]
    assert msg is not None, "a claim of arm9 started a run"
    assert "no node of this cluster advertises robot:arm9" in msg
    assert "robots on this cluster: arm0, arm1" in msg


def test_a_robot_outside_the_env_groups_node_group_fails_naming_both(two_robot_session):
    msg = two_robot_session["wrong_group"]
    assert msg is not None, "arm1 was claimed for env workers placed on the train group"
    assert "placement.env.node_group: got 'train', but robot 'arm1' is on a node of group 'robot1'" in msg


def test_a_stopped_or_failed_runs_robot_can_be_claimed_by_the_next_run(two_robot_session):
    out = two_robot_session
    assert out["first_final"]["state"] == "stopped"
    assert out["failing"] is not None and "bogus_option" in out["failing"]  # it had claimed arm0, then failed
    after = out["after"]
    assert after["state"] == "finished", after.get("error")
    assert after["env_steps"] >= 64 and after["update_step"] >= 1
    assert [w["robot"] for w in after["env_workers"]] == ["arm0"]
    env = [p for p in out["after_placement"] if p["group"] == "env"]
    assert [p["node_id"] for p in env] == [out["robot_nodes"]["arm0"]]
    assert all(r["held_by"] is None for r in out["robots_after_finish"])  # a finished run released arm0


def test_a_node_group_advertises_whole_cpus():
    """`ray start` takes whole numbers: a fractional node size fails in the YAML, not in `ray start`."""
    with pytest.raises(
        ConfigError, match=r"node_groups\[1\]\.num_cpus: got 0\.5; a node advertises a whole number"
    ):
        build(
            ClusterSpec,
            {"node_groups": [{"label": "train"}, {"label": "robot0", "num_cpus": 0.5, "robots": ["arm0"]}]},
        )
