"""Human in the loop on a :class:`~rlinf_nb.envs.robot_env.RobotEnv`: take over, hand back, mark.

Each step a :class:`HumanInTheLoop` decides who drives the robot:

* **the human**, while any source asks to: the robot's teleop device (``TeleopState.intervene``;
  keyboard, gamepad or leader arm on the robot's node; a leader arm's joints are tracked in
  ``joint_delta`` envs, see :func:`teleop_arm_action`), a notebook/dashboard command
  (:meth:`HumanInTheLoop.command`: ``take_over`` then ``action`` messages until ``hand_back``), or
  a :class:`ScriptedHuman` that takes over on a schedule with the task's scripted expert;
* **a blend** for ``blend_steps`` steps after the human lets go: the applied action is
  ``w * last_human + (1 - w) * agent`` with ``w`` falling linearly to 0, so the arm does not jump;
* **the agent** otherwise.

The env reports ``info["intervened"]`` (the human drove this step: these transitions are
demonstrations), ``info["human_weight"]`` (``w`` in [0, 1]) and ``info["applied_action"]``
(what was really sent, which is what an off-policy learner must store). A ``success`` or
``failure`` mark (a command, or the teleop buttons of those names) ends the episode at once
with ``success_reward`` / ``failure_reward``.

**Per arm** on multi-arm robots (``bireach`` on ``mock_bimanual``): ``take_over`` / ``action`` /
``hand_back`` with ``"arm": "left/arm"`` act on that arm's slice of the action only (the policy
keeps the others), ``scripted_arms`` gives a scripted schedule per arm, and each arm blends back
on its own. ``info["intervened_arms"]`` / ``info["arm_weights"]`` / ``info["human_mask"]`` say
per arm (per action dim) who drove; ``intervened`` is "a human drove some arm".

Built from a dict in env configs (``env.kwargs.human: {blend_steps: 5, scripted: {every: 2}}``)
so runs on the cluster carry it to the env workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_nb.robots.errors import SpecError
from rlinf_nb.robots.registry import build_config

if TYPE_CHECKING:
    from rlinf_nb.envs.robot_env import RobotEnv
    from rlinf_nb.robots.components import TeleopState

MARKS = ("success", "failure")
COMMANDS = ("take_over", "hand_back", "action", "mark")


@dataclass
class HumanStep:
    """Who drives this step."""

    action: np.ndarray | None
    """The action to apply in [-1, 1] (human or blend); None lets the agent's action through."""
    weight: float = 0.0
    """The human's share of the applied action: 1 = the human drives, 0 < w < 1 = handing back."""
    mark: str | None = None
    """``"success"`` or ``"failure"``: end the episode now with that outcome."""
    arm_weights: dict[str, float] | None = None
    """The human's share per arm path (multi-arm take-over); None: ``weight`` on every arm."""


# -- scripted experts: what a scripted human does on each task --------------------------------------

_EXPERTS: dict[str, Callable[[RobotEnv], np.ndarray]] = {}


def register_expert(task: str) -> Callable:
    """Decorator: ``fn(env) -> action in [-1, 1]`` is the scripted expert of ``task``."""

    def decorator(fn: Callable[[RobotEnv], np.ndarray]) -> Callable[[RobotEnv], np.ndarray]:
        _EXPERTS[task] = fn
        return fn

    return decorator


def expert_action(env: RobotEnv) -> np.ndarray:
    """The scripted expert's action for ``env``'s task (ee_delta envs)."""
    name = env.task.name
    if name not in _EXPERTS:
        raise SpecError(
            f"no scripted expert for task {name!r}; experts exist for: {', '.join(sorted(_EXPERTS))}"
        )
    if env.config.action_mode != "ee_delta":
        raise SpecError(
            f"the scripted expert of {name!r} needs action_mode 'ee_delta', not {env.config.action_mode!r}"
        )
    out = np.zeros(env.action_space.shape, np.float64)
    arm_part = np.asarray(_EXPERTS[name](env), np.float64).reshape(-1)  # x, y, z per arm, arms in order
    out[: arm_part.size] = arm_part
    if env.config.gripper:
        out[-1] = 1.0
    return np.clip(out, -1.0, 1.0)


