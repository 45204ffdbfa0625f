"""The ``mock`` driver: deterministic kinematics, a tiny world and a synthetic camera.

Shipped in the package for notebooks and tests; no hardware, no simulator, pure numpy.

- ``MockWorld`` (device ``mock_world``): a table at z = 0 with a pushable puck, a block
  with a hole, a peg held by the arm, and visual markers (``target``, ``goal``).
- ``MockArm``: a 4-joint arm (base yaw, then three pitch joints in one vertical plane)
  with exact forward kinematics and ideal position tracking (a command is reached at once).
- ``MockGripper``, ``MockHand``, ``MockBase``: ideal actuators.
- ``MockCamera``: a top-down render of the world (``[H, W, 3]`` uint8).
- ``MockScene``: object positions; ``place`` and ``reset`` for task resets.
- ``MockTeleop``: a keyboard-like device driven by ``press``/``release`` or a script.

Faults (``fault:`` in a component's config) make components misbehave on purpose, so
health checks can be tested: ``stuck`` arms ignore commands, ``black`` cameras see nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rlinf_nb.robots.components import (
    Arm,
    Camera,
    Device,
    Gripper,
    Hand,
    MobileBase,
    Scene,
    Teleop,
    TeleopState,
)
from rlinf_nb.robots.errors import SpecError
from rlinf_nb.robots.registry import register_device, register_driver

# -- the world ------------------------------------------------------------------------------


def _default_objects() -> dict[str, list[float]]:
    return {
        "target": [0.40, 0.10, 0.20],
        "puck": [0.35, -0.15, 0.02],
        "goal": [0.45, -0.05, 0.0],
        "hole": [0.30, 0.20, 0.05],
    }


@dataclass
class MockWorldConfig:
    """The mock world's geometry (metres)."""

    objects: dict[str, list[float]] = field(default_factory=_default_objects)
    """Start positions: ``target``/``goal`` are markers, ``puck`` is pushable, ``hole`` is the top of the block's hole."""
    puck_radius: float = 0.025
    """Radius of the puck."""
    puck_height: float = 0.04
    """Height of the puck; the end effector pushes it when below this."""
    pusher_radius: float = 0.015
    """Radius of the end effector when pushing."""
    peg_length: float = 0.05
    """The peg hangs this far below the end effector; object ``peg`` is its tip."""
    block_half_size: float = 0.05
    """Half the side of the square block around the hole."""

    def __post_init__(self) -> None:
        for name, pos in self.objects.items():
            if np.shape(pos) != (3,):
                raise SpecError(f"objects.{name}: expected [x, y, z], got {pos!r}")
        for name in ("puck_radius", "puck_height", "pusher_radius", "peg_length", "block_half_size"):
            if getattr(self, name) <= 0:
                raise SpecError(f"{name} must be > 0, got {getattr(self, name)}")


@register_device("mock_world")
class MockWorld(Device):
    """Shared state of mock components: arms, objects, a base pose."""

    config_class = MockWorldConfig

    def __init__(self, config: MockWorldConfig | None = None):
        super().__init__(config or MockWorldConfig())
        self.arms: list[MockArm] = []
        self.bases: list[MockBase] = []
        self.reset()

    def reset(self) -> None:
        """Every object back to its start position."""
        self.objects = {k: np.asarray(v, dtype=np.float64) for k, v in self.config.objects.items()}

    def ee_position(self) -> np.ndarray | None:
        return self.arms[0].ee_now() if self.arms else None

    def positions(self) -> dict[str, np.ndarray]:
        out = {k: v.copy() for k, v in self.objects.items()}
        ee = self.ee_position()
        if ee is not None:
            out["peg"] = ee - np.array([0.0, 0.0, self.config.peg_length])
        return out

    def after_arm_moved(self, arm: MockArm) -> None:
        """Kinematic pushing: an end effector below the puck's top pushes it out of contact."""
        if "puck" not in self.objects:
            return
        ee = arm.ee_now()
        cfg = self.config
        if ee[2] > cfg.puck_height:
            return
        puck = self.objects["puck"]
        d = puck[:2] - ee[:2]
        dist = float(np.linalg.norm(d))
        reach = cfg.puck_radius + cfg.pusher_radius
        if dist >= reach:
            return
        direction = d / dist if dist > 1e-9 else np.array([1.0, 0.0])
        puck[:2] = ee[:2] + direction * reach

    def advance(self, dt: float) -> None:
        for arm in self.arms:
            arm.advance(dt)
        for base in self.bases:
            base.integrate(dt)


