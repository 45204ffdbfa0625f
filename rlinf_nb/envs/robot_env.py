"""``RobotEnv``: a Robot plus a Task as a gymnasium env, so every algorithm runs on robots unchanged.

    env = RobotEnv("mock_arm", "reach", reward="sparse")      # or rl.make_env("robot:mock_arm/reach")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    info["success"], info["safety_clipped"], info["intervened"]

Actions are in [-1, 1]: ``ee_delta`` moves the end effector by up to ``max_ee_step``
metres per axis (damped least squares through the arm's Jacobian), ``joint_delta``
moves each joint by up to ``max_joint_step``; with ``gripper: true`` one more action
sets the gripper opening. Every command goes through the arm's SafeArm, and each step
is one ``robot.tick()`` (one control period: simulated on mock robots, slept on real ones).

Observations (``obs_mode``): ``state`` is one float32 vector (joints, end effector,
gripper, then the task's part); ``dict`` adds every camera image under its path.

Multi-arm tasks (``bireach`` on ``mock_bimanual``) drive several arms: the action is one block
per arm, in the task's ``arms`` order (:attr:`RobotEnv.action_layout` maps each arm path to its
slice), and the state has each arm's joints and end effector in that order.

An ``intervention`` may replace the agent's action each step: ``human={...}`` builds a
:class:`~rlinf_nb.envs.human.HumanInTheLoop` (teleop take-over, notebook commands, a scripted
human, blended hand-back, success/failure marks); :class:`TeleopIntervention` is the bare
teleop one. Each step's ``info`` has ``intervened`` (the human drove, on any arm), ``human_weight``,
``applied_action`` (what was sent: store that, not the agent's action), and per arm (in
:attr:`RobotEnv.arm_paths` order) ``intervened_arms`` (bool) and ``arm_weights``, plus
``human_mask`` (bool per action dim: the dims a human drove this step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlinf_nb.envs import VecEnv, register_env_backend
from rlinf_nb.envs.human import HumanInTheLoop, HumanStep, as_human_step, teleop_arm_action
from rlinf_nb.robots.components import Camera, Gripper, TeleopState
from rlinf_nb.robots.errors import EStopLatchedError, SpecError
from rlinf_nb.robots.kinematics import dls_step
from rlinf_nb.robots.registry import build_config
from rlinf_nb.robots.robot import Robot, make_robot
from rlinf_nb.robots.spec import RobotSpec, load_spec
from rlinf_nb.robots.tasks import Task, make_task, task_class

ENV_NAME = "rlinf_nb/Robot-v0"
_BOUND = 100.0  # |metres| bound of positions in the state (finite, as gymnasium's checker likes)
#: gymnasium id that imports this module first (works in fresh worker processes)
ENV_ID = f"{__name__}:{ENV_NAME}"


@dataclass
class RobotEnvConfig:
    """How a RobotEnv maps actions and observations (task fields are given alongside)."""

    action_mode: str = "ee_delta"
    """``ee_delta`` (end-effector x, y, z steps; needs arm kinematics) or ``joint_delta``."""
    obs_mode: str = "state"
    """``state`` (one float32 vector) or ``dict`` (``state`` plus every camera image by path)."""
    max_ee_step: float = 0.02
    """Metres per axis for an action of 1 in ``ee_delta`` mode."""
    max_joint_step: float = 0.1
    """Joint units for an action of 1 in ``joint_delta`` mode."""
    gripper: bool = False
    """Add one action for the gripper at ``gripper_path`` (-1 closed .. 1 open) and its opening to the state."""
    gripper_path: str = "gripper"
    """Path of that gripper."""
    ik_damping: float = 0.05
    """Damping of the least-squares IK in ``ee_delta`` mode."""

    def __post_init__(self) -> None:
        if self.action_mode not in ("ee_delta", "joint_delta"):
            raise SpecError(
                f"action_mode: {self.action_mode!r} is not a mode; allowed: 'ee_delta', 'joint_delta'"
            )
        if self.obs_mode not in ("state", "dict"):
            raise SpecError(f"obs_mode: {self.obs_mode!r} is not a mode; allowed: 'state', 'dict'")
        for name in ("max_ee_step", "max_joint_step", "ik_damping"):
            if getattr(self, name) <= 0:
                raise SpecError(f"{name} must be > 0, got {getattr(self, name)}")


class Intervention(Protocol):
    """Hook: return an action in [-1, 1] to replace the agent's (or a HumanStep), or None to let it through."""

    def __call__(self, env: RobotEnv, action: np.ndarray) -> np.ndarray | HumanStep | None: ...


