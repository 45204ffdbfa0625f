"""``placement_problem``: why worker groups cannot be placed, from per-node resources (no cluster)."""

from __future__ import annotations

import pytest
from rlinf_nb.runtime.worker import GroupPlacement, placement_problem

SIM, TRAIN = "node_group:sim", "node_group:train"


def nodes(*resources: dict[str, float]) -> list[dict[str, float]]:
    return [dict(r) for r in resources]


TWO_NODES = nodes({"CPU": 2, TRAIN: 1000}, {"CPU": 2, SIM: 1000, "sim_slot": 4})


def test_groups_that_fit_give_no_problem_and_leave_the_inputs_alone():
    free = nodes(*TWO_NODES)
    groups = {"env": GroupPlacement(count=2, node_group="sim", resources={"sim_slot": 1}),
              "actor": GroupPlacement(count=2, node_group="train")}  # fmt: skip
    assert placement_problem(groups, TWO_NODES, free) is None
    assert free == TWO_NODES


def test_a_resource_no_node_provides_is_named():
    msg = placement_problem({"env": GroupPlacement(resources={"robot:nope": 1})}, TWO_NODES, TWO_NODES)
    assert "'env'" in msg and "'robot:nope'" in msg and "no node provides it" in msg


def test_workers_beyond_what_is_free_name_the_worker_and_the_resource():
    msg = placement_problem({"env": GroupPlacement(count=5, num_cpus=1)}, TWO_NODES, TWO_NODES)
    assert (
        "worker 5 of 5" in msg and "enough 'CPU' left" in msg and "other runs or groups hold the rest" in msg
    )
    # CPUs are left on the train node, not on the sim node the group is placed on
    msg = placement_problem({"env": GroupPlacement(count=3, node_group="sim")}, TWO_NODES, TWO_NODES)
    assert "worker 3 of 3" in msg and "the nodes of node group 'sim' have no ['CPU'] left" in msg


def test_a_label_and_a_resource_on_different_nodes_name_what_the_labelled_nodes_lack():
    """Every resource exists somewhere, so no single resource is short: the message must still name
    sim_slot (which the train nodes lack), not CPU."""
    groups = {"env": GroupPlacement(node_group="train", resources={"sim_slot": 1})}
    msg = placement_problem(groups, TWO_NODES, TWO_NODES)
    assert msg is not None and "no single node has all of it" in msg
    assert "the nodes of node group 'train' lack ['sim_slot']" in msg and "'CPU'" not in msg.split("but")[1]
    assert "give node group 'train' ['sim_slot'] in the cluster YAML" in msg


def test_a_labelled_resource_held_by_others_says_so():
    free = nodes({"CPU": 2, TRAIN: 1000}, {"CPU": 2, SIM: 1000, "sim_slot": 0})
    third = nodes({"CPU": 0, "sim_slot": 1})  # some sim_slot is free, but on a node without CPUs
    groups = {"env": GroupPlacement(node_group="sim", resources={"sim_slot": 1})}
    msg = placement_problem(groups, TWO_NODES + [{"CPU": 1, "sim_slot": 1}], free + third)
    assert "the nodes of node group 'sim' have no ['sim_slot'] left (other runs or groups hold it)" in msg


@pytest.mark.parametrize("count", [1, 2])
def test_gpu_is_asked_for_only_when_the_group_needs_it(count):
    groups = {"actor": GroupPlacement(count=count, num_gpus=1)}
    msg = placement_problem(groups, TWO_NODES, TWO_NODES)
    assert "'GPU'" in msg and "no node provides it" in msg
    assert placement_problem({"actor": GroupPlacement(count=count)}, TWO_NODES, TWO_NODES) is None


# ----------------------------------------------------------------------------- placement.env_to_rollout: auto

ONE_NODE = nodes({"CPU": 2})


def test_auto_routes_through_lanes_only_where_one_node_hosts_every_env_and_rollout_worker():
    from rlinf_nb.runtime.worker import route_env_to_rollout

    def route(env: GroupPlacement, rollout: GroupPlacement, totals, lanes: bool = True) -> str:
        return route_env_to_rollout("auto", {"env": env, "rollout": rollout}, totals, lanes)

    assert route(GroupPlacement(2), GroupPlacement(1), ONE_NODE) == "channel"
    # two nodes: unlabelled workers could land on either, so a lane might not reach
    assert route(GroupPlacement(2), GroupPlacement(1), TWO_NODES) == "direct"
    # both groups pinned to the sim node (by label or by a resource only it has): one node, lanes
    assert (
        route(GroupPlacement(2, node_group="sim"), GroupPlacement(1, node_group="sim"), TWO_NODES)
        == "channel"
    )
    assert route(GroupPlacement(1, resources={"sim_slot": 1}), GroupPlacement(1, node_group="sim"),
                 TWO_NODES) == "channel"  # fmt: skip
    # env on sim, rollout on train: across nodes
    assert (
        route(GroupPlacement(1, node_group="sim"), GroupPlacement(1, node_group="train"), TWO_NODES)
        == "direct"
    )
    # a robot worker (its own resource) on one node and the rollout worker unlabelled: direct
    robot = GroupPlacement(1, rank_resources=[{"robot:arm": 1}])
    assert route(robot, GroupPlacement(1), nodes({"CPU": 2}, {"CPU": 2, "robot:arm": 1})) == "direct"
    # lanes off (placement.lanes false, or a linked obs/actions stream): a brokered channel loses to a call
    assert route(GroupPlacement(2), GroupPlacement(1), ONE_NODE, lanes=False) == "direct"
    for mode in ("direct", "channel", "colocated"):  # explicit modes are kept
        assert route_env_to_rollout(mode, {"env": GroupPlacement()}, TWO_NODES, False) == mode


def test_candidate_nodes_are_those_with_all_a_worker_asks_for():
    from rlinf_nb.runtime.worker import candidate_nodes

    assert candidate_nodes(GroupPlacement(1), TWO_NODES) == {0, 1}
    assert candidate_nodes(GroupPlacement(1, node_group="train"), TWO_NODES) == {0}
    assert candidate_nodes(GroupPlacement(1, num_cpus=3), TWO_NODES) == set()
    assert candidate_nodes(GroupPlacement(1, num_gpus=1), TWO_NODES) == set()
    per_rank = GroupPlacement(2, rank_resources=[{"sim_slot": 1}, {}])
    assert candidate_nodes(per_rank, TWO_NODES) == {0, 1}  # rank 0 only on sim, rank 1 anywhere