class _MockComponent:
    device_class = MockWorld


# -- arm ------------------------------------------------------------------------------------


@dataclass
class MockArmConfig:
    """Geometry and start pose of the mock arm (radians, metres)."""

    base_height: float = 0.3
    """Height of the shoulder above the table."""
    link_lengths: list[float] = field(default_factory=lambda: [0.3, 0.25, 0.1])
    """Upper arm, forearm and hand lengths (one per pitch joint)."""
    home: list[float] = field(default_factory=lambda: [0.0, 0.6, -1.4, -0.8])
    """Joint positions at connect (base yaw, shoulder, elbow, wrist)."""
    joint_limits: list[list[float]] = field(
        default_factory=lambda: [[-2.6, 2.6], [-0.4, 2.2], [-2.6, 0.2], [-2.2, 2.2]]
    )
    """Hard limits ``[low, high]`` per joint."""
    speed: float | None = None
    """Joint speed (rad/s) at which targets are approached as world time passes; None: reached at once."""
    fault: str | None = None
    """Inject a fault: ``stuck`` (ignores commands). None: healthy."""

    def __post_init__(self) -> None:
        if self.speed is not None and self.speed <= 0:
            raise SpecError(f"speed must be > 0 rad/s (or null for ideal tracking), got {self.speed}")
        n = len(self.link_lengths) + 1
        if len(self.home) != n:
            raise SpecError(f"home: expected {n} joint positions (base yaw + one per link), got {self.home}")
        lim = np.asarray(self.joint_limits, dtype=np.float64)
        if lim.shape != (n, 2) or np.any(lim[:, 0] >= lim[:, 1]):
            raise SpecError(
                f"joint_limits: expected {n} pairs [low, high] with low < high, got {self.joint_limits}"
            )
        if self.fault not in (None, "stuck"):
            raise SpecError(f"fault: {self.fault!r} is not a fault; allowed: null, 'stuck'")


@register_driver("mock")
class MockArm(Arm):
    """Base yaw + planar pitch chain with exact FK; commands are reached at once.

    Works alone; with a ``mock_world`` device it pushes the puck and shows in the camera.
    """

    config_class = MockArmConfig
    joint_unit = "rad"

    def __init__(self, config: MockArmConfig | None = None, device: MockWorld | None = None):
        super().__init__(config or MockArmConfig(), device)
        self._q = np.asarray(self.config.home, dtype=np.float64)
        self._target = self._q.copy()
        self.sent: list[np.ndarray] = []  # every command that reached the "motors" (for tests)
        if device is not None:
            device.arms.append(self)

    @property
    def joint_names(self) -> tuple[str, ...]:
        return ("base_yaw",) + tuple(f"pitch_{i}" for i in range(1, len(self.config.link_lengths) + 1))

    @property
    def joint_limits(self) -> np.ndarray:
        return np.asarray(self.config.joint_limits, dtype=np.float64)

    @property
    def has_kinematics(self) -> bool:
        return True

    def link_points(self, q: np.ndarray) -> np.ndarray:
        """``[k+2, 3]`` positions of the base, shoulder, each joint after it and the end effector."""
        q = np.asarray(q, dtype=np.float64)
        yaw, pitches = q[0], np.cumsum(q[1:])
        r = np.concatenate([[0.0], np.cumsum(np.asarray(self.config.link_lengths) * np.cos(pitches))])
        z = self.config.base_height + np.concatenate(
            [[0.0], np.cumsum(np.asarray(self.config.link_lengths) * np.sin(pitches))]
        )
        pts = np.stack([r * np.cos(yaw), r * np.sin(yaw), z], axis=-1)
        return np.concatenate([[[0.0, 0.0, 0.0]], pts])

    def forward_kinematics(self, q: np.ndarray) -> np.ndarray:
        return self.link_points(q)[-1]

    def ee_now(self) -> np.ndarray:
        return self.forward_kinematics(self._q)

    def _connect(self) -> None:
        if self.config.speed is not None and self.device is None:
            raise SpecError("mock arm: config.speed needs a mock_world device (world time moves the joints)")
        self._q = np.asarray(self.config.home, dtype=np.float64)
        self._target = self._q.copy()

    def _read(self) -> dict[str, np.ndarray]:
        return {"joint_pos": self._q.astype(np.float32), "ee_pos": self.ee_now().astype(np.float32)}

    def advance(self, dt: float) -> None:
        """Move towards the target at ``speed`` for ``dt`` seconds (speed-limited arms only)."""
        if self.config.speed is None or not self._connected:
            return
        step = self.config.speed * dt
        self._q = self._q + np.clip(self._target - self._q, -step, step)
        self.device.after_arm_moved(self)

    def joint_positions(self) -> np.ndarray:
        self._require_connected("read")
        return self._q.copy()

    def _send(self, action: np.ndarray) -> np.ndarray:
        lim = self.joint_limits
        q = np.clip(action, lim[:, 0], lim[:, 1])
        self.sent.append(q.copy())
        if self.config.fault == "stuck":
            return q
        self._target = q
        if self.config.speed is None:
            self._q = q
            if self.device is not None:
                self.device.after_arm_moved(self)
        return q

    @property
    def can_teleport(self) -> bool:
        return True

    def teleport(self, q: np.ndarray) -> None:
        lim = self.joint_limits
        self._q = np.clip(np.asarray(q, dtype=np.float64), lim[:, 0], lim[:, 1])
        self._target = self._q.copy()


