"""The ``sim`` driver: a Panda arm, its gripper, cameras and objects in a ManiSkill 3 scene.

One ManiSkill scene is one :class:`SimWorld` device (``driver: maniskill``), owned by the
robot; the ``sim`` components on it read and command that scene::

    devices:
      sim: {driver: maniskill, config: {robot: panda}}
    components:
      arm:        {kind: arm, driver: sim, device: sim, safety: {max_delta: 0.1}}
      gripper:    {kind: gripper, driver: sim, device: sim}
      cams/front: {kind: camera, driver: sim, device: sim, config: {name: front}}
      scene:      {kind: scene, driver: sim, device: sim}

The scene is ManiSkill's table (top at z = 0) with a Panda on it, a pushable 4 cm cube
(object ``puck``), a goal disc (``goal``) and a target sphere (``target``); the last two are
visual markers without collision. The insert task adds (before the scene is built: ``SimScene.add_objects``)
a socket fixture (``hole``: four kinematic boxes round a square hole, standing on the table up to the
hole's top) and a square peg (``peg``, its tip) tied rigidly below the TCP by a drive with zero limits,
so the socket's walls really stop a misaligned peg; other tasks' scenes do not build them. Every position a component reads or takes is in the robot
frame (metres): the Panda's base frame with its origin moved to the device's ``origin``
(``sim_panda`` puts it 10 cm in front of the base, where the tasks' default workspaces suit the
Panda), so the tasks written for the mock arm run on it unchanged.

- ``SimArm``: the Panda's 7 joints (rad), commanded through ManiSkill's ``pd_joint_pos``
  controller (absolute joint targets for the PD drives). ``read()`` gives the simulated
  joint positions and the TCP position; forward kinematics and the Jacobian come from the
  simulated robot's own kinematic model (Pinocchio, through SAPIEN).
- ``SimGripper``: opening in [0, 1] (1 open), the fingers' PD target.
- ``SimCamera``: a fixed camera looking at the table, or the wrist camera of
  ``robot: panda_wristcam``; ``[H, W, 3]`` uint8 frames rendered when read.
- ``SimScene``: object positions; ``place`` and ``reset`` for task resets.

Time passes only in ``robot.tick()``: ``send`` sets targets, and each tick runs the ManiSkill
control steps of its ``dt`` (the PD drives track the targets, so the arm lags a command a
little, like a real one). Task resets teleport the arm (``can_teleport``).

Physics runs on the CPU (``physx_cpu``, one scene per robot). Cameras render on demand; on a
machine without a GPU SAPIEN renders through Mesa's lavapipe (see ``shared/RECIPES.md``): the
first frame compiles shaders (4 s on the idle 2-core dev box, up to 35 s with its cores busy),
then a 128x128 frame takes ~40-120 ms. A scene created while another that has rendered is alive renders
its first frame at once; once every scene is closed the next one compiles again.
ManiSkill is imported when the first component connects; without it, or when the scene
cannot be created, connecting raises :class:`DriverUnavailableError` saying why.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rlinf_nb.robots.components import Arm, Camera, Device, Gripper, Scene
from rlinf_nb.robots.errors import DriverUnavailableError, NotConnectedError, RobotError, SpecError
from rlinf_nb.robots.registry import register_device, register_driver

logger = logging.getLogger(__name__)

PANDA_JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
#: the Panda's hard joint limits (rad), as in ManiSkill's URDF (checked against the scene on connect)
PANDA_LIMITS = (
    (-2.8973, 2.8973),
    (-1.7628, 1.7628),
    (-2.8973, 2.8973),
    (-3.0718, -0.0698),
    (-2.8973, 2.8973),
    (-0.0175, 3.7525),
    (-2.8973, 2.8973),
)
ROBOTS = ("panda", "panda_wristcam")
#: where ManiSkill's table scene puts the robot's base (world frame, m); the base frame is not rotated
BASE_POSITION = (-0.615, 0.0, 0.0)
FINGER_OPEN = 0.04  # finger joint position (m) of a fully open Panda gripper
OBJECTS = {
    "puck": "a dynamic cube (half size puck_half_size) that the arm can push",
    "goal": "a red-and-white disc on the table (visual only)",
    "target": "a sphere marker, e.g. a reach target (visual only)",
    "hole": "a socket fixture on the table: a square block with a square hole; its position is the hole's top centre",
    "peg": "a square peg held below the hand (its position is the tip; it follows the hand, the value is not used)",
}
#: start positions of the objects a task may add before the scene is built (``SimScene.add_objects``)
ADDABLE_OBJECTS = {"hole": [0.38, 0.0, 0.05], "peg": [0.0, 0.0, 0.0]}
RENDER_BACKENDS = ("auto", "cpu", "gpu", "none")
_COLORS = {  # RGBA in [0, 1], close to the mock camera's colours
    "puck": (0.82, 0.2, 0.16, 1.0),
    "target": (0.24, 0.7, 0.86, 1.0),
    "hole": (0.35, 0.35, 0.4, 1.0),
    "peg": (0.9, 0.75, 0.2, 1.0),
}
_MARKER_LIFT = 1e-3  # the goal disc is drawn this far above its position, so the table does not hide it


def _vec3(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise SpecError(f"{name}: expected [x, y, z] in metres, got {value!r}")
    return arr


# -- the world ------------------------------------------------------------------------------


def _default_objects() -> dict[str, list[float]]:
    return {"target": [0.40, 0.10, 0.20], "puck": [0.35, -0.15, 0.02], "goal": [0.45, -0.05, 0.0]}


@dataclass
class SimWorldConfig:
    """One ManiSkill table scene with a Panda (positions in the robot frame: see ``origin``)."""

    robot: str = "panda"
    """ManiSkill robot: ``panda``, or ``panda_wristcam`` (adds the wrist camera, ``name: hand``)."""
    objects: dict[str, list[float]] = field(default_factory=_default_objects)
    """Objects and their start positions: any of ``puck`` (pushable cube), ``goal`` (disc), ``target`` (sphere)."""
    puck_half_size: float = 0.02
    """Half the side of the puck cube (m); it rests on the table at z = puck_half_size."""
    goal_radius: float = 0.03
    """Radius of the goal disc (m)."""
    target_radius: float = 0.015
    """Radius of the target sphere (m)."""
    peg_half_size: float = 0.01
    """Half the side of the square peg (m)."""
    peg_length: float = 0.05
    """Length of the peg (m); it hangs this far below its top, ``peg_gap`` below the TCP."""
    peg_gap: float = 0.005
    """Gap (m) between the TCP (the fingertips) and the peg's top, so the closed fingers do not touch it."""
    hole_clearance: float = 0.008
    """The hole's half side minus the peg's (m): how far off-centre (per axis) the peg still goes in."""
    block_half_size: float = 0.05
    """Half the side of the socket block (m); the block stands on the table up to the hole's z."""
    control_freq: int = 20
    """ManiSkill control steps per simulated second (keep it equal to the spec's ``control_hz``)."""
    sim_freq: int = 100
    """Physics steps per simulated second (a multiple of ``control_freq``)."""
    render_backend: str = "auto"
    """``auto`` (the GPU when torch sees one, else the CPU), ``cpu`` (lavapipe), ``gpu``, or ``none`` (no cameras)."""
    origin: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Where every position is measured from, in the Panda's base frame (m; the axes stay the base's)."""

    def __post_init__(self) -> None:
        if self.robot not in ROBOTS:
            raise SpecError(f"robot: {self.robot!r} is not supported; allowed: {', '.join(ROBOTS)}")
        if not isinstance(self.objects, dict):
            raise SpecError(f"objects: expected a mapping of name -> [x, y, z], got {self.objects!r}")
        for name, pos in self.objects.items():
            if name not in OBJECTS:
                raise SpecError(
                    f"objects.{name}: unknown object; allowed: "
                    + "; ".join(f"{k} ({v})" for k, v in OBJECTS.items())
                )
            _vec3(pos, f"objects.{name}")
        for name in ("puck_half_size", "goal_radius", "target_radius", "peg_half_size", "peg_length",
                     "peg_gap", "hole_clearance"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise SpecError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.control_freq < 1 or self.sim_freq < 1 or self.sim_freq % self.control_freq:
            raise SpecError(
                f"sim_freq ({self.sim_freq}) must be a positive multiple of control_freq ({self.control_freq})"
            )
        _vec3(self.origin, "origin")
        if not self.block_half_size > self.peg_half_size + self.hole_clearance:
            raise SpecError(
                f"block_half_size ({self.block_half_size}) must exceed peg_half_size + hole_clearance "
                f"({self.peg_half_size + self.hole_clearance}): the hole must fit in the block"
            )
        if "hole" in self.objects and not self.objects["hole"][2] > 0:
            raise SpecError(
                f"objects.hole: the hole's top must be above the table (z > 0), got {self.objects['hole']}"
            )
        if self.render_backend not in RENDER_BACKENDS:
            raise SpecError(
                f"render_backend: {self.render_backend!r} is not a backend; allowed: {', '.join(RENDER_BACKENDS)}"
            )


@dataclass(frozen=True)
class _FixedCamera:
    uid: str
    eye: tuple[float, float, float]  # world frame
    target: tuple[float, float, float]
    width: int
    height: int
    fov: float


def _import_maniskill() -> Any:
    """Import ManiSkill (and SAPIEN); the ImportError names what is missing."""
    import mani_skill.envs  # noqa: F401 - registers ManiSkill's robots

    return mani_skill


@functools.cache
def _scene_class() -> type:
    """The ManiSkill env class of our table scene (defined on first use: it subclasses ManiSkill's BaseEnv)."""
    _import_maniskill()
    import sapien
    from mani_skill.envs.sapien_env import BaseEnv
    from mani_skill.sensors.camera import CameraConfig
    from mani_skill.utils import sapien_utils
    from mani_skill.utils.building import actors
    from mani_skill.utils.scene_builder.table import TableSceneBuilder

    disc_up = [np.cos(np.pi / 4), 0.0, np.sin(np.pi / 4), 0.0]  # SAPIEN cylinders lie along x: turn to z

    class RlinfNbTableScene(BaseEnv):
        """Table, Panda, a puck cube, a goal disc, a target sphere and fixed cameras; no reward, no obs."""

        SUPPORTED_ROBOTS = list(ROBOTS)
        SUPPORTED_REWARD_MODES = ("none",)

        def __init__(self, *args: Any, world: SimWorldConfig, cameras: list[_FixedCamera], **kwargs: Any):
            self.world = world
            self.fixed_cameras = cameras
            self.objects: dict[str, Any] = {}
            super().__init__(*args, **kwargs)

        @property
        def _default_sensor_configs(self):
            return [
                CameraConfig(
                    c.uid,
                    pose=sapien_utils.look_at(eye=list(c.eye), target=list(c.target)),
                    width=c.width,
                    height=c.height,
                    fov=c.fov,
                    near=0.01,
                    far=100,
                )
                for c in self.fixed_cameras
            ]

        def _load_agent(self, options: dict):
            super()._load_agent(options, sapien.Pose(p=list(BASE_POSITION)))

        def _load_scene(self, options: dict):
            self.table_scene = TableSceneBuilder(env=self, robot_init_qpos_noise=0.0)
            self.table_scene.build()
            w = self.world
            base = np.asarray(BASE_POSITION) + np.asarray(w.origin)
            for name, pos in w.objects.items():
                p = (np.asarray(pos, dtype=np.float64) + base).tolist()
                if name == "puck":
                    self.objects[name] = actors.build_cube(
                        self.scene,
                        half_size=w.puck_half_size,
                        color=_COLORS["puck"],
                        name="puck",
                        body_type="dynamic",
                        initial_pose=sapien.Pose(p=p),
                    )
                elif name == "goal":
                    p[2] += _MARKER_LIFT
                    self.objects[name] = actors.build_red_white_target(
                        self.scene,
                        radius=w.goal_radius,
                        thickness=1e-5,
                        name="goal",
                        add_collision=False,
                        body_type="kinematic",
                        initial_pose=sapien.Pose(p=p, q=disc_up),
                    )
                elif name == "hole":
                    self.objects[name] = _build_socket(self.scene, w, p)
                elif name == "peg":
                    self.objects[name] = _build_peg(self.scene, w)
                else:
                    self.objects[name] = actors.build_sphere(
                        self.scene,
                        radius=w.target_radius,
                        color=_COLORS["target"],
                        name="target",
                        body_type="kinematic",
                        add_collision=False,
                        initial_pose=sapien.Pose(p=p),
                    )
            self._tie_peg()

        def _tie_peg(self) -> None:
            """Tie the peg to the TCP: a drive whose every limit is zero (a rigid joint)."""
            if "peg" not in self.objects:
                return
            w = self.world
            drive = self.scene.create_drive(
                self.agent.tcp, sapien.Pose(p=[0.0, 0.0, w.peg_gap + w.peg_length / 2]),
                self.objects["peg"], sapien.Pose(),
            )  # fmt: skip
            raw = drive._objs[0]
            for axis in ("x", "y", "z"):
                getattr(raw, f"set_limit_{axis}")(0.0, 0.0)
            raw.set_limit_twist(0.0, 0.0)
            raw.set_limit_pyramid(0.0, 0.0, 0.0, 0.0)
            self.peg_drive = drive

        def _initialize_episode(self, env_idx, options: dict):
            self.agent.reset(self.agent.keyframes["rest"].qpos)
            self.agent.robot.set_pose(sapien.Pose(p=list(BASE_POSITION)))

        def evaluate(self) -> dict:
            return {}

        def _get_obs_extra(self, info: dict) -> dict:
            return {}

    return RlinfNbTableScene


def _build_socket(scene: Any, w: SimWorldConfig, top: list[float]) -> Any:
    """The socket fixture: four kinematic boxes round a square hole, standing on the table.

    The actor's origin is the hole's top centre (``top``, world frame); the walls reach down to the
    table, so the block is ``top``'s height above the table tall.
    """
    import sapien

    height = top[2] - BASE_POSITION[2]  # the table top is at the base's height
    hole = w.peg_half_size + w.hole_clearance
    wall = (w.block_half_size - hole) / 2  # half the thickness of each wall
    builder = scene.create_actor_builder()
    material = sapien.render.RenderMaterial(base_color=_COLORS["hole"])
    for sign in (-1.0, 1.0):
        for along_x in (True, False):
            centre = sign * (hole + wall)
            pos = [centre, 0.0, -height / 2] if along_x else [0.0, centre, -height / 2]
            half = [wall, w.block_half_size, height / 2] if along_x else [hole, wall, height / 2]
            builder.add_box_collision(pose=sapien.Pose(p=pos), half_size=half)
            builder.add_box_visual(pose=sapien.Pose(p=pos), half_size=half, material=material)
    builder.initial_pose = sapien.Pose(p=top)
    return builder.build_kinematic(name="hole")


def _build_peg(scene: Any, w: SimWorldConfig) -> Any:
    """The square peg (a light dynamic box, its long axis along the TCP's z; tied to the TCP later)."""
    import sapien

    half = [w.peg_half_size, w.peg_half_size, w.peg_length / 2]
    builder = scene.create_actor_builder()
    builder.add_box_collision(half_size=half, density=200.0)
    builder.add_box_visual(half_size=half, material=sapien.render.RenderMaterial(base_color=_COLORS["peg"]))
    builder.initial_pose = sapien.Pose(p=[0.0, 0.0, 0.5])
    return builder.build(name="peg")


def _lavapipe_hint(exc: BaseException) -> str:
    text = str(exc).lower()
    if "render" in text or "vulkan" in text or "device" in text:
        return (
            " SAPIEN needs a Vulkan device even on the CPU: install Mesa >= 24.3's lavapipe "
            "(Debian 12: `apt-get install -t bookworm-backports mesa-vulkan-drivers`; see shared/RECIPES.md), "
            "or set the device's render_backend."
        )
    return ""


@register_device("maniskill")
class SimWorld(Device):
    """One ManiSkill scene shared by the ``sim`` components on it (opened by the first that connects)."""

    config_class = SimWorldConfig

    def __init__(self, config: SimWorldConfig | None = None):
        super().__init__(config or SimWorldConfig())
        self.cameras: dict[str, SimCamera] = {}
        self.env: Any = None  # the ManiSkill env (unwrapped), while open
        self.construct_seconds = 0.0
        self.control_steps = 0
        self._origin = np.asarray(self.config.origin, dtype=np.float64)  # frame origin, base frame
        self._base = np.asarray(BASE_POSITION, dtype=np.float64) + self._origin  # frame origin, world frame
        self._action = np.zeros(8, dtype=np.float32)  # 7 joint targets + gripper in [-1, 1]
        self._time_debt = 0.0
        self._markers: dict[str, np.ndarray] = {}

    # -- open / close -----------------------------------------------------------------------
    def _camera_specs(self) -> tuple[list[_FixedCamera], dict[str, dict]]:
        fixed, sizes = [], {}
        for cam in self.cameras.values():
            cfg: SimCameraConfig = cam.config
            if cfg.name == "hand":
                sizes["hand_camera"] = {"width": cfg.width, "height": cfg.height}
                if cfg.fov is not None:
                    sizes["hand_camera"]["fov"] = cfg.fov
                continue
            fixed.append(
                _FixedCamera(
                    cfg.name,
                    tuple((np.asarray(cfg.eye) + self._base).tolist()),
                    tuple((np.asarray(cfg.target) + self._base).tolist()),
                    cfg.width,
                    cfg.height,
                    1.0 if cfg.fov is None else cfg.fov,
                )
            )
        return fixed, sizes

    def _render_backend(self) -> str:
        name = self.config.render_backend
        if name != "auto":
            return name
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"

    def open(self) -> None:
        cfg: SimWorldConfig = self.config
        try:
            cls = _scene_class()
        except ImportError as exc:
            raise DriverUnavailableError(
                f"sim driver: ManiSkill 3 is not importable ({exc}); install it with `uv pip install mani-skill` "
                "(it brings SAPIEN), or use the mock driver"
            ) from exc
        fixed, sizes = self._camera_specs()
        t0 = time.perf_counter()
        try:
            env = cls(
                world=cfg,
                cameras=fixed,
                obs_mode="none",
                reward_mode="none",
                control_mode="pd_joint_pos",
                robot_uids=cfg.robot,
                sim_backend="physx_cpu",
                render_backend=self._render_backend(),
                sim_config={"sim_freq": cfg.sim_freq, "control_freq": cfg.control_freq},
                sensor_configs=sizes,
            )
        except Exception as exc:
            raise DriverUnavailableError(
                f"sim driver: could not create the ManiSkill scene ({type(exc).__name__}: {exc}).{_lavapipe_hint(exc)}"
            ) from exc
        self.construct_seconds = time.perf_counter() - t0
        self.env = env
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        env = self.env
        agent = env.agent
        self._art = agent.robot._objs[0]  # SAPIEN's articulation: numpy reads, no torch round trip
        names = [j.name for j in self._art.get_active_joints()]  # SAPIEN's names carry a scene prefix
        if len(names) != 9 or not all(n.endswith(j) for n, j in zip(names[:7], PANDA_JOINTS, strict=True)):
            raise RobotError(
                f"sim driver: unexpected joints {names} in the ManiSkill robot {self.config.robot!r}"
            )
        limits = np.asarray(self._art.get_qlimits(), dtype=np.float64)[:7]
        if not np.allclose(limits, PANDA_LIMITS, atol=1e-3):
            raise RobotError(
                f"sim driver: the scene's joint limits {limits.tolist()} differ from PANDA_LIMITS"
            )
        self._pin = self._art.create_pinocchio_model()
        self._tcp = agent.tcp._objs[0]
        self._tcp_index = self._tcp.index
        self.rest = np.asarray(agent.keyframes["rest"].qpos[:7], dtype=np.float64)
        self._action[:7] = self._art.get_qpos()[:7]
        self._action[7] = 1.0
        self._time_debt = 0.0
        self.control_steps = 0
        self._markers = {}
        self.reset_objects()

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            try:
                env.close()
            except Exception:  # closing must not hide the reason we close
                logger.exception("sim driver: closing the ManiSkill scene failed")

    def _require_open(self, what: str) -> Any:
        if self.env is None:
            raise NotConnectedError(f"sim driver: cannot {what} while disconnected; connect the robot first")
        return self.env

    # -- time -------------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        """Run the ManiSkill control steps that fit in ``dt`` seconds (fractions carry over)."""
        if self.env is None:
            return
        self._time_debt += dt * self.config.control_freq
        n = int(np.floor(self._time_debt + 1e-6))
        self._time_debt -= n
        with warnings.catch_warnings():
            # ManiSkill 3.0.1 calls np.isnan on a torch tensor in every step (NumPy 2 deprecation)
            warnings.filterwarnings("ignore", message=".*__array_wrap__", category=DeprecationWarning)
            for _ in range(n):
                self.env.step(self._action)
                self.control_steps += 1

    # -- arm --------------------------------------------------------------------------------
    def qpos(self) -> np.ndarray:
        self._require_open("read the arm")
        return np.asarray(self._art.get_qpos(), dtype=np.float64)

    def _full_q(self, q: np.ndarray) -> np.ndarray:
        full = np.zeros(9)
        full[:7] = q
        return full

    def fk(self, q: np.ndarray) -> np.ndarray:
        """TCP position (robot frame, m) at arm joints ``q``, by the scene's kinematic model."""
        self._require_open("compute forward kinematics")
        self._pin.compute_forward_kinematics(self._full_q(q))
        return np.asarray(self._pin.get_link_pose(self._tcp_index).p, dtype=np.float64) - self._origin

    def _tcp_pose(self, q: np.ndarray) -> np.ndarray:
        self._pin.compute_forward_kinematics(self._full_q(q))
        return np.asarray(
            self._pin.get_link_pose(self._tcp_index).to_transformation_matrix(), dtype=np.float64
        )

    def jacobians(self, q: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
        """``[3, 7]`` positional and ``[3, 7]`` rotational Jacobian of the TCP (robot frame axes) at ``q``.

        Central differences of the kinematic model (15 evaluations of a few microseconds each),
        so they agree with :meth:`fk` exactly.
        """
        self._require_open("compute the Jacobian")
        q = np.asarray(q, dtype=np.float64)
        rot0 = self._tcp_pose(q)[:3, :3]
        jp, jr = np.zeros((3, 7)), np.zeros((3, 7))
        for i in range(7):
            dq = np.zeros(7)
            dq[i] = eps
            plus, minus = self._tcp_pose(q + dq), self._tcp_pose(q - dq)
            jp[:, i] = (plus[:3, 3] - minus[:3, 3]) / (2 * eps)
            w = (plus[:3, :3] - minus[:3, :3]) / (2 * eps) @ rot0.T  # skew matrix of the angular velocity
            jr[:, i] = (w[2, 1], w[0, 2], w[1, 0])
        return jp, jr

    def set_arm_drive(self, stiffness: float, damping: float, force_limit: float) -> None:
        """PD gains of the arm's joint drives (ManiSkill's Panda: 1e3, 1e2, 100)."""
        env = self._require_open("set drive gains")
        for joint in env.agent.controller.controllers["arm"].joints:
            joint.set_drive_properties(stiffness, damping, force_limit=force_limit, mode="force")

    def tcp_position(self) -> np.ndarray:
        """The simulated TCP position (robot frame, m)."""
        self._require_open("read the TCP")
        return np.asarray(self._tcp.entity_pose.p, dtype=np.float64) - self._base

    def set_arm_target(self, q: np.ndarray) -> None:
        self._action[:7] = q

    def teleport_arm(self, q: np.ndarray) -> None:
        """Put the arm at ``q`` at rest now (velocities zero, PD target ``q``)."""
        full = self.qpos()
        full[:7] = q
        self._art.set_qpos(full.astype(np.float32))
        self._art.set_qvel(np.zeros(9, dtype=np.float32))
        self._action[:7] = q
        self._snap_peg(q)

    def _snap_peg(self, q: np.ndarray) -> None:
        """Put the held peg where its joint to the TCP (at arm joints ``q``) holds it, at rest."""
        if "peg" not in self.config.objects:
            return
        import sapien

        cfg: SimWorldConfig = self.config
        tcp = self._tcp_pose(np.asarray(q, dtype=np.float64))
        tcp[:3, 3] += np.asarray(BASE_POSITION)
        pose = sapien.Pose(tcp) * sapien.Pose(p=[0.0, 0.0, cfg.peg_gap + cfg.peg_length / 2])
        peg = self.env.objects["peg"]
        peg.set_pose(pose)
        peg.set_linear_velocity(np.zeros(3))
        peg.set_angular_velocity(np.zeros(3))

    # -- gripper ----------------------------------------------------------------------------
    def gripper_opening(self) -> float:
        fingers = self.qpos()[7:9]
        return float(np.clip(fingers.mean() / FINGER_OPEN, 0.0, 1.0))

    def set_gripper_target(self, opening: float) -> None:
        self._action[7] = 2.0 * float(opening) - 1.0

    def teleport_gripper(self, opening: float) -> None:
        full = self.qpos()
        full[7:9] = float(opening) * FINGER_OPEN
        self._art.set_qpos(full.astype(np.float32))
        self.set_gripper_target(opening)

    # -- cameras ----------------------------------------------------------------------------
    def render(self, uid: str) -> np.ndarray:
        """The camera's current ``[H, W, 3]`` uint8 frame."""
        env = self._require_open("render")
        sensor = env.scene.sensors.get(uid)
        if sensor is None:
            raise RobotError(
                f"sim driver: the scene has no camera {uid!r}; it has {sorted(env.scene.sensors)}"
            )
        env.scene.update_render(update_sensors=True, update_human_render_cameras=False)
        sensor.capture()
        rgb = sensor.get_obs(rgb=True, depth=False, position=False, segmentation=False)["rgb"]
        return np.ascontiguousarray(rgb[0].cpu().numpy(), dtype=np.uint8)

    # -- objects ----------------------------------------------------------------------------
    def object_positions(self) -> dict[str, np.ndarray]:
        env = self._require_open("read objects")
        out = {}
        for name in self.config.objects:
            if name == "peg":  # its tip, half the peg's length along its axis from its centre
                pose = env.objects[name]._objs[0].pose
                tip = pose.to_transformation_matrix() @ np.array([0.0, 0.0, self.config.peg_length / 2, 1.0])
                out[name] = tip[:3] - self._base
            elif name in self._markers:
                out[name] = self._markers[name].copy()
            else:
                out[name] = np.asarray(env.objects[name]._objs[0].pose.p, dtype=np.float64) - self._base
        return out

    def place(self, name: str, position: np.ndarray) -> None:
        """Put an object at ``position`` (robot frame), upright and at rest."""
        import sapien

        env = self._require_open("place objects")
        pos = _vec3(position, f"place({name!r})")
        if name == "peg":
            raise RobotError("sim driver: the peg is held by the hand and follows it; move the arm instead")
        actor = env.objects[name]
        world = pos + self._base
        if name == "hole":
            built = float(self.config.objects["hole"][2])
            if abs(pos[2] - built) > 1e-3:
                raise SpecError(
                    f"sim driver: the socket block was built {built} m tall (devices.sim.config.objects.hole z), so "
                    f"its hole cannot be placed at z = {pos[2]}; set that z to the task's hole_height"
                )
            self._markers[name] = pos.copy()
            actor.set_pose(sapien.Pose(p=world.tolist()))
            return
        if name == "puck":
            actor.set_pose(sapien.Pose(p=world.tolist()))
            actor.set_linear_velocity(np.zeros(3))
            actor.set_angular_velocity(np.zeros(3))
            return
        self._markers[name] = pos.copy()
        q = [1.0, 0.0, 0.0, 0.0]
        if name == "goal":
            world[2] += _MARKER_LIFT
            q = [np.cos(np.pi / 4), 0.0, np.sin(np.pi / 4), 0.0]
        actor.set_pose(sapien.Pose(p=world.tolist(), q=q))

    def reset_objects(self) -> None:
        """Every object back to its start position."""
        for name, pos in self.config.objects.items():
            if name != "peg":
                self.place(name, np.asarray(pos, dtype=np.float64))
        self._snap_peg(self.qpos()[:7])


class _SimComponent:
    device_class = SimWorld


# -- arm ------------------------------------------------------------------------------------


@dataclass
class SimArmConfig:
    """The simulated Panda arm."""

    home: list[float] | None = None
    """Joint positions (rad, 7) the arm is put at on connect; None: ManiSkill's ``rest`` keyframe."""
    stiffness: float = 1.0e4
    """PD stiffness of the joint drives (N m / rad). ManiSkill's Panda has 1e3, which tracks a step
    command in ~4 control periods; 1e4 reaches 70% of it in one period and settles in two."""
    damping: float = 300.0
    """PD damping of the joint drives (N m s / rad)."""
    force_limit: float = 100.0
    """Largest drive torque (N m)."""
    keep_orientation: bool = True
    """``jacobian()`` is the positional Jacobian of joint motions that keep the hand's orientation, so
    position-only IK through it (RobotEnv's ``ee_delta``) moves the TCP without tilting the gripper.
    False: the plain positional Jacobian."""

    def __post_init__(self) -> None:
        for name in ("stiffness", "damping", "force_limit"):
            if not getattr(self, name) > 0:
                raise SpecError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.home is not None:
            home = np.asarray(self.home, dtype=np.float64)
            lim = np.asarray(PANDA_LIMITS)
            if home.shape != (7,) or np.any(home < lim[:, 0]) or np.any(home > lim[:, 1]):
                raise SpecError(
                    f"home: expected 7 joint positions (rad) inside the Panda's limits {list(PANDA_LIMITS)}, "
                    f"got {self.home}"
                )


@register_driver("sim")
class SimArm(_SimComponent, Arm):
    """The Panda's 7 joints in the ManiSkill scene (rad), PD-tracked absolute joint targets."""

    config_class = SimArmConfig
    joint_unit = "rad"

    def __init__(self, config: SimArmConfig | None = None, device: SimWorld | None = None):
        super().__init__(config or SimArmConfig(), device)
        if device is None:
            raise SpecError("sim arm: needs a maniskill device (spec key 'device')")

    @property
    def joint_names(self) -> tuple[str, ...]:
        return PANDA_JOINTS

    @property
    def joint_limits(self) -> np.ndarray:
        return np.asarray(PANDA_LIMITS, dtype=np.float64)

    @property
    def has_kinematics(self) -> bool:
        return True

    def forward_kinematics(self, q: np.ndarray) -> np.ndarray:
        return self.device.fk(np.asarray(q, dtype=np.float64))

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        jp, jr = self.device.jacobians(np.asarray(q, dtype=np.float64))
        if not self.config.keep_orientation:
            return jp
        null = np.eye(7) - np.linalg.pinv(jr, rcond=1e-6) @ jr  # joint motions that do not turn the hand
        return jp @ null

    def _connect(self) -> None:
        cfg: SimArmConfig = self.config
        self.device.set_arm_drive(cfg.stiffness, cfg.damping, cfg.force_limit)
        home = self.device.rest if cfg.home is None else np.asarray(cfg.home, dtype=np.float64)
        self.device.teleport_arm(home)

    def _joints(self) -> np.ndarray:
        # PhysX lets a joint pushed against its limit pass it by a hair: report it at the limit
        lim = self.joint_limits
        return np.clip(self.device.qpos()[:7], lim[:, 0], lim[:, 1])

    def _read(self) -> dict[str, np.ndarray]:
        return {
            "joint_pos": self._joints().astype(np.float32),
            "ee_pos": self.device.tcp_position().astype(np.float32),
        }

    def joint_positions(self) -> np.ndarray:
        self._require_connected("read")
        return self._joints()

    def _send(self, action: np.ndarray) -> np.ndarray:
        lim = self.joint_limits
        q = np.clip(action, lim[:, 0], lim[:, 1])
        self.device.set_arm_target(q)
        return q

    @property
    def can_teleport(self) -> bool:
        return True

    def teleport(self, q: np.ndarray) -> None:
        self._require_connected("teleport")
        lim = self.joint_limits
        self.device.teleport_arm(np.clip(np.asarray(q, dtype=np.float64), lim[:, 0], lim[:, 1]))


# -- gripper --------------------------------------------------------------------------------


@dataclass
class SimGripperConfig:
    """The Panda's parallel gripper."""

    start: float = 1.0
    """Opening at connect, in [0, 1] (1 open; a closed gripper makes a better pusher)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.start <= 1.0:
            raise SpecError(f"start must be in [0, 1] (0 closed, 1 open), got {self.start}")


@register_driver("sim")
class SimGripper(_SimComponent, Gripper):
    config_class = SimGripperConfig

    def __init__(self, config: SimGripperConfig | None = None, device: SimWorld | None = None):
        super().__init__(config or SimGripperConfig(), device)
        if device is None:
            raise SpecError("sim gripper: needs a maniskill device (spec key 'device')")

    def _connect(self) -> None:
        self.device.teleport_gripper(self.config.start)

    def _read(self) -> dict[str, np.ndarray]:
        return {"pos": np.array([self.device.gripper_opening()], dtype=np.float32)}

    def _send(self, action: np.ndarray) -> np.ndarray:
        self.device.set_gripper_target(float(action[0]))
        return action


# -- camera ---------------------------------------------------------------------------------


@dataclass
class SimCameraConfig:
    """A camera in the scene: fixed (looking from ``eye`` at ``target``) or the wrist camera."""

    name: str = "front"
    """Camera name in the scene; ``hand`` is the wrist camera of ``robot: panda_wristcam``."""
    width: int = 128
    """Image width (pixels)."""
    height: int = 128
    """Image height (pixels)."""
    eye: list[float] = field(default_factory=lambda: [0.8, 0.45, 0.55])
    """Fixed cameras: position (robot frame, m); the default looks at the arm and the table from the front left."""
    target: list[float] = field(default_factory=lambda: [0.38, 0.0, 0.05])
    """Fixed cameras: the point it looks at (robot frame, m)."""
    fov: float | None = None
    """Vertical field of view (rad); None: 1.0 for fixed cameras, ManiSkill's pi/2 for the wrist camera."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise SpecError(f"name: expected a word like 'front' or 'hand', got {self.name!r}")
        if self.width < 8 or self.height < 8:
            raise SpecError(f"width/height must be >= 8 pixels, got {self.width}x{self.height}")
        eye, target = _vec3(self.eye, "eye"), _vec3(self.target, "target")
        if np.allclose(eye, target):
            raise SpecError(f"eye and target must differ, both are {self.eye}")
        if self.fov is not None and not 0.0 < self.fov < np.pi:
            raise SpecError(f"fov must be in (0, pi) rad, got {self.fov}")


@register_driver("sim")
class SimCamera(_SimComponent, Camera):
    config_class = SimCameraConfig

    def __init__(self, config: SimCameraConfig | None = None, device: SimWorld | None = None):
        super().__init__(config or SimCameraConfig(), device)
        if device is None:
            raise SpecError("sim camera: needs a maniskill device (spec key 'device')")
        name = self.config.name
        if name == "hand" and device.config.robot != "panda_wristcam":
            raise SpecError(
                f"sim camera 'hand' is the wrist camera of robot panda_wristcam; the device's robot is "
                f"{device.config.robot!r} (set devices.<name>.config.robot: panda_wristcam)"
            )
        if device.config.render_backend == "none":
            raise SpecError(f"sim camera {name!r}: the device has render_backend 'none', so it cannot render")
        if name in device.cameras:
            raise SpecError(f"sim camera {name!r}: two cameras with one name on one device; name them apart")
        device.cameras[name] = self
        self.frames = 0

    @property
    def uid(self) -> str:
        return "hand_camera" if self.config.name == "hand" else self.config.name

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.config.height, self.config.width, 3)

    def _read(self) -> dict[str, np.ndarray]:
        self.frames += 1
        return {"rgb": self.device.render(self.uid)}


# -- scene ----------------------------------------------------------------------------------


@register_driver("sim")
class SimScene(_SimComponent, Scene):
    """Object positions in the ManiSkill scene (robot frame); ``place`` and ``reset`` for tasks."""

    def __init__(self, config: Any = None, device: SimWorld | None = None):
        super().__init__(config, device)
        if device is None:
            raise SpecError("sim scene: needs a maniskill device (spec key 'device')")

    @property
    def object_names(self) -> tuple[str, ...]:
        return tuple(self.device.config.objects)

    @property
    def addable_objects(self) -> tuple[str, ...]:
        return tuple(name for name in ADDABLE_OBJECTS if name not in self.device.config.objects)

    def add_objects(self, names: list[str]) -> None:
        """Build ``names`` (from :data:`ADDABLE_OBJECTS`, at their default start) into the scene when it opens."""
        unknown = [n for n in names if n not in self.addable_objects]
        if unknown:
            raise SpecError(
                f"{self._label}: cannot add object(s) {unknown}; addable: {', '.join(self.addable_objects) or 'none'}"
            )
        if self.device.is_open:
            raise RobotError(
                f"{self._label}: cannot add objects {names} to a scene that is already built; disconnect the "
                f"robot first, or list them in the device's config.objects"
            )
        for name in names:
            self.device.config.objects[name] = list(ADDABLE_OBJECTS[name])

    def _read(self) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float32) for k, v in self.device.object_positions().items()}

    @property
    def can_place(self) -> bool:
        return True

    def place(self, name: str, position: np.ndarray) -> None:
        self._require_connected("place objects")
        if name not in self.object_names:
            raise ValueError(
                f"{self._label}: cannot place {name!r}; placeable: {', '.join(self.object_names)}"
            )
        self.device.place(name, position)

    def reset(self) -> None:
        self._require_connected("reset")
        self.device.reset_objects()


__all__ = [
    "PANDA_JOINTS",
    "PANDA_LIMITS",
    "SimArm",
    "SimCamera",
    "SimGripper",
    "SimScene",
    "SimWorld",
]
