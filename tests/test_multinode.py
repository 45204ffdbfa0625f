"""A cluster YAML with two node groups starts two Ray nodes here; worker groups land by label."""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_cli, run_py

CLUSTER_YAML = """\
object_store_memory: 256MiB
node_groups:
  - label: train
    num_cpus: 1
  - label: sim
    num_cpus: 1
    resources: {sim_slot: 4}
"""


@pytest.fixture
def two_node_home():
    home = Path(tempfile.mkdtemp(prefix="rnbmn-", dir="/tmp"))
    (home / "cluster.yaml").write_text(CLUSTER_YAML)
    up = run_cli("cluster", "up", "--config", str(home / "cluster.yaml"), home=home, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    yield home
    down = run_cli("cluster", "down", home=home, timeout=120)
    assert down.returncode == 0, down.stderr
    shutil.rmtree(home, ignore_errors=True)


def test_groups_are_placed_by_node_group_label(two_node_home):
    code = textwrap.dedent(
        """
        import json, ray, rlinf_nb as rl
        rl.attach(start=False, quiet=True)
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        run = rl.launch("ppo_cartpole", name="placed", budget__total_env_steps=1024, budget__stop_metric=None,
                        budget__stop_value=None, env_workers=2, placement__env__node_group="sim",
                        placement__rollout__node_group="sim", placement__actor__node_group="train",
                        placement__env__resources={"sim_slot": 1}, placement__env_to_rollout="auto",
                        placement__learner="worker")
        where = [{"group": p["group"], "rank": p["rank"], "ip": nodes[p["node_id"]]} for p in run._call("placement")]
        status = run.wait(timeout=300, progress=False)
        try:
            rl.launch("ppo_cartpole", name="nowhere", placement__learner="worker", placement__actor__node_group="gpu")
            error = None
        except RuntimeError as exc:
            error = str(exc)
        print("RESULT" + json.dumps({"where": where, "state": status["state"], "error": error,
                                     "env_to_rollout": status["env_to_rollout"]}))
        """
    )
    proc = run_py(code, home=two_node_home, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, proc.stdout + proc.stderr
    result = json.loads(line[len("RESULT") :])
    by_group: dict[str, set] = {}
    for p in result["where"]:
        by_group.setdefault(p["group"], set()).add(p["ip"])
    assert by_group == {"env": {"127.0.0.3"}, "rollout": {"127.0.0.3"}, "actor": {"127.0.0.2"}}
    assert len([p for p in result["where"] if p["group"] == "env"]) == 2
    assert result["state"] == "finished"
    assert result["env_to_rollout"] == "channel"  # auto: env and rollout workers can only share the sim node
    assert "'actor'" in result["error"] and "node_group:gpu" in result["error"]