def _toward(env: RobotEnv, target: np.ndarray, ee: np.ndarray | None = None) -> np.ndarray:
    """Per-axis step from ``ee`` (default: the task's end effector) toward ``target``, saturating at a
    full action (proportional, then clipped)."""
    ee = env.task.ee() if ee is None else ee
    return np.clip((np.asarray(target, float) - ee) / env.config.max_ee_step, -1.0, 1.0)


@register_expert("reach")
def _reach_expert(env: RobotEnv) -> np.ndarray:
    return _toward(env, env.task.target)


@register_expert("bireach")
def _bireach_expert(env: RobotEnv) -> np.ndarray:
    """Every arm straight to its own target (one x, y, z block per arm)."""
    return np.concatenate(
        [_toward(env, t, ee) for t, ee in zip(env.task.targets, env.task.ees(), strict=True)]
    )


@register_expert("push")
def _push_expert(env: RobotEnv) -> np.ndarray:
    """Go behind the puck (on the far side from the goal), then push it toward the goal."""
    puck = env.task.scene.position("puck")
    goal = env.task.goal
    direction = (goal - puck)[:2]
    direction = direction / max(float(np.linalg.norm(direction)), 1e-9)
    behind = np.array([*(puck[:2] - 0.04 * direction), puck[2]])
    ee = env.task.ee()
    off_line = np.linalg.norm((ee - behind)[:2])
    if off_line > 0.015 and np.dot((ee - puck)[:2], direction) > -0.02:
        # Not behind the puck yet: go around it, above the table first.
        return _toward(env, np.array([*behind[:2], puck[2] + 0.05 if off_line > 0.03 else puck[2]]))
    return _toward(env, np.array([*(goal[:2] + 0.01 * direction), puck[2]]))


@register_expert("insert")
def _insert_expert(env: RobotEnv) -> np.ndarray:
    """Bring the peg tip 3 cm above the hole, then (once within 3 mm in x-y) straight down into it."""
    hole, tip = env.task.hole, env.task.scene.position("peg")
    if float(np.linalg.norm((hole - tip)[:2])) > 0.003:
        return _toward(env, hole + np.array([0.0, 0.0, 0.03]), tip)
    return _toward(env, np.array([hole[0], hole[1], hole[2] - env.task.config.depth - 0.01]), tip)


# -- the scripted human --------------------------------------------------------------------------------


@dataclass
class ScriptedHumanConfig:
    """A human who takes over on a fixed schedule and drives with the task's scripted expert."""

    every: int = 2
    """Intervene in one episode out of ``every`` (episodes 0, every, 2*every, ...)."""
    start: int = 0
    """First step of the episode the human drives."""
    steps: int = 10
    """How many steps the human drives each time."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise SpecError(f"scripted.every must be >= 1, got {self.every}")
        if self.start < 0 or self.steps < 1:
            raise SpecError(
                f"scripted.start must be >= 0 and scripted.steps >= 1, got {self.start}, {self.steps}"
            )


class ScriptedHuman:
    """Takes over in steps ``[start, start + steps)`` of every ``every``-th episode."""

    def __init__(self, config: ScriptedHumanConfig):
        self.config = config
        self.episode = -1

    def new_episode(self) -> None:
        self.episode += 1

    def wants(self, step: int) -> bool:
        c = self.config
        return self.episode % c.every == 0 and c.start <= step < c.start + c.steps


# -- the decision -----------------------------------------------------------------------------------


@dataclass
class HumanConfig:
    """How a human shares control of a RobotEnv."""

    teleop: str | None = "teleop"
    """Path of the teleop device whose "intervene" takes over (ignored when the robot has none)."""
    blend_steps: int = 5
    """Steps over which control is handed back to the agent (0 = at once)."""
    success_reward: float = 1.0
    """Reward of the step a human marks as a success."""
    failure_reward: float = 0.0
    """Reward of the step a human marks as a failure."""
    scripted: dict[str, Any] | None = None
    """A :class:`ScriptedHumanConfig` as a dict: a scripted human who intervenes on a schedule."""
    scripted_arms: dict[str, dict[str, Any]] | None = None
    """Per arm path (multi-arm robots), a :class:`ScriptedHumanConfig` dict: that arm's own schedule;
    the scripted expert drives only that arm's slice of the action."""
    teleop_arm: str | None = None
    """Arm path the teleop device drives on a multi-arm robot; None = the first arm."""

    def __post_init__(self) -> None:
        if self.blend_steps < 0:
            raise SpecError(f"blend_steps must be >= 0, got {self.blend_steps}")