class TeleopIntervention:
    """While the teleop at ``path`` says "intervene", its action replaces the agent's (ee_delta envs)."""

    def __init__(self, path: str = "teleop"):
        self.path = path

    def __call__(self, env: RobotEnv, action: np.ndarray) -> np.ndarray | None:
        state: TeleopState | None = env.last_teleop.get(self.path)
        if state is None or not state.intervene:
            return None
        out = np.zeros_like(action)
        part = teleop_arm_action(env, state)
        out[: part.size] = part
        if env.config.gripper:
            out[-1] = action[-1] if state.gripper is None else 2.0 * state.gripper - 1.0
        return out


def _split_options(task_name: str, options: Mapping[str, Any]) -> tuple[dict, dict]:
    env_fields = {f.name for f in fields(RobotEnvConfig)}
    task_fields = {f.name for f in fields(task_class(task_name).config_class)}
    unknown = sorted(set(options) - env_fields - task_fields)
    if unknown:
        raise SpecError(
            f"RobotEnv: unknown option(s) {unknown}; env options: {sorted(env_fields)}; "
            f"{task_name} task options: {sorted(task_fields)}"
        )
    return (
        {k: v for k, v in options.items() if k in env_fields},
        {k: v for k, v in options.items() if k in task_fields},
    )


