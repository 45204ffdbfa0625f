"""Human in the loop on a :class:`~rlinf_nb.envs.robot_env.RobotEnv`: take over, hand back, mark.

Each step a :class:`HumanInTheLoop` decides who drives the robot:

* **the human**, while any source asks to: the robot's teleop device (``TeleopState.intervene``;
  keyboard, gamepad or leader arm on the robot's node), a notebook/dashboard command
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
    out[:3] = _EXPERTS[name](env)
    if env.config.gripper:
        out[-1] = 1.0
    return np.clip(out, -1.0, 1.0)


def _toward(env: RobotEnv, target: np.ndarray) -> np.ndarray:
    """Per-axis step toward ``target``, saturating at a full action (proportional, then clipped)."""
    return np.clip((np.asarray(target, float) - env.task.ee()) / env.config.max_ee_step, -1.0, 1.0)


@register_expert("reach")
def _reach_expert(env: RobotEnv) -> np.ndarray:
    return _toward(env, env.task.target)


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

    def __post_init__(self) -> None:
        if self.blend_steps < 0:
            raise SpecError(f"blend_steps must be >= 0, got {self.blend_steps}")


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
        self.commanded = False  # a take_over command is in force
        self.command_action: np.ndarray | None = None
        self.pending_mark: str | None = None
        self.last_human: np.ndarray | None = None
        self.blend_left = 0
        self.step_in_episode = 0
        self.driving = False  # the human drove the last step

    # -- inputs ------------------------------------------------------------------------------
    def command(self, cmd: Mapping[str, Any]) -> None:
        """Apply ``{"kind": "take_over" | "hand_back" | "action" | "mark", ...}`` from a notebook or dashboard.

        ``action`` carries ``"action": [..]`` (held until the next one; implies take over);
        ``mark`` carries ``"mark": "success" | "failure"``.
        """
        kind = cmd.get("kind")
        if kind not in COMMANDS:
            raise ValueError(f"human command kind {kind!r}: allowed values: {', '.join(COMMANDS)}")
        if kind == "take_over":
            self.commanded = True
        elif kind == "hand_back":
            self.commanded, self.command_action = False, None
        elif kind == "action":
            self.commanded = True
            self.command_action = np.asarray(cmd["action"], dtype=np.float64)
        else:
            mark = cmd.get("mark")
            if mark not in MARKS:
                raise ValueError(f"human mark {mark!r}: allowed values: {', '.join(MARKS)}")
            self.pending_mark = mark

    def reset(self, env: RobotEnv) -> None:
        """A new episode: the scripted schedule moves on; blending and marks do not carry over."""
        self.step_in_episode = 0
        self.blend_left = 0
        self.pending_mark = None
        self.driving = False
        if self.scripted is not None:
            self.scripted.new_episode()

    # -- the decision ------------------------------------------------------------------------
    def __call__(self, env: RobotEnv, agent_action: np.ndarray) -> HumanStep:
        human = self._human_action(env, agent_action)
        mark, self.pending_mark = self.pending_mark or self._teleop_mark(env), None
        self.step_in_episode += 1
        if human is not None:
            self.last_human, self.driving = human, True
            self.blend_left = self.config.blend_steps
            return HumanStep(human, 1.0, mark)
        self.driving = False
        if self.blend_left > 0 and self.last_human is not None:
            w = self.blend_left / (self.config.blend_steps + 1)
            self.blend_left -= 1
            return HumanStep(w * self.last_human + (1.0 - w) * agent_action, w, mark)
        return HumanStep(None, 0.0, mark)

    def _human_action(self, env: RobotEnv, agent_action: np.ndarray) -> np.ndarray | None:
        teleop = env.last_teleop.get(self.config.teleop) if self.config.teleop else None
        if teleop is not None and teleop.intervene:
            out = np.zeros_like(agent_action)
            out[:3] = teleop.action
            if env.config.gripper:
                out[-1] = agent_action[-1] if teleop.gripper is None else 2.0 * teleop.gripper - 1.0
            return out
        if self.commanded:
            if self.command_action is None:
                return np.zeros_like(agent_action)  # taken over, no key pressed yet: hold still
            out = np.zeros_like(agent_action)
            n = min(out.size, self.command_action.size)
            out[:n] = self.command_action[:n]
            return out
        if self.scripted is not None and self.scripted.wants(self.step_in_episode):
            return expert_action(env)
        return None

    def _teleop_mark(self, env: RobotEnv) -> str | None:
        teleop = env.last_teleop.get(self.config.teleop) if self.config.teleop else None
        if teleop is None:
            return None
        for mark in MARKS:
            if teleop.buttons.get(mark):
                return mark
        return None


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
    "expert_action",
    "register_expert",
]
