"""The persistent local cluster: up/status/down, attach, auth, stale state, YAML errors."""

from __future__ import annotations

import concurrent.futures
import json
import textwrap
import time

import pytest
from rlinf_nb.runtime import cluster as cluster_mod

from tests.helpers import run_cli, run_py

ATTACH_AND_WORK = textwrap.dedent(
    """
    import os, rlinf_nb as rl, ray
    rl.attach(start=False, quiet=True)
    @ray.remote
    def whoami():
        return os.getpid(), os.environ.get("RLINF_NB_CLUSTER_ID")
    print("RESULT", ray.get(whoami.remote()))
    """
)


def test_up_again_says_already_up(cluster):
    proc = run_cli("cluster", "up")
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stdout
    assert cluster_mod.read_state().cluster_id == cluster.cluster_id


def test_status_lists_nodes_resources_and_runs(cluster):
    proc = run_cli("cluster", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert len(info["nodes"]) == 1
    node = info["nodes"][0]
    assert node["alive"] and node["address"] == "127.0.0.1"
    assert node["resources"]["CPU"] >= 1
    assert "node_group:local" in node["resources"]
    assert isinstance(info["runs"], list)
    human = run_cli("cluster", "status")
    assert human.returncode == 0 and "local-0" in human.stdout


def test_attach_from_two_processes_at_once(cluster):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: run_py(ATTACH_AND_WORK), range(2)))
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
        # the task ran in a worker of *our* cluster (it carries our cluster id)
        assert cluster.cluster_id in line


def test_attach_twice_is_harmless(attached):
    import ray

    import rlinf_nb as rl

    again = rl.attach(start=False, quiet=True)
    assert again == attached
    assert ray.is_initialized()
    info = rl.cluster_info()
    assert info["nodes"][0]["alive"]


def test_detached_actor_outlives_its_creator(cluster):
    make = textwrap.dedent(
        """
        import rlinf_nb as rl, ray
        rl.attach(start=False, quiet=True)
        @ray.remote
        class Box:
            def __init__(self): self.v = 41
            def bump(self): self.v += 1; return self.v
        b = Box.options(name="test_box", lifetime="detached", get_if_exists=True).remote()
        print("MADE", ray.get(b.bump.remote()))
        """
    )
    first = run_py(make)
    assert first.returncode == 0 and "MADE 42" in first.stdout, first.stderr
    later = run_py(
        textwrap.dedent(
            """
            import rlinf_nb as rl, ray
            rl.attach(start=False, quiet=True)
            b = ray.get_actor("test_box", namespace="rlinf_nb")
            print("LATER", ray.get(b.bump.remote()))
            ray.kill(b)
            """
        )
    )
    assert later.returncode == 0, later.stderr
    assert "LATER 43" in later.stdout


def test_client_without_the_token_is_refused(cluster, tmp_path):
    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    code = textwrap.dedent(
        f"""
        import os
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = {str(wrong)!r}
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import ray
        try:
            ray.init(address={cluster.address!r}, _node_ip_address="127.0.0.1")
            print("CONNECTED")
        except Exception as exc:
            print("REFUSED", type(exc).__name__, exc)
        """
    )
    proc = run_py(code, timeout=120)
    assert "CONNECTED" not in proc.stdout
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    # the GCS says why: the token is wrong
    assert "InvalidAuthToken" in proc.stdout + proc.stderr


def test_stale_state_file_gives_a_clear_message_quickly(tmp_path):
    home = tmp_path / "stale"
    (home / "cluster").mkdir(parents=True)
    dead_port = cluster_mod.free_port()
    state = {
        "cluster_id": "deadbeef",
        "address": f"127.0.0.1:{dead_port}",
        "gcs_port": dead_port,
        "token_path": str(home / "cluster" / "auth_token"),
        "started_at": time.time() - 3600,
        "nodes": [],
        "spec": {},
        "loopback_only": True,
    }
    (home / "cluster" / "state.json").write_text(json.dumps(state))
    t0 = time.time()
    proc = run_py(
        "import rlinf_nb as rl\n"
        "try:\n    rl.attach(start=False)\nexcept rl.ClusterError as e:\n    print('ERR', e)\n",
        home=home,
        timeout=60,
    )
    elapsed = time.time() - t0
    assert "ERR" in proc.stdout, proc.stderr
    assert "does not answer" in proc.stdout and "rlinf-nb cluster up" in proc.stdout
    assert elapsed < 30, f"a stale state must not hang ray.init (took {elapsed:.0f} s)"
    status = run_cli("cluster", "status", home=home, timeout=60)
    assert status.returncode == 1 and "stale" in status.stdout


def test_attach_without_start_and_no_cluster_says_what_to_run(tmp_path):
    proc = run_py(
        "import rlinf_nb as rl\n"
        "try:\n    rl.attach(start=False)\nexcept rl.ClusterError as e:\n    print('ERR', e)\n",
        home=tmp_path / "empty",
        timeout=60,
    )
    assert "ERR no rlinf-nb cluster is running" in proc.stdout, proc.stderr
    assert "rlinf-nb cluster up" in proc.stdout


@pytest.mark.parametrize(
    ("yaml_text", "line", "needle"),
    [
        ("node_groups:\n  - label: train\n    num_cpu: 1\n", 3, "node_groups[0].num_cpu"),
        ("node_groups:\n  - label: train\n    num_cpus: lots\n", 3, "node_groups[0].num_cpus"),
        ("node_groups:\n  - label: train\n  bad_indent: [\n", 3, "invalid YAML"),
        ("object_store_memory: 1GiB\nnode_group: []\n", 2, "node_group"),
    ],
)
def test_malformed_cluster_yaml_names_line_and_key(tmp_path, yaml_text, line, needle):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml_text)
    proc = run_cli("cluster", "up", "--config", str(path), home=tmp_path / "home", timeout=60)
    assert proc.returncode == 2
    assert f"line {line}" in proc.stderr, proc.stderr
    assert needle in proc.stderr
    assert not (tmp_path / "home" / "cluster" / "state.json").exists()


def test_up_status_down_from_subprocesses_stops_only_ours(cluster, tmp_path):
    """A second cluster in another home comes up and goes down; the session cluster is untouched."""
    import psutil

    home = tmp_path / "h2"
    up = run_cli("cluster", "up", home=home, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((home / "cluster" / "state.json").read_text())
    assert state["address"] != cluster.address
    assert not state["address"].startswith("/tmp/ray")
    status = run_cli("cluster", "status", home=home, timeout=120)
    assert status.returncode == 0 and "127.0.0.1" in status.stdout, status.stderr

    def ours(cid: str) -> list[int]:
        pids = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.environ().get("RLINF_NB_CLUSTER_ID") == cid:
                    pids.append(p.pid)
            except (psutil.Error, OSError):
                continue
        return pids

    assert ours(state["cluster_id"]), "the second cluster's processes carry its id"
    down = run_cli("cluster", "down", home=home, timeout=120)
    assert down.returncode == 0, down.stderr
    assert ours(state["cluster_id"]) == []
    assert not (home / "cluster" / "state.json").exists()
    assert cluster_mod.gcs_answers(cluster.address), "down must not touch another cluster"
    assert ours(cluster.cluster_id)