# -- gripper, hand, base --------------------------------------------------------------------


@dataclass
class MockGripperConfig:
    """Mock gripper."""

    start: float = 1.0
    """Opening at connect, in [0, 1] (1 open)."""


@register_driver("mock")
class MockGripper(Gripper):
    config_class = MockGripperConfig

    def __init__(self, config: MockGripperConfig | None = None, device: Device | None = None):
        super().__init__(config or MockGripperConfig(), device)
        self._pos = float(self.config.start)

    def _connect(self) -> None:
        self._pos = float(self.config.start)

    def _read(self) -> dict[str, np.ndarray]:
        return {"pos": np.array([self._pos], dtype=np.float32)}

    def _send(self, action: np.ndarray) -> np.ndarray:
        self._pos = float(action[0])
        return action


@dataclass
class MockHandConfig:
    """Mock multi-finger hand."""

    fingers: list[str] = field(default_factory=lambda: ["thumb", "index", "middle", "ring", "little"])
    """Finger joint names (one closure value in [0, 1] each)."""


@register_driver("mock")
class MockHand(Hand):
    config_class = MockHandConfig

    def __init__(self, config: MockHandConfig | None = None, device: Device | None = None):
        super().__init__(config or MockHandConfig(), device)
        self._q = np.zeros(len(self.config.fingers))

    @property
    def finger_names(self) -> tuple[str, ...]:
        return tuple(self.config.fingers)

    def _read(self) -> dict[str, np.ndarray]:
        return {"finger_pos": self._q.astype(np.float32)}

    def _send(self, action: np.ndarray) -> np.ndarray:
        self._q = action.copy()
        return action


@dataclass
class MockBaseConfig:
    """Mock planar base."""

    max_speed: list[float] = field(default_factory=lambda: [0.5, 0.5, 1.0])
    """Largest |vx|, |vy| (m/s) and |wz| (rad/s); commands are clipped to it."""


@register_driver("mock")
class MockBase(_MockComponent, MobileBase):
    """Integrates body-frame velocity commands into an odometry pose on every world tick."""

    config_class = MockBaseConfig

    def __init__(self, config: MockBaseConfig | None = None, device: MockWorld | None = None):
        super().__init__(config or MockBaseConfig(), device)
        self._pose = np.zeros(3)
        self._vel = np.zeros(3)
        if device is None:
            raise SpecError("mock mobile_base: needs a mock_world device (spec key 'device')")
        device.bases.append(self)

    def _connect(self) -> None:
        self._pose, self._vel = np.zeros(3), np.zeros(3)

    def _read(self) -> dict[str, np.ndarray]:
        return {"pose": self._pose.astype(np.float32), "velocity": self._vel.astype(np.float32)}

    def _send(self, action: np.ndarray) -> np.ndarray:
        cap = np.asarray(self.config.max_speed, dtype=np.float64)
        self._vel = np.clip(action, -cap, cap)
        return self._vel.copy()

    def integrate(self, dt: float) -> None:
        if not self._connected:
            return
        x, y, yaw = self._pose
        vx, vy, wz = self._vel
        c, s = np.cos(yaw), np.sin(yaw)
        self._pose = np.array([x + (c * vx - s * vy) * dt, y + (s * vx + c * vy) * dt, yaw + wz * dt])