class RobotEnv(gym.Env):
    """A connected robot and a task as a gymnasium env (connects on creation, disconnects on close)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        robot: str | Path | Mapping[str, Any] | RobotSpec | Robot = "mock_arm",
        task: str | Task = "reach",
        render_mode: str | None = None,
        intervention: Intervention | None = None,
        human: Mapping[str, Any] | None = None,
        robot_overrides: Mapping[str, Any] | None = None,
        **options: Any,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"RobotEnv: render_mode must be None or 'rgb_array', got {render_mode!r}")
        if isinstance(task, Task):
            env_opts, task_opts = _split_options(task.name, options)
            if task_opts:
                raise SpecError(
                    f"RobotEnv: task options {sorted(task_opts)} need a task name, not a Task object"
                )
        else:
            env_opts, task_opts = _split_options(task, options)
        self.config: RobotEnvConfig = build_config(RobotEnvConfig, env_opts, "RobotEnv")
        self.robot = robot if isinstance(robot, Robot) else make_robot(robot, robot_overrides)
        self._owns_robot = not isinstance(robot, Robot)
        self.task = task if isinstance(task, Task) else make_task(task, self.robot, **task_opts)
        self.arm = self.task.arm
        self.arms = self.task.arms
        """The arms the actions drive, by path, in action-layout order."""
        self.render_mode = render_mode
        if intervention is not None and human is not None:
            raise SpecError("RobotEnv: give either intervention= or human=, not both")
        self.intervention = HumanInTheLoop(human) if human is not None else intervention
        if len(self.arms) > 1 and self.config.gripper:
            raise SpecError(
                f"RobotEnv: gripper: true drives one gripper, which multi-arm tasks ({', '.join(self.arms)}) "
                "do not support; use gripper: false"
            )
        self.metadata = {**self.metadata, "render_fps": self.robot.spec.control_hz}
        cfg = self.config
        for arm in self.arms.values():
            if cfg.action_mode == "ee_delta" and not arm.has_kinematics:
                raise SpecError(
                    f"RobotEnv: action_mode 'ee_delta' needs arm kinematics; the {arm.driver_name!r} arm has "
                    "none: use action_mode='joint_delta'"
                )
        self.gripper: Gripper | None = None
        if cfg.gripper:
            comp = self.robot.component(cfg.gripper_path)
            if not isinstance(comp, Gripper):
                raise SpecError(
                    f"RobotEnv: gripper_path {cfg.gripper_path!r} is a {comp.kind}, not a gripper"
                )
            self.gripper = comp
        self.cameras: dict[str, Camera] = self.robot.components("camera")  # type: ignore[assignment]
        dims = {p: 3 if cfg.action_mode == "ee_delta" else len(a.joint_names) for p, a in self.arms.items()}
        self.action_layout: dict[str, slice] = action_layout(dims, 1 if self.gripper else 0)
        """Each arm path's slice of the action vector (a single arm's also covers the gripper action)."""
        n_action = sum(dims.values()) + (1 if self.gripper else 0)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (n_action,), np.float32)
        low, high = [], []
        for arm in self.arms.values():
            lim = arm.joint_limits
            low += [lim[:, 0], np.full(3, -_BOUND)]
            high += [lim[:, 1], np.full(3, _BOUND)]
        low += [np.zeros(1)] if self.gripper else []
        high += [np.ones(1)] if self.gripper else []
        low.append(np.full(self.task.obs_dim, -_BOUND))
        high.append(np.full(self.task.obs_dim, _BOUND))
        state_space = gym.spaces.Box(
            np.concatenate(low).astype(np.float32), np.concatenate(high).astype(np.float32), dtype=np.float32
        )
        if cfg.obs_mode == "state":
            self.observation_space = state_space
        else:
            spaces = {"state": state_space}
            for path, cam in self.cameras.items():
                spaces[path] = gym.spaces.Box(0, 255, cam.image_shape, np.uint8)
            self.observation_space = gym.spaces.Dict(spaces)
        self.last_teleop: dict[str, TeleopState] = {}
        self._steps = 0
        self.estop_wait: Callable[[RobotEnv], None] | None = None
        """Called by :meth:`reset` while the e-stop is latched instead of raising: it returns once the
        e-stop is cleared (a run's env worker installs one, so its rollout waits for the clear)."""
        if isinstance(self.intervention, HumanInTheLoop):
            self.intervention.bind(self.action_layout)
        if not self.robot.is_connected:
            self.robot.connect()

    # -- gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.robot.estopped and self.estop_wait is not None:
            self.estop_wait(self)
        if self.robot.estopped:
            raise EStopLatchedError(
                f"RobotEnv: the e-stop of {self.robot.name!r} is latched ({self.robot.estop_latch.reason}); "
                "call env.robot.clear_estop() when it is safe, then reset"
            )
        self.task.reset(self.np_random)
        self._steps = 0
        self.last_teleop = {}
        if hasattr(self.intervention, "reset"):
            self.intervention.reset(self)
        return self._observation(), {"success": False}

    def step(self, action: Any):
        a = np.asarray(action, dtype=np.float64)
        if a.shape != self.action_space.shape:
            raise ValueError(
                f"RobotEnv.step: expected an action of shape {self.action_space.shape}, got {a.shape}"
            )
        a = np.clip(a, -1.0, 1.0)
        human = as_human_step(self.intervention(self, a) if self.intervention is not None else None)
        if human.action is not None:
            a = np.clip(human.action, -1.0, 1.0)
        self._apply(a)
        self.last_teleop = self.robot.tick()
        self._steps += 1
        ev = self.task.evaluate()
        success, reward = ev.success, ev.reward
        if human.mark is not None:  # the human's verdict ends the episode
            success = human.mark == "success"
            cfg = getattr(self.intervention, "config", None)
            reward = float(getattr(cfg, f"{human.mark}_reward", 1.0 if success else 0.0))
        terminated = bool((success and self.task.config.terminate_on_success) or ev.failure or human.mark)
        truncated = bool(self._steps >= self.task.config.max_steps or self.robot.estopped)
        reports = [arm.last_report for arm in self.arms.values()]
        arm_w = np.array(
            [human.weight if human.arm_weights is None else human.arm_weights.get(p, 0.0) for p in self.arms],
            np.float32,
        )
        mask = np.zeros(a.shape, bool)
        for path, w in zip(self.arms, arm_w, strict=True):
            mask[self.action_layout[path]] = w >= 1.0
        info = {
            "success": success,
            "intervened": bool(arm_w.max() >= 1.0),
            "human_weight": float(arm_w.max()),
            "applied_action": a.astype(np.float32),
            "intervened_arms": arm_w >= 1.0,
            "arm_weights": arm_w,
            "human_mask": mask,
            "estop": self.robot.estopped,
            "safety_clipped": tuple(c for r in reports if r is not None for c in r.clipped),
            **ev.info,
        }
        return self._observation(), reward, terminated, truncated, info

    @property
    def arm_paths(self) -> tuple[str, ...]:
        """The arms' paths in action-layout order (the order of ``info["intervened_arms"]``)."""
        return tuple(self.arms)

    @property
    def episode_step(self) -> int:
        """Steps taken in the present episode."""
        return self._steps

    def human_command(self, cmd: Mapping[str, Any]) -> None:
        """Pass a notebook/dashboard command (take_over, action, hand_back, mark) to the human in the loop.

        ``cmd["arm"]`` (an arm path, e.g. ``"left/arm"``) limits take_over / action / hand_back to that arm.
        """
        if not isinstance(self.intervention, HumanInTheLoop):
            raise SpecError(
                "RobotEnv: this env has no human in the loop; make it with human={} (env.kwargs.human in a run)"
            )
        self.intervention.command(cmd)

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or not self.cameras:
            return None
        return next(iter(self.cameras.values())).image()

    def close(self) -> None:
        if self._owns_robot:
            self.robot.disconnect()

    # -- helpers ----------------------------------------------------------------------------
    def _apply(self, a: np.ndarray) -> None:
        cfg = self.config
        for path, arm in self.arms.items():
            part = a[self.action_layout[path]]
            q = arm.joint_positions()
            if cfg.action_mode == "ee_delta":
                target = q + dls_step(arm.jacobian(q), part[:3] * cfg.max_ee_step, cfg.ik_damping)
            else:
                target = q + part[: len(arm.joint_names)] * cfg.max_joint_step
            arm.send(target)
        if self.gripper is not None:
            self.gripper.send([(a[-1] + 1.0) / 2.0])

    def _state(self) -> np.ndarray:
        parts = []
        for arm in self.arms.values():
            q = arm.joint_positions()
            parts += [q, arm.forward_kinematics(q)]
        if self.gripper is not None:
            parts.append(np.asarray(self.gripper.read()["pos"], dtype=np.float64))
        parts.append(self.task.observation())
        return np.concatenate(parts).astype(np.float32)

    def _observation(self):
        state = self._state()
        if self.config.obs_mode == "state":
            return state
        return {"state": state, **{p: cam.image() for p, cam in self.cameras.items()}}


def action_layout(dims: Mapping[str, int], extra: int = 0) -> dict[str, slice]:
    """Consecutive slices of an action vector, one per arm path with ``dims[path]`` entries.

    ``extra`` trailing entries (a gripper action) belong to the arm when there is exactly one.
    """
    if extra and len(dims) != 1:
        raise SpecError(f"action_layout: {extra} extra action(s) need exactly one arm, got {list(dims)}")
    out, start = {}, 0
    for path, n in dims.items():
        out[path] = slice(start, start + n + extra)
        start += n
    return out


if ENV_NAME not in gym.registry:
    gym.register(ENV_NAME, entry_point=RobotEnv)


@register_env_backend("robot")
def _robot_backend(env_id: str, num_envs: int, seed: int | None, **kwargs: Any) -> VecEnv:
    """``make_env("robot:<spec>/<task>")``; the spec may be a packaged name or a YAML path."""
    spec, sep, task = env_id.rpartition("/")
    if not sep or not spec or not task:
        raise ValueError(
            f"make_env: robot env ids are '<spec>/<task>', e.g. 'robot:mock_arm/reach'; got 'robot:{env_id}'"
        )
    task_class(task)
    if load_spec(spec, kwargs.get("robot_overrides")).clock == "real" and num_envs != 1:
        raise ValueError(
            f"make_env: 'robot:{env_id}' is one real robot, so num_envs must be 1 (got {num_envs})"
        )
    vec = VecEnv(ENV_ID, num_envs, seed, robot=spec, task=task, **kwargs)
    vec.env_id = f"robot:{env_id}"
    return vec


__all__ = ["ENV_ID", "Intervention", "RobotEnv", "RobotEnvConfig", "TeleopIntervention", "action_layout"]
