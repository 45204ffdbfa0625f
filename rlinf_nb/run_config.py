"""The config of a run: env, algorithm section, policy, placement, budget, checkpoints.

A run config is built from a packaged recipe (``rlinf_nb/recipes/<name>.yaml``) or a
dict, plus keyword overrides (``num_envs=16``, ``algo__lr=3e-4`` or ``{"algo.lr": 3e-4}``).
Every key is validated; a bad one raises :class:`~rlinf_nb.config.ConfigError`
naming its path, the value and what is allowed. The ``algo`` section is typed by the
algorithm's own config class (see :mod:`rlinf_nb.algorithms.registry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlinf_nb.config import ConfigError, build, live_fields, param
from rlinf_nb.data.run_recording import RecordConfig
from rlinf_nb.link import LinkConfig
from rlinf_nb.runtime.compression import CompressionConfig
from rlinf_nb.runtime.links import RunLinks


@dataclass
class EnvConfig:
    """Which env each env worker runs."""

    id: str = param("CartPole-v1", doc="env spec for make_env: a gymnasium id or 'prefix:id'")
    num_envs: int = param(8, doc="vectorised envs per env worker", range=(1, 4096))
    kwargs: dict[str, Any] = param(factory=dict, doc="extra keyword arguments for the env constructor")
    render_every: int = param(
        0, doc="keep a frame every N env steps for the viewer (0 = off)", range=(0, None)
    )
    link: LinkConfig = param(
        factory=LinkConfig, doc="simulated observation/action delays between policy and env (off by default)"
    )


@dataclass
class GroupConfig:
    """Size and placement of one worker group."""

    num_workers: int = param(1, doc="how many workers in the group", range=(1, 256))
    num_cpus: float = param(0.5, doc="CPUs reserved per worker", range=(0, 256))
    num_gpus: float = param(0.0, doc="GPUs reserved per worker", range=(0, 16))
    node_group: str | None = param(None, doc="place on nodes of this cluster-YAML label (None = anywhere)")
    resources: dict[str, float] = param(factory=dict, doc="extra Ray resources per worker (e.g. robot:arm0)")


@dataclass
class EnvGroupConfig(GroupConfig):
    """The env workers: a worker group whose workers may each claim one robot of the cluster."""

    robots: list[str] = param(
        factory=list,
        doc="robots claimed by the env workers, one per worker: worker i holds robot:<robots[i]> (a robot "
        "node group of the cluster YAML) and runs env.id with '{robot}' replaced by its name; [] = none",
    )

    def validate(self) -> None:
        from rlinf_nb.runtime.robot_claims import robot_problems

        problem = robot_problems(self.robots, self.num_workers)
        if problem is not None:
            raise ConfigError("robots", *problem)


# Defaults reserve one CPU per run in all, so two small runs fit side by side on 2 cores.
def _env_group() -> EnvGroupConfig:
    return EnvGroupConfig(num_workers=1, num_cpus=0.25)


def _rollout_group() -> GroupConfig:
    return GroupConfig(num_workers=1, num_cpus=0.25)


def _actor_group() -> GroupConfig:
    return GroupConfig(num_workers=1, num_cpus=0.5)


@dataclass
class PlacementConfig:
    """The worker groups of a run."""

    env: EnvGroupConfig = param(factory=_env_group, doc="env workers (simulators or robots)")
    rollout: GroupConfig = param(factory=_rollout_group, doc="rollout workers (policy inference)")
    actor: GroupConfig = param(factory=_actor_group, doc="the learner")
    env_to_rollout: str = param(
        "auto",
        doc="how env workers get actions: 'direct' (one call to their rollout worker per step), "
        "'channel' (through the obs/actions channels, batched per rollout worker; on shared-memory lanes "
        "where placement.lanes allows, else four channel messages per step), "
        "'colocated' (each env worker runs its own copy of the policy, weights synced to it; no rollout "
        "workers and no per-step call: fastest for small CPU policies; placement.rollout is then unused), "
        "or 'auto' (channel when a single node is the only one that can host the env and rollout workers, "
        "else direct; run.status()['env_to_rollout'] and the start event say which)",
        choices=("auto", "direct", "channel", "colocated"),
    )
    learner: str = param(
        "worker",
        doc="where the learner runs: 'worker' (its own actor group, placed by placement.actor) or "
        "'controller' (inside the run controller's process: one learner on CPU, no process of its own to "
        "start and no Ray call per update; for small runs on one machine. Its CPU is not reserved with Ray)",
        choices=("worker", "controller"),
    )
    links: RunLinks = param(
        factory=RunLinks,
        doc="simulated network links (latency + bandwidth) on the obs, actions and trajectories streams "
        "between the node groups, in the direct and channel env_to_rollout modes (off by default)",
    )

    lanes: bool = param(
        True,
        doc="shared-memory lanes on the obs, actions and trajectories channels: a stream between a worker "
        "and another on the same Ray node skips the channel actor, item by item "
        "(rlinf_nb.runtime.lanes: ~20x faster per step in channel mode); streams with a link stay brokered",
    )
    channel_timeout_s: float = param(
        60.0,
        doc="how long a put or get on the run's channels waits before it gives up with an error naming the "
        "channel and key (a lost peer shows after this long); the reads that wait on purpose, such as an env "
        "held in its reset by an e-stop, have no timeout",
        range=(1.0, 86_400.0),
    )

    def validate(self) -> None:
        if self.learner == "controller":
            self._check_learner_in_controller()
        if self.env_to_rollout != "colocated":
            return
        for stream, link in self.links.active().items():
            if stream in ("obs", "actions"):
                raise ConfigError(
                    f"links.{stream}",
                    dataclasses.asdict(link),
                    "a colocated policy has no obs/actions link to simulate (env and policy share a "
                    "process); use env_to_rollout: direct or channel, or env.link for a delayed robot",
                )

    def _check_learner_in_controller(self) -> None:
        """``learner: controller`` hosts one CPU learner in the controller: nothing of placement.actor can apply."""
        actor, default = self.actor, _actor_group()
        why = "the learner runs in the run controller (placement.learner: controller); set placement.learner: worker"
        if actor.num_workers != 1:
            raise ConfigError("actor.num_workers", actor.num_workers, f"must be 1: {why} for more learners")
        if actor.num_gpus:
            raise ConfigError("actor.num_gpus", actor.num_gpus, f"must be 0: {why} to give the learner a GPU")
        if actor.node_group is not None:
            raise ConfigError("actor.node_group", actor.node_group, f"must be None: {why} to place it")
        if actor.resources != default.resources:
            raise ConfigError("actor.resources", actor.resources, f"must be empty: {why} to place it")


@dataclass
class BudgetConfig:
    """When a run ends by itself."""

    total_env_steps: int = param(200_000, doc="stop after this many env steps", range=(1, None))
    stop_metric: str | None = param(None, doc="metric that ends the run early when it reaches stop_value")
    stop_value: float | None = param(None, doc="threshold for stop_metric (>=)")
    stop_min_episodes: int | None = param(
        None,
        doc="episodes that must have ended before stop_metric may end the run (None = metrics_window: "
        "a full window, so a few lucky first episodes do not stop it)",
        range=(0, None),
    )

    def validate(self) -> None:
        if (self.stop_metric is None) != (self.stop_value is None):
            raise ConfigError("stop_value", self.stop_value, "set stop_metric and stop_value together")


@dataclass
class CheckpointConfig:
    """How often state is saved."""

    every: int = param(10, doc="save a checkpoint every N updates (0 = only at the end)", range=(0, None))
    keep: int = param(3, doc="complete checkpoints to keep", range=(1, 1000))


@dataclass
class PolicyConfig:
    """Which registered policy, and its keyword arguments."""

    name: str = param("mlp", doc="registered policy name (rlinf_nb.policies.registered_policies())")
    kwargs: dict[str, Any] = param(factory=dict, doc="arguments of the policy (e.g. hidden_sizes)")
    chunk: int = param(
        1,
        doc="action chunk length k: the policy emits k actions per decision and the env workers run "
        "them open loop, one per env step (1 = one action per step; on-policy algorithms only)",
        range=(1, 1024),
    )
    chunk_prefetch: int = param(
        0,
        doc="real-time chunking: ask for the next action chunk this many env steps before the current one "
        "runs out and keep stepping while the policy answers, so inference and link latency hide behind "
        "execution (each chunk's observation is then that many steps older than its first action; "
        "0 = every chunk waits for its answer; must be < chunk)",
        range=(0, 1023),
    )
    inference: str = param(
        "auto",
        doc="how env and rollout workers evaluate the policy to act: numpy = its numpy copy (the mlp "
        "policy; no torch in those processes, a fraction of torch's cost per call), torch = the torch "
        "module, auto = numpy where the policy has a numpy copy, else torch",
        choices=("auto", "torch", "numpy"),
    )

    def validate(self) -> None:
        if self.inference == "numpy" and self.name != "mlp":
            raise ConfigError(
                "inference", self.inference, f"policy {self.name!r} has no numpy copy (only 'mlp' has); use auto or torch"
            )  # fmt: skip
        if self.chunk_prefetch and self.chunk_prefetch >= self.chunk:
            why = "prefetching needs action chunks: policy.chunk > 1" if self.chunk == 1 else (
                "the next chunk is asked for that many steps before the current one runs out"
            )  # fmt: skip
            raise ConfigError(
                "chunk_prefetch", self.chunk_prefetch, f"must be < policy.chunk ({self.chunk}): {why}"
            )
        if "chunk" in self.kwargs:
            raise ConfigError(
                "kwargs.chunk", self.kwargs["chunk"],
                "set policy.chunk instead: the env workers must know the chunk length to execute it",
            )  # fmt: skip


def policy_kwargs(policy_cfg: dict[str, Any]) -> dict[str, Any]:
    """``make_policy`` keyword arguments of a resolved ``policy:`` section (a dict, as workers get it).

    ``chunk`` is passed only when > 1, so policies without action chunks need not accept it.
    """
    kwargs = dict(policy_cfg.get("kwargs") or {})
    chunk = int(policy_cfg.get("chunk", 1))
    if chunk > 1:
        kwargs["chunk"] = chunk
    return kwargs


@dataclass
class RunConfig:
    """Everything a run needs; written resolved to ``runs/<name>/config.yaml``."""

    algorithm: str = param("ppo", doc="registered algorithm name")
    seed: int = param(0, doc="seed for envs, torch and numpy")
    env: EnvConfig = param(factory=EnvConfig, doc="the env")
    algo: Any = param(factory=dict, doc="the algorithm's own section (typed by its config class)")
    policy: PolicyConfig = param(factory=PolicyConfig, doc="the policy")
    placement: PlacementConfig = param(factory=PlacementConfig, doc="worker groups")
    budget: BudgetConfig = param(factory=BudgetConfig, doc="when to stop")
    checkpoint: CheckpointConfig = param(factory=CheckpointConfig, doc="checkpointing")
    record: RecordConfig = param(
        factory=RecordConfig, doc="stream episodes into LeRobot datasets (off by default)"
    )
    compression: CompressionConfig = param(
        factory=CompressionConfig,
        doc="lossless compression of env-worker channels: obs, frames (off by default)",
    )
    metrics_window: int = param(20, doc="episodes averaged into episode_return_mean", range=(1, 10_000))
    linger_s: float = param(
        300.0,
        doc="seconds a finished run's controller stays up after the last call to it, then frees its memory "
        "(its history stays readable from the run directory)",
        range=(0.0, 7 * 24 * 3600.0),
    )

    def validate(self) -> None:
        from rlinf_nb.algorithms.registry import get_algorithm, registered_algorithms

        try:
            algo = get_algorithm(self.algorithm)
        except KeyError:
            raise ConfigError(
                "algorithm", self.algorithm, f"allowed values: {', '.join(registered_algorithms())}"
            ) from None
        if not dataclasses.is_dataclass(self.algo):
            section = self.algo if isinstance(self.algo, dict) else {}
            if not isinstance(self.algo, dict):
                raise ConfigError("algo", self.algo, "expected a mapping of algorithm settings")
            self.algo = build(algo.config_cls, section, path="algo")
        elif not isinstance(self.algo, algo.config_cls):
            raise ConfigError("algo", type(self.algo).__name__, f"expected {algo.config_cls.__name__}")
        from rlinf_nb.runtime.robot_claims import ROBOT_PLACEHOLDER

        if ROBOT_PLACEHOLDER in self.env.id and not self.placement.env.robots:
            raise ConfigError(
                "env.id",
                self.env.id,
                "'{robot}' is replaced by each env worker's robot: set placement.env.robots",
            )
        # Checks of the algo section against the rest of the run (e.g. GRPO's groups vs the env count).
        check = getattr(self.algo, "validate_run", None)
        if check is not None:
            check(self)
        if self.policy.chunk > 1:
            self._validate_chunk(algo)
        if self.placement.env_to_rollout == "colocated" and self.compression.obs.enabled:
            raise ConfigError(
                "compression.obs.enabled", True,
                "observations never leave the env worker when placement.env_to_rollout is 'colocated' "
                "(nothing to compress); use 'direct' or 'channel', or leave compression.obs off",
            )  # fmt: skip

    def _validate_chunk(self, algo: Any) -> None:
        """Action chunks need an algorithm that executes them and a rollout length they divide."""
        from rlinf_nb.algorithms.registry import get_algorithm, registered_algorithms

        k = self.policy.chunk
        if not algo.action_chunks:
            able = [n for n in registered_algorithms() if get_algorithm(n).action_chunks]
            raise ConfigError(
                "policy.chunk", k,
                f"allowed values: 1 for algorithm {self.algorithm!r} (it stores one action per env step); "
                f"action chunks run with {', '.join(able)}",
            )  # fmt: skip
        steps = getattr(self.algo, "rollout_steps", None)
        if steps is not None and steps % k:
            raise ConfigError(
                "algo.rollout_steps", steps,
                f"must be a multiple of policy.chunk ({k}): each decision executes {k} env steps",
            )  # fmt: skip


# Short names a user may pass as keyword overrides / set_hparams.
ALIASES = {"num_envs": "env.num_envs", "env_workers": "placement.env.num_workers", "env_id": "env.id"}


def live_params(cfg: RunConfig, link_streams: Sequence[str] = ()) -> dict[str, dataclasses.Field]:
    """Fields that may change mid-run, by dotted path (``algo.lr``, ...).

    ``link_streams``: the ``placement.links`` streams linked at launch; their latency and bandwidth are live
    (``placement.links.obs.latency.ms``, ...).
    """
    out = live_fields(RunConfig)
    out.update(live_fields(type(cfg.algo), "algo"))
    out.update(cfg.placement.links.live_fields(link_streams))
    return out


def resolve_key(cfg: RunConfig, key: str) -> str:
    """``"lr"`` -> ``"algo.lr"``; full dotted paths pass through."""
    key = ALIASES.get(key, key.replace("__", "."))
    if "." in key:
        return key
    top = {f.name for f in dataclasses.fields(RunConfig)}
    if key in top:
        return key
    algo_fields = (
        {f.name for f in dataclasses.fields(type(cfg.algo))} if dataclasses.is_dataclass(cfg.algo) else set()
    )
    if key in algo_fields:
        return f"algo.{key}"
    return key
