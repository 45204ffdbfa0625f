"""Tasks: reset, reward, success and limits, addressed by component path (never by driver).

A task reads the arm at ``arm`` (its end effector) and objects from the scene at
``scene``; :class:`~rlinf_nb.envs.robot_env.RobotEnv` turns a robot plus a task into a
gymnasium env. Built-in tasks (``@register_task``):

- ``reach``: bring the end effector to a random target;
- ``push``: push the puck to a random goal on the table;
- ``insert``: lower the peg the arm holds into the block's hole;
- ``bireach``: each arm of a multi-arm robot (``arms``) to its own target.

Each has ``reward: dense`` (shaped, negative distances) or ``reward: sparse`` (1 on
success, else 0), and reports ``success`` every step.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
from rlinf_nb.robots.components import Scene
from rlinf_nb.robots.errors import RobotError, SpecError
from rlinf_nb.robots.registry import build_config
from rlinf_nb.robots.robot import Robot
from rlinf_nb.robots.safety import SafeArm

T = TypeVar("T")
_TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: the task class serves ``"<spec>/<name>"`` env ids."""

    def decorator(cls: type[T]) -> type[T]:
        if name in _TASKS and _TASKS[name] is not cls:
            raise ValueError(f"register_task: task {name!r} is already registered")
        _TASKS[name] = cls  # type: ignore[assignment]
        cls.name = name  # type: ignore[attr-defined]
        return cls

    return decorator


def task_names() -> list[str]:
    return sorted(_TASKS)


def task_class(name: str) -> type[Task]:
    try:
        return _TASKS[name]
    except KeyError:
        raise SpecError(f"task: unknown task {name!r}; known tasks: {', '.join(task_names())}") from None


@dataclass
class TaskConfig:
    """Fields every task has."""

    arm: str = "arm"
    """Path of the arm the task uses."""
    scene: str = "scene"
    """Path of the scene component (object positions); tasks that need objects require it."""
    reward: str = "dense"
    """``dense`` (shaped) or ``sparse`` (1.0 on success, else 0.0)."""
    max_steps: int = 50
    """Episode length limit (truncation)."""
    terminate_on_success: bool = True
    """End the episode (terminated) as soon as the task succeeds."""
    home: list[float] | None = None
    """Arm joint positions at reset; None: where the arm was when the task was built."""

    def __post_init__(self) -> None:
        if self.reward not in ("dense", "sparse"):
            raise SpecError(f"reward: {self.reward!r} is not a reward type; allowed: 'dense', 'sparse'")
        if self.max_steps < 1:
            raise SpecError(f"max_steps must be >= 1, got {self.max_steps}")


@dataclass
class TaskEval:
    """One step's verdict."""

    reward: float
    success: bool
    failure: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def _box(low: list[float], high: list[float], name: str) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.asarray(low, float), np.asarray(high, float)
    if lo.shape != hi.shape or np.any(lo > hi):
        raise SpecError(f"{name}: low {low} must not exceed high {high} (same length)")
    return lo, hi