# -- camera ---------------------------------------------------------------------------------


@dataclass
class MockCameraConfig:
    """Top-down synthetic camera over the table."""

    width: int = 64
    """Image width (pixels)."""
    height: int = 64
    """Image height (pixels)."""
    x_range: list[float] = field(default_factory=lambda: [0.05, 0.75])
    """Table x (m) seen from the bottom to the top row."""
    y_range: list[float] = field(default_factory=lambda: [-0.35, 0.35])
    """Table y (m) seen from the right to the left column (+y shows on the left, looking down along -z)."""
    fault: str | None = None
    """Inject a fault: ``black`` (all-zero frames). None: healthy."""

    def __post_init__(self) -> None:
        if self.width < 8 or self.height < 8:
            raise SpecError(f"width/height must be >= 8 pixels, got {self.width}x{self.height}")
        if self.fault not in (None, "black"):
            raise SpecError(f"fault: {self.fault!r} is not a fault; allowed: null, 'black'")


_COLORS = {
    "table": (196, 186, 166),
    "block": (120, 120, 130),
    "hole": (30, 30, 35),
    "goal": (60, 170, 80),
    "target": (60, 180, 220),
    "puck": (210, 50, 40),
    "link": (40, 60, 150),
    "ee": (240, 200, 40),
}


@register_driver("mock")
class MockCamera(_MockComponent, Camera):
    config_class = MockCameraConfig

    def __init__(self, config: MockCameraConfig | None = None, device: MockWorld | None = None):
        super().__init__(config or MockCameraConfig(), device)
        h, w = self.config.height, self.config.width
        self._rows, self._cols = np.mgrid[0:h, 0:w]
        self.frames = 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.config.height, self.config.width, 3)

    def _pixel(self, p: np.ndarray) -> tuple[float, float]:
        (x0, x1), (y0, y1) = self.config.x_range, self.config.y_range
        row = (x1 - p[0]) / (x1 - x0) * self.config.height
        col = (y1 - p[1]) / (y1 - y0) * self.config.width
        return row, col

    def _metres_to_px(self, r: float) -> float:
        (x0, x1) = self.config.x_range
        return r / (x1 - x0) * self.config.height

    def _disc(self, img: np.ndarray, p: np.ndarray, radius_px: float, color: tuple[int, int, int]) -> None:
        row, col = self._pixel(p)
        mask = (self._rows + 0.5 - row) ** 2 + (self._cols + 0.5 - col) ** 2 <= max(radius_px, 0.7) ** 2
        img[mask] = color

    def render(self) -> np.ndarray:
        world: MockWorld = self.device
        cfg = world.config
        img = np.empty(self.image_shape, dtype=np.uint8)
        img[:] = _COLORS["table"]
        objs = world.objects
        if "hole" in objs:
            row, col = self._pixel(objs["hole"])
            half = self._metres_to_px(cfg.block_half_size)
            mask = (np.abs(self._rows + 0.5 - row) <= half) & (np.abs(self._cols + 0.5 - col) <= half)
            img[mask] = _COLORS["block"]
            self._disc(img, objs["hole"], self._metres_to_px(0.012), _COLORS["hole"])
        if "goal" in objs:
            self._disc(img, objs["goal"], self._metres_to_px(cfg.puck_radius), _COLORS["goal"])
        if "target" in objs:
            self._disc(img, objs["target"], 1.5, _COLORS["target"])
        if "puck" in objs:
            self._disc(img, objs["puck"], self._metres_to_px(cfg.puck_radius), _COLORS["puck"])
        for arm in world.arms:
            pts = arm.link_points(arm._q)
            for a, b in zip(pts[:-1], pts[1:], strict=True):
                for t in np.linspace(0.0, 1.0, 12):
                    self._disc(img, a + t * (b - a), 0.8, _COLORS["link"])
            ee = pts[-1]
            self._disc(img, ee, 1.5 + 3.0 * float(np.clip(ee[2] / 0.4, 0, 1)), _COLORS["ee"])
        return img

    def _read(self) -> dict[str, np.ndarray]:
        self.frames += 1
        if self.config.fault == "black":
            return {"rgb": np.zeros(self.image_shape, dtype=np.uint8)}
        return {"rgb": self.render()}


# -- scene ----------------------------------------------------------------------------------


