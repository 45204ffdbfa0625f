"""The cluster YAML: node groups that become Ray nodes with custom resources.

Example (``cluster.yaml``)::

    object_store_memory: 512MiB
    node_groups:
      - label: train        # the first group hosts the Ray head
        num_cpus: 1
      - label: sim
        num_cpus: 1
      - label: robot
        num_cpus: 0
        robots: [arm0]      # resource "robot:arm0": 1, held by exactly one env worker

Every node of group ``label`` advertises the custom resource ``node_group:<label>``
(so worker groups can be placed by label) plus its own ``resources`` and one
``robot:<name>`` per robot. Changing hardware or topology changes this file,
never task or policy code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlinf_nb.config import ConfigError, build, load_yaml_with_lines, param, parse_bytes

NODE_GROUP_RESOURCE = "node_group:{label}"
NODE_GROUP_CAPACITY = 1000.0
ROBOT_RESOURCE = "robot:{name}"


@dataclass(frozen=True)
class NodeGroupSpec:
    """One group of Ray nodes on this machine, placed by its label."""

    label: str = param(doc="name worker groups use to be placed here (resource node_group:<label>)")
    num_nodes: int = param(1, doc="how many Ray nodes of this group to start", range=(1, 16))
    num_cpus: float = param(1.0, doc="CPUs each node advertises to Ray", range=(0, 1024))
    num_gpus: float = param(0.0, doc="GPUs each node advertises to Ray", range=(0, 64))
    resources: dict[str, float] = param(factory=dict, doc="extra custom resources per node")
    robots: list[str] = param(factory=list, doc="robots attached to this group; each becomes robot:<name>")
    object_store_memory: str | None = param(
        None, doc="per-node object store size (e.g. 512MiB); default: cluster's"
    )

    def validate(self) -> None:
        if not self.label or not self.label.replace("_", "").replace("-", "").isalnum():
            raise ConfigError("label", self.label, "labels are non-empty and use letters, digits, '-' or '_'")
        for key in ("num_cpus", "num_gpus"):  # `ray start` takes whole numbers of CPUs and GPUs per node
            if float(getattr(self, key)) != int(getattr(self, key)):
                raise ConfigError(key, getattr(self, key), "a node advertises a whole number (0, 1, 2, ...)")
        if self.robots and self.num_nodes != 1:
            raise ConfigError("num_nodes", self.num_nodes, "a group with robots has exactly one node")

    def node_resources(self) -> dict[str, float]:
        """The custom resources each node of this group advertises."""
        res = {NODE_GROUP_RESOURCE.format(label=self.label): NODE_GROUP_CAPACITY}
        res.update(self.resources)
        for robot in self.robots:
            res[ROBOT_RESOURCE.format(name=robot)] = 1.0
        return res


def _default_groups() -> list[NodeGroupSpec]:
    return [NodeGroupSpec(label="local", num_cpus=float(os.cpu_count() or 1))]


@dataclass(frozen=True)
class ClusterSpec:
    """The local cluster: a head plus optional worker nodes, all on this machine."""

    node_groups: list[NodeGroupSpec] = param(
        factory=_default_groups, doc="node groups; the first hosts the head"
    )
    object_store_memory: str = param("1GiB", doc="default per-node object store size")
    include_dashboard: bool = param(
        False, doc="start Ray's dashboard (≈0.7 GB more memory; needed for the Jobs API)"
    )

    def validate(self) -> None:
        if not self.node_groups:
            raise ConfigError("node_groups", [], "at least one node group is required")
        labels = [g.label for g in self.node_groups]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ConfigError("node_groups", dupes, "labels must be unique")
        robots = [r for g in self.node_groups for r in g.robots]
        if len(robots) != len(set(robots)):
            raise ConfigError("node_groups.robots", robots, "each robot belongs to exactly one group")
        for i, group in enumerate(self.node_groups):
            size = group.object_store_memory or self.object_store_memory
            try:
                parse_bytes(size)
            except ValueError as exc:
                raise ConfigError(f"node_groups[{i}].object_store_memory", size, str(exc)) from None

    @property
    def multi_node(self) -> bool:
        return sum(g.num_nodes for g in self.node_groups) > 1


def load_cluster_spec(path: str | Path | None) -> ClusterSpec:
    """Read a cluster YAML (or the single-node default when ``path`` is None).

    Raises:
        ConfigError: names the line and key of a malformed or invalid entry.
        FileNotFoundError: when the file does not exist.
    """
    if path is None:
        return ClusterSpec()
    text = Path(path).read_text()
    data, lines = load_yaml_with_lines(text)
    if data is None:
        return ClusterSpec()
    if not isinstance(data, dict):
        raise ConfigError(
            "<root>", data, "the cluster YAML must be a mapping with a node_groups list", line=1
        )
    return build(ClusterSpec, data, lines=lines)