class Task(abc.ABC):
    """Base task: reset the arm home, sample the episode, score each step."""

    name: ClassVar[str] = "?"
    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    needs_scene: ClassVar[bool] = False
    needs_objects: ClassVar[tuple[str, ...]] = ()

    def __init__(self, robot: Robot, config: TaskConfig):
        self.robot = robot
        self.config = config
        arm = robot.component(config.arm)
        if not isinstance(arm, SafeArm):
            raise SpecError(f"task {self.name}: arm: {config.arm!r} is a {arm.kind}, not an arm")
        if not arm.has_kinematics:
            raise SpecError(
                f"task {self.name}: the arm at {config.arm!r} (driver {arm.driver_name!r}) has no forward "
                "kinematics, which this task needs for its end effector"
            )
        self.arm: SafeArm = arm
        self.scene: Scene | None = None
        if self.needs_scene:
            scene = robot.component(config.scene) if config.scene in robot else None
            if not isinstance(scene, Scene):
                raise SpecError(
                    f"task {self.name}: needs a scene component at {config.scene!r} (object positions); "
                    f"robot {robot.name!r} has paths {', '.join(robot.paths)}"
                )
            missing = [o for o in self.needs_objects if o not in scene.object_names]
            if missing and set(missing) <= set(scene.addable_objects) and not scene.is_connected:
                scene.add_objects(missing)  # e.g. the sim scene builds the insert task's peg and hole
                missing = [o for o in self.needs_objects if o not in scene.object_names]
            if missing:
                raise SpecError(
                    f"task {self.name}: the scene has no object(s) {missing}; it has {scene.object_names}"
                )
            self.scene = scene
        self._home = None if config.home is None else np.asarray(config.home, dtype=np.float64)

    @property
    def arms(self) -> dict[str, SafeArm]:
        """The arms the task drives, by path, in action-layout order (one: ``{config.arm: arm}``)."""
        return {self.config.arm: self.arm}

    # -- to implement -----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def obs_dim(self) -> int:
        """Length of :meth:`observation`."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator) -> None:
        """Draw this episode's targets and place objects (after the arm is home)."""

    @abc.abstractmethod
    def observation(self) -> np.ndarray:
        """Task part of the state observation (float32, ``[obs_dim]``)."""

    @abc.abstractmethod
    def evaluate(self) -> TaskEval:
        """Reward, success and failure of the state now."""

    # -- shared -----------------------------------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        if self._home is None:
            self._home = self.arm.joint_positions()
        self._move_home()
        if self.scene is not None and hasattr(self.scene, "reset"):
            self.scene.reset()
        self.sample(rng)

    def _move_home(self, tol: float = 1e-6, max_steps: int = 400, arm: SafeArm | None = None,
                   home: np.ndarray | None = None) -> None:  # fmt: skip
        """Bring ``arm`` (default: the task's arm) to ``home`` (default: the task's home)."""
        arm = self.arm if arm is None else arm
        home = self._home if home is None else home
        if arm.can_teleport:
            arm.teleport(home)
            return
        for _ in range(max_steps):
            if np.max(np.abs(arm.joint_positions() - home)) <= tol:
                return
            arm.send(home)
            self.robot.tick()
        raise RobotError(
            f"task {self.name}: the arm did not reach its home {home.tolist()} within {max_steps} steps"
        )

    def ee(self) -> np.ndarray:
        return self.arm.ee_position()

    def _place(self, name: str, pos: np.ndarray) -> None:
        if self.scene is not None and self.scene.can_place and name in self.scene.object_names:
            self.scene.place(name, pos)

    def _score(self, dense: float, success: bool, failure: bool = False, **info: Any) -> TaskEval:
        reward = dense if self.config.reward == "dense" else float(success)
        return TaskEval(float(reward), bool(success), bool(failure), info)


# -- reach ----------------------------------------------------------------------------------