@register_driver("mock")
class MockScene(_MockComponent, Scene):
    """Object positions of the mock world (``peg`` is the tip of the peg the arm holds)."""

    @property
    def object_names(self) -> tuple[str, ...]:
        names = tuple(self.device.config.objects)
        return names + ("peg",)

    def _read(self) -> dict[str, np.ndarray]:
        return self.device.positions()

    @property
    def can_place(self) -> bool:
        return True

    def place(self, name: str, position: np.ndarray) -> None:
        if name not in self.device.objects:
            raise ValueError(
                f"{self._label}: cannot place {name!r}; placeable: {', '.join(self.device.objects)}"
            )
        self.device.objects[name] = np.asarray(position, dtype=np.float64).copy()

    def reset(self) -> None:
        self.device.reset()


# -- teleop ---------------------------------------------------------------------------------

#: key -> (axis, sign) of the end-effector motion it requests
KEYMAP = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "r": (2, 1.0), "f": (2, -1.0)}
BUTTONS = {"space": "estop", "t": "intervene", "o": "open", "c": "close", "y": "success", "n": "failure"}


@dataclass
class MockTeleopConfig:
    """A keyboard-like teleop: keys w/s a/d r/f move x/y/z, space e-stops, t toggles take-over."""

    script: list[dict] = field(default_factory=list)
    """Events by poll index: ``{at: 3, press: "w"}``, ``{at: 5, release: "w"}``, ``{at: 9, tap: "space"}``."""

    def __post_init__(self) -> None:
        keys = set(KEYMAP) | set(BUTTONS)
        for i, ev in enumerate(self.script):
            if not isinstance(ev, dict) or "at" not in ev:
                raise SpecError(f"script[{i}]: expected a mapping with 'at', got {ev!r}")
            verbs = set(ev) - {"at"}
            if len(verbs) != 1 or not verbs <= {"press", "release", "tap"}:
                raise SpecError(f"script[{i}]: one of press/release/tap expected, got {sorted(verbs)}")
            key = ev[verbs.pop()]
            if key not in keys:
                raise SpecError(f"script[{i}]: unknown key {key!r}; keys: {sorted(keys)}")


@register_driver("mock")
class MockTeleop(Teleop):
    """Keyboard-like: ``press``/``release``/``tap`` keys from code, or a script by poll index."""

    config_class = MockTeleopConfig

    def __init__(self, config: MockTeleopConfig | None = None, device: Device | None = None):
        super().__init__(config or MockTeleopConfig(), device)
        self._reset()

    def _reset(self) -> None:
        self._held: set[str] = set()
        self._taps: set[str] = set()
        self._intervene = False
        self._polls = 0

    def _connect(self) -> None:
        self._reset()

    def press(self, key: str) -> None:
        self._check_key(key)
        if key == "t" and "t" not in self._held:
            self._intervene = not self._intervene
        self._held.add(key)

    def release(self, key: str) -> None:
        self._held.discard(key)

    def tap(self, key: str) -> None:
        """Press and release before the next poll (seen by exactly one poll)."""
        self.press(key)
        self._taps.add(key)

    def _check_key(self, key: str) -> None:
        if key not in KEYMAP and key not in BUTTONS:
            raise ValueError(f"mock teleop: unknown key {key!r}; keys: {sorted(KEYMAP) + sorted(BUTTONS)}")

    def _poll(self) -> TeleopState:
        for ev in self.config.script:
            if ev["at"] == self._polls:
                if "press" in ev:
                    self.press(ev["press"])
                elif "release" in ev:
                    self.release(ev["release"])
                else:
                    self.tap(ev["tap"])
        self._polls += 1
        action = np.zeros(3)
        for key in self._held:
            if key in KEYMAP:
                axis, sign = KEYMAP[key]
                action[axis] += sign
        buttons = {name: key in self._held for key, name in BUTTONS.items()}
        gripper = 1.0 if buttons["open"] else 0.0 if buttons["close"] else None
        state = TeleopState(
            action=np.clip(action, -1, 1),
            gripper=gripper,
            intervene=self._intervene,
            estop=buttons["estop"],
            buttons=buttons,
        )
        for key in self._taps:
            self.release(key)
        self._taps.clear()
        return state


__all__ = [
    "MockArm",
    "MockBase",
    "MockCamera",
    "MockGripper",
    "MockHand",
    "MockScene",
    "MockTeleop",
    "MockWorld",
]