@dataclass
class _ArmControl:
    """One arm's share of the human's control (the whole action on single-arm robots)."""

    commanded: bool = False
    """A take_over command is in force on this arm."""
    command_action: np.ndarray | None = None
    """The commanded action of this arm's slice (held until the next one)."""
    last_human: np.ndarray | None = None
    """The human's last action on this slice (what hand-back blends from)."""
    blend_left: int = 0
    """Blend steps left after the human let go."""
    driving: bool = False
    """A human drove this arm in the last step."""


def blend_weight(blend_left: int, blend_steps: int) -> float:
    """The human's share while handing back: ``blend_left / (blend_steps + 1)`` (falls linearly to 0)."""
    return blend_left / (blend_steps + 1)


def compose_action(agent: np.ndarray, human: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per action dim: ``w * human + (1 - w) * agent`` (``w = 1``: the human's, ``w = 0``: the agent's)."""
    return weights * human + (1.0 - weights) * agent


class HumanInTheLoop:
    """The ``intervention`` of a RobotEnv: merges teleop, commands and a scripted human (see module doc)."""

    def __init__(self, config: HumanConfig | Mapping[str, Any] | None = None):
        if not isinstance(config, HumanConfig):
            config = build_config(HumanConfig, dict(config or {}), "human")
        self.config = config
        self.scripted = (
            ScriptedHuman(build_config(ScriptedHumanConfig, dict(config.scripted), "human.scripted"))
            if config.scripted is not None
            else None
        )
        self.scripted_arms = {
            path: ScriptedHuman(build_config(ScriptedHumanConfig, dict(c), f"human.scripted_arms.{path}"))
            for path, c in (config.scripted_arms or {}).items()
        }
        self.layout: dict[str, slice] | None = None  # arm path -> action slice (bind)
        self.arms: dict[str, _ArmControl] = {}
        self.pending_mark: str | None = None
        self.step_in_episode = 0
        self.driving = False  # the human drove the last step (some arm)

    def bind(self, layout: Mapping[str, slice]) -> None:
        """Learn the env's action layout (arm path -> slice); checks the per-arm config against it."""
        self.layout = dict(layout)
        self.arms = {path: _ArmControl() for path in self.layout}
        for key, paths in (("human.scripted_arms", list(self.scripted_arms)),
                           ("human.teleop_arm", [self.config.teleop_arm] if self.config.teleop_arm else [])):  # fmt: skip
            for path in paths:
                self._check_arm(key, path)

    def _check_arm(self, key: str, arm: Any) -> str:
        if self.layout is None:
            raise SpecError(f"{key}: this human in the loop is not bound to an env yet (RobotEnv binds it)")
        if arm not in self.layout:
            raise SpecError(f"{key}: {arm!r} is not an arm of this env; arms: {', '.join(self.layout)}")
        return arm

    @property
    def commanded(self) -> bool:
        """A take_over command is in force on some arm."""
        return any(c.commanded for c in self.arms.values())

    def arm_modes(self) -> dict[str, tuple[str, float]]:
        """Per arm path: ``("human" | "blending" | "agent", the human's share now)``."""
        out = {}
        for path, c in self.arms.items():
            if c.commanded or c.driving:
                out[path] = ("human", 1.0)
            elif c.blend_left > 0 and c.last_human is not None:
                out[path] = ("blending", blend_weight(c.blend_left, self.config.blend_steps))
            else:
                out[path] = ("agent", 0.0)
        return out

    def mode(self) -> tuple[str, float]:
        """The env's mode: ``human`` if a human drives some arm, else ``blending`` if one is handing back."""
        if self.commanded or self.driving:
            return "human", 1.0
        modes = self.arm_modes().values()
        blending = [w for m, w in modes if m == "blending"]
        return ("blending", max(blending)) if blending else ("agent", 0.0)

    # -- inputs ------------------------------------------------------------------------------
    def command(self, cmd: Mapping[str, Any]) -> None:
        """Apply ``{"kind": "take_over" | "hand_back" | "action" | "mark", ...}`` from a notebook or dashboard.

        ``action`` carries ``"action": [..]`` (held until the next one; implies take over);
        ``mark`` carries ``"mark": "success" | "failure"``. ``"arm": "<path>"`` (optional) limits
        take_over / action / hand_back to that arm's slice; without it they act on every arm (an
        ``action`` then covers the whole vector).
        """
        kind = cmd.get("kind")
        if kind not in COMMANDS:
            raise ValueError(f"human command kind {kind!r}: allowed values: {', '.join(COMMANDS)}")
        arm = cmd.get("arm")
        if arm is not None and kind == "mark":
            raise ValueError("human command 'mark': a mark ends the whole episode; it takes no arm")
        if self.layout is None:
            raise SpecError(
                "human command: this human in the loop is not bound to an env yet (RobotEnv binds it)"
            )
        paths = list(self.layout) if arm is None else [self._check_arm(f"human command {kind!r}: arm", arm)]
        if kind == "take_over":
            for p in paths:
                self.arms[p].commanded = True
        elif kind == "hand_back":
            for p in paths:
                self.arms[p].commanded, self.arms[p].command_action = False, None
        elif kind == "action":
            action = np.asarray(cmd["action"], dtype=np.float64).reshape(-1)
            offset = self.layout[paths[0]].start  # a whole-vector action starts at 0; an arm's at its slice
            for p in paths:
                sl = self.layout[p]
                part = np.zeros(sl.stop - sl.start)
                chunk = action[sl.start - offset : sl.stop - offset]
                part[: chunk.size] = chunk
                self.arms[p].commanded, self.arms[p].command_action = True, part
        else:
            mark = cmd.get("mark")
            if mark not in MARKS:
                raise ValueError(f"human mark {mark!r}: allowed values: {', '.join(MARKS)}")
            self.pending_mark = mark

    def reset(self, env: RobotEnv) -> None:
        """A new episode: the scripted schedule moves on; blending and marks do not carry over."""
        self.step_in_episode = 0
        for control in self.arms.values():
            control.blend_left, control.driving = 0, False
        self.pending_mark = None
        self.driving = False
        for scripted in [self.scripted, *self.scripted_arms.values()]:
            if scripted is not None:
                scripted.new_episode()

    # -- the decision ------------------------------------------------------------------------
    def __call__(self, env: RobotEnv, agent_action: np.ndarray) -> HumanStep:
        if self.layout is None:
            self.bind(getattr(env, "action_layout", None) or {"arm": slice(0, agent_action.size)})
        human, driven = self._human_action(env, agent_action)
        mark, self.pending_mark = self.pending_mark or self._teleop_mark(env), None
        self.step_in_episode += 1
        weights = np.zeros_like(agent_action)
        source = np.zeros_like(agent_action)  # the human's (or last human) action where weights > 0
        arm_weights: dict[str, float] = {}
        for path, control in self.arms.items():
            sl = self.layout[path]
            control.driving = path in driven
            if path in driven:
                control.last_human, control.blend_left, w = human[sl].copy(), self.config.blend_steps, 1.0
            elif control.blend_left > 0 and control.last_human is not None:
                w = blend_weight(control.blend_left, self.config.blend_steps)
                control.blend_left -= 1
            else:
                w = 0.0
            arm_weights[path] = w
            weights[sl] = w
            if w > 0:
                source[sl] = control.last_human
        self.driving = bool(driven)
        top = max(arm_weights.values(), default=0.0)
        if top == 0.0:
            return HumanStep(None, 0.0, mark, arm_weights)
        return HumanStep(compose_action(agent_action, source, weights), top, mark, arm_weights)

    def _human_action(self, env: RobotEnv, agent_action: np.ndarray) -> tuple[np.ndarray, set[str]]:
        """The human's proposed action (full vector) and the arms a human drives this step.

        Per arm, the first source that wants it: the teleop (its arm), a take_over command, the
        whole-robot scripted schedule, that arm's own scripted schedule.
        """
        assert self.layout is not None
        out = np.zeros_like(agent_action)
        driven: set[str] = set()
        teleop = env.last_teleop.get(self.config.teleop) if self.config.teleop else None
        if teleop is not None and teleop.intervene:
            path = self.config.teleop_arm or next(iter(self.layout))
            start = self.layout[path].start
            part = teleop_arm_action(env, teleop, path)
            out[start : start + part.size] = part
            if env.config.gripper:
                out[-1] = agent_action[-1] if teleop.gripper is None else 2.0 * teleop.gripper - 1.0
            driven.add(path)
        step = self.step_in_episode
        expert: np.ndarray | None = None
        for path, control in self.arms.items():
            if path in driven:
                continue
            sl = self.layout[path]
            if control.commanded:  # taken over, no key pressed yet: hold still
                out[sl] = 0.0 if control.command_action is None else control.command_action
                driven.add(path)
            elif any(s is not None and s.wants(step) for s in (self.scripted, self.scripted_arms.get(path))):
                expert = expert_action(env) if expert is None else expert
                out[sl] = expert[sl]
                driven.add(path)
        return out, driven

    def _teleop_mark(self, env: RobotEnv) -> str | None:
        teleop = env.last_teleop.get(self.config.teleop) if self.config.teleop else None
        if teleop is None:
            return None
        for mark in MARKS:
            if teleop.buttons.get(mark):
                return mark
        return None


def teleop_arm_action(env: RobotEnv, state: TeleopState, path: str | None = None) -> np.ndarray:
    """The arm part (gripper excluded) of the action a teleop asks of the arm at ``path`` (None: the first).

    End-effector devices (keyboard, gamepad): ``state.action`` (x, y, z in [-1, 1]). A leader arm
    (``state.joints``) in a ``joint_delta`` env: the step toward the leader's joints,
    ``(leader - follower) / max_joint_step`` clipped to [-1, 1], so the follower tracks the leader at
    most ``max_joint_step`` per step; in an ``ee_delta`` env a leader asks for no motion (``action``).
    """
    if state.joints is None or env.config.action_mode != "joint_delta":
        return np.asarray(state.action, dtype=np.float64)
    path = path or next(iter(env.arms))
    arm = env.arms[path]
    missing = [j for j in arm.joint_names if j not in state.joints]
    if missing:
        raise SpecError(
            f"teleop joints {sorted(state.joints)} do not cover arm {path!r} joints {list(arm.joint_names)} "
            f"(missing {missing}): pair a leader arm with a follower of the same joints"
        )
    target = np.array([state.joints[j] for j in arm.joint_names], dtype=np.float64)
    return np.clip((target - arm.joint_positions()) / env.config.max_joint_step, -1.0, 1.0)


def as_human_step(decision: Any) -> HumanStep:
    """An intervention's return value as a :class:`HumanStep` (a bare array means "the human drives")."""
    if decision is None:
        return HumanStep(None)
    if isinstance(decision, HumanStep):
        return decision
    return HumanStep(np.asarray(decision, dtype=np.float64), 1.0)


__all__ = [
    "COMMANDS",
    "MARKS",
    "HumanConfig",
    "HumanInTheLoop",
    "HumanStep",
    "ScriptedHuman",
    "ScriptedHumanConfig",
    "as_human_step",
    "blend_weight",
    "compose_action",
    "expert_action",
    "register_expert",
    "teleop_arm_action",
]