@dataclass
class ReachConfig(TaskConfig):
    """Reach a random point with the end effector."""

    target_low: list[float] = field(default_factory=lambda: [0.25, -0.2, 0.08])
    """Lower corner (m) of the box targets are drawn from."""
    target_high: list[float] = field(default_factory=lambda: [0.55, 0.2, 0.35])
    """Upper corner (m) of that box."""
    success_radius: float = 0.03
    """Success when the end effector is this close (m) to the target."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _box(self.target_low, self.target_high, "target_low/target_high")
        if self.success_radius <= 0:
            raise SpecError(f"success_radius must be > 0, got {self.success_radius}")


@register_task("reach")
class ReachTask(Task):
    config_class = ReachConfig

    def __init__(self, robot: Robot, config: ReachConfig):
        super().__init__(robot, config)
        self.target = np.zeros(3)
        if config.scene in robot and isinstance(robot.component(config.scene), Scene):
            self.scene = robot.component(config.scene)  # only to show the target marker

    @property
    def obs_dim(self) -> int:
        return 6

    def sample(self, rng: np.random.Generator) -> None:
        lo, hi = _box(self.config.target_low, self.config.target_high, "target")
        self.target = rng.uniform(lo, hi)
        self._place("target", self.target)

    def observation(self) -> np.ndarray:
        return np.concatenate([self.target, self.target - self.ee()]).astype(np.float32)

    def evaluate(self) -> TaskEval:
        dist = float(np.linalg.norm(self.target - self.ee()))
        return self._score(-dist, dist < self.config.success_radius, distance=dist)


# -- bimanual reach --------------------------------------------------------------------------


@dataclass
class BiReachConfig(TaskConfig):
    """Each arm of a multi-arm robot reaches its own random target (success: all of them there)."""

    arm: str = ""
    """Leave empty: the first of ``arms`` (the env's primary arm)."""
    arms: list[str] = field(default_factory=lambda: ["left/arm", "right/arm"])
    """Paths of the arms, in action-layout order (each gets its own target box below)."""
    target_low: list[list[float]] = field(default_factory=lambda: [[0.25, 0.0, 0.08], [0.25, -0.2, 0.08]])
    """Per arm (same order as ``arms``): lower corner (m) of the box its target is drawn from."""
    target_high: list[list[float]] = field(default_factory=lambda: [[0.55, 0.2, 0.35], [0.55, 0.0, 0.35]])
    """Per arm: upper corner (m) of that box."""
    success_radius: float = 0.03
    """An arm is there when its end effector is this close (m) to its target."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.arms) < 2 or len(set(self.arms)) != len(self.arms):
            raise SpecError(f"arms: expected two or more distinct arm paths, got {self.arms}")
        if not self.arm:
            self.arm = self.arms[0]
        elif self.arm != self.arms[0]:
            raise SpecError(f"arm: {self.arm!r} must be empty or the first of arms {self.arms}")
        for name in ("target_low", "target_high"):
            if len(getattr(self, name)) != len(self.arms):
                raise SpecError(
                    f"{name}: expected one box corner per arm ({len(self.arms)}), got {getattr(self, name)}"
                )
        for i, (lo, hi) in enumerate(zip(self.target_low, self.target_high, strict=True)):
            _box(lo, hi, f"target_low[{i}]/target_high[{i}]")
        if self.success_radius <= 0:
            raise SpecError(f"success_radius must be > 0, got {self.success_radius}")


@register_task("bireach")
class BiReachTask(Task):
    """Two (or more) arms, each to its own target; dense reward: minus the sum of the distances."""

    config_class = BiReachConfig

    def __init__(self, robot: Robot, config: BiReachConfig):
        super().__init__(robot, config)
        self._arms: dict[str, SafeArm] = {}
        for path in config.arms:
            arm = robot.component(path)
            if not isinstance(arm, SafeArm) or not arm.has_kinematics:
                raise SpecError(
                    f"task bireach: arms: {path!r} is not an arm with kinematics; robot {robot.name!r} "
                    f"has arms {', '.join(robot.components('arm'))}"
                )
            self._arms[path] = arm
        self._homes: dict[str, np.ndarray] = {}
        self.targets = np.zeros((len(config.arms), 3))

    @property
    def arms(self) -> dict[str, SafeArm]:
        return dict(self._arms)

    @property
    def obs_dim(self) -> int:
        return 6 * len(self._arms)

    def reset(self, rng: np.random.Generator) -> None:
        for path, arm in self._arms.items():
            if path not in self._homes:
                self._homes[path] = (
                    arm.joint_positions() if path != self.config.arm or self._home is None else self._home
                )
            self._move_home(arm=arm, home=self._homes[path])
        self.sample(rng)

    def sample(self, rng: np.random.Generator) -> None:
        cfg: BiReachConfig = self.config
        self.targets = np.stack(
            [rng.uniform(lo, hi) for lo, hi in zip(cfg.target_low, cfg.target_high, strict=True)]
        )

    def ees(self) -> np.ndarray:
        """End-effector positions ``[n_arms, 3]`` in ``arms`` order."""
        return np.stack([arm.ee_position() for arm in self._arms.values()])

    def observation(self) -> np.ndarray:
        return (
            np.concatenate([self.targets, self.targets - self.ees()], axis=1).reshape(-1).astype(np.float32)
        )

    def evaluate(self) -> TaskEval:
        dists = np.linalg.norm(self.targets - self.ees(), axis=1)
        there = dists < self.config.success_radius
        return self._score(-float(dists.sum()), bool(there.all()), distance=float(dists.max()),
                           arms_there=there)  # fmt: skip


# -- push -----------------------------------------------------------------------------------


@dataclass
class PushConfig(TaskConfig):
    """Push the puck to a goal on the table."""

    max_steps: int = 100
    """Episode length limit (truncation)."""
    puck_low: list[float] = field(default_factory=lambda: [0.32, -0.12])
    """Lower corner (x, y; m) of the puck's start area."""
    puck_high: list[float] = field(default_factory=lambda: [0.42, 0.12])
    """Upper corner of the puck's start area."""
    goal_offset: list[float] = field(default_factory=lambda: [0.06, 0.12])
    """Goal distance (m) from the puck's start: drawn in [min, max], in a random direction."""
    success_radius: float = 0.03
    """Success when the puck's centre is this close (m, in x-y) to the goal."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _box(self.puck_low, self.puck_high, "puck_low/puck_high")
        if len(self.goal_offset) != 2 or not 0 <= self.goal_offset[0] <= self.goal_offset[1]:
            raise SpecError(f"goal_offset: expected [min, max] with 0 <= min <= max, got {self.goal_offset}")


@register_task("push")
class PushTask(Task):
    config_class = PushConfig
    needs_scene = True
    needs_objects = ("puck", "goal")

    def __init__(self, robot: Robot, config: PushConfig):
        super().__init__(robot, config)
        self.goal = np.zeros(3)

    @property
    def obs_dim(self) -> int:
        return 9

    def sample(self, rng: np.random.Generator) -> None:
        cfg: PushConfig = self.config
        puck = np.array([*rng.uniform(cfg.puck_low, cfg.puck_high), 0.02])
        angle = rng.uniform(-np.pi, np.pi)
        dist = rng.uniform(*cfg.goal_offset)
        self.goal = puck + dist * np.array([np.cos(angle), np.sin(angle), 0.0])
        self.goal[2] = 0.0
        if not self.scene.can_place:
            raise RobotError(f"task push: the scene at {cfg.scene!r} cannot place objects; reset it by hand")
        self.scene.place("puck", puck)
        self.scene.place("goal", self.goal)

    def observation(self) -> np.ndarray:
        puck = self.scene.position("puck")
        return np.concatenate([puck, self.goal, puck - self.ee()]).astype(np.float32)

    def evaluate(self) -> TaskEval:
        puck = self.scene.position("puck")
        to_goal = float(np.linalg.norm((self.goal - puck)[:2]))
        to_puck = float(np.linalg.norm(puck - self.ee()))
        return self._score(
            -to_puck - 2.0 * to_goal, to_goal < self.config.success_radius, puck_to_goal=to_goal
        )


# -- insert ---------------------------------------------------------------------------------


@dataclass
class InsertConfig(TaskConfig):
    """Insert the held peg into the block's hole."""

    max_steps: int = 80
    """Episode length limit (truncation)."""
    hole_low: list[float] = field(default_factory=lambda: [0.30, -0.15])
    """Lower corner (x, y; m) of where the hole is drawn."""
    hole_high: list[float] = field(default_factory=lambda: [0.48, 0.15])
    """Upper corner of where the hole is drawn."""
    hole_height: float = 0.05
    """Height (m) of the block's top, where the hole opens."""
    tolerance: float = 0.01
    """Largest x-y misalignment (m) of peg tip and hole that still goes in."""
    depth: float = 0.02
    """Success when the peg tip is this deep (m) in the hole."""
    block_half_size: float = 0.05
    """Half the side (m) of the block around the hole (pressing on it beside the hole is a contact)."""
    contact_penalty: float = 0.5
    """Dense reward lost per step while the peg presses on the block beside the hole."""
    fail_on_contact: bool = False
    """End the episode (terminated, failure) on such a contact."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _box(self.hole_low, self.hole_high, "hole_low/hole_high")
        for name in ("tolerance", "depth", "hole_height", "block_half_size"):
            if getattr(self, name) <= 0:
                raise SpecError(f"{name} must be > 0, got {getattr(self, name)}")


@register_task("insert")
class InsertTask(Task):
    config_class = InsertConfig
    needs_scene = True
    needs_objects = ("hole", "peg")

    def __init__(self, robot: Robot, config: InsertConfig):
        super().__init__(robot, config)
        self.hole = np.zeros(3)

    @property
    def obs_dim(self) -> int:
        return 9

    def sample(self, rng: np.random.Generator) -> None:
        cfg: InsertConfig = self.config
        self.hole = np.array([*rng.uniform(cfg.hole_low, cfg.hole_high), cfg.hole_height])
        self._place("hole", self.hole)

    def observation(self) -> np.ndarray:
        tip = self.scene.position("peg")
        return np.concatenate([self.hole, tip, self.hole - tip]).astype(np.float32)

    def evaluate(self) -> TaskEval:
        cfg: InsertConfig = self.config
        tip = self.scene.position("peg")
        xy = float(np.linalg.norm((tip - self.hole)[:2]))
        aligned = xy <= cfg.tolerance
        depth = float(self.hole[2] - tip[2])
        contact = (not aligned) and depth > 0 and xy < cfg.block_half_size + cfg.tolerance
        success = aligned and depth >= cfg.depth
        z_goal = self.hole[2] - cfg.depth if aligned else self.hole[2] + 0.02
        dense = -xy - 0.5 * abs(float(tip[2]) - z_goal) - (cfg.contact_penalty if contact else 0.0)
        return self._score(dense, success, contact and cfg.fail_on_contact, misalignment=xy, contact=contact)


def make_task(name: str, robot: Robot, **options: Any) -> Task:
    """The registered task ``name`` on ``robot`` with ``options`` as fields of its config."""
    cls = task_class(name)
    return cls(robot, build_config(cls.config_class, options, f"task {name!r}"))


__all__ = [
    "BiReachTask",
    "InsertTask",
    "PushTask",
    "ReachTask",
    "Task",
    "TaskConfig",
    "TaskEval",
    "make_task",
    "register_task",
    "task_names",
]
