"""The ``maniskill:`` backend of :func:`rlinf_nb.envs.make_env` (ManiSkill 3).

``make_env("maniskill:PushCube-v1", num_envs=4, seed=0, obs_mode="state")`` gives a
:class:`ManiSkillVecEnv`: the same interface as :class:`rlinf_nb.envs.VecEnv`
(``reset``, ``step -> StepResult``, ``observation_space`` / ``action_space`` of one env,
``num_envs``, ``render``, ``close``), numpy in and out, same-step autoreset with the true
final observation of every finished episode, per-episode returns, lengths and successes.

Simulation backends (``sim_backend``):

* ``"physx_cpu"`` -- ManiSkill's CPU simulation supports one env per scene, so
  ``num_envs`` single envs live in this process and are stepped one after the other.
  (Subprocess vectorisation, ``gymnasium.vector.AsyncVectorEnv``, was measured on the
  2-core dev machine and gave no gain; scale out with more env workers instead.)
* ``"physx_cuda"`` -- one ManiSkill env with ``num_envs`` parallel sub-scenes on the
  GPU, partial resets of the finished ones.
* ``"auto"`` (default) -- ``physx_cuda`` when torch sees a CUDA device and SAPIEN's PhysX GPU
  library loads, else ``physx_cpu``. SAPIEN downloads that library (``libPhysXGpu_64.so``) from
  GitHub on first GPU use; where that fails (an offline cluster) ``auto`` warns and uses the CPU, and
  an explicit ``physx_cuda`` raises with the URL to fetch and the folder it goes in.

Observations (``obs_mode``), batched over envs as numpy arrays:

* ``"state"`` -- ``float32 [N, D]``: ManiSkill's flat state vector (robot ``qpos``,
  ``qvel``, task extras such as object and goal poses).
* ``"rgb"`` -- a dict: ``"state"``: ``float32 [N, D]`` (robot proprioception and the
  task extras ManiSkill exposes to visual policies, flattened; no privileged object
  poses), and one ``"rgb_<camera>"``: ``uint8 [N, H, W, 3]`` per camera (channels last,
  as rendered). Camera names come from the task and robot (``base_camera``; a wrist
  camera with ``robot_uids="panda_wristcam"``, ...); ``cameras`` selects a subset and
  ``camera_width`` / ``camera_height`` set the resolution of all of them.
* ``"rgbd"`` -- as ``"rgb"``, plus ``"depth_<camera>"``: ``float32 [N, H, W, 1]`` in metres.

With ``obs_features`` (state mode), a registered feature set (:mod:`rlinf_nb.envs.obs_features`) is
computed from each state in numpy and observations become ``[features, state]``; :meth:`raw_state`
gives the state back (scripted experts act on it).

``final_obs`` in a :class:`~rlinf_nb.envs.StepResult` has the same structure (a dict of
arrays for the image modes), zeros where no episode ended. ``successes`` holds, for every
episode that ended in a step, whether the task's ``success`` flag was ever true during the
episode (ManiSkill terminates on success unless ``ignore_terminations``, so this equals
"success at the end" by default).

Every call into ManiSkill (construction, ``reset``, ``step``, ``render``) runs under
``torch.inference_mode()``: the simulation's many small torch ops skip autograd's bookkeeping
(+15% env-steps/s for PushCube-v1 on CPU physx, measured in ``bench/bench_maniskill.py``), and
no tensor leaves this class (everything is converted to numpy).

ManiSkill is imported when the first env is made, never when :mod:`rlinf_nb.envs` is.
"""

from __future__ import annotations

import difflib
import functools
import time
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_nb.config import ConfigError, build, fields_of, param
from rlinf_nb.envs import StepResult, register_env_backend

__all__ = ["ManiSkillEnvConfig", "ManiSkillVecEnv", "maniskill_env_ids"]

OBS_MODES = ("state", "rgb", "rgbd")
SIM_BACKENDS = ("auto", "physx_cpu", "physx_cuda")


@dataclass
class ManiSkillEnvConfig:
    """Options of the ``maniskill:`` backend; any other keyword goes to ManiSkill's ``gym.make``."""

    obs_mode: str = param(
        "state", doc="observations: flat state, or camera images plus state", choices=OBS_MODES
    )
    sim_backend: str = param(
        "auto", doc="physx_cpu, physx_cuda, or auto (cuda when torch sees a GPU)", choices=SIM_BACKENDS
    )
    control_mode: str | None = param(None, doc="ManiSkill controller (None = the task's default)")
    reward_mode: str | None = param(
        None, doc="dense, normalized_dense, sparse or none (None = the task's default)"
    )
    render_mode: str | None = param(None, doc="'rgb_array' to get frames from render() (None = no frames)")
    max_episode_steps: int | None = param(
        None, doc="time limit in steps (None = the task's default)", range=(1, None)
    )
    ignore_terminations: bool = param(
        False, doc="never terminate on success/failure; episodes end at the time limit only"
    )
    cameras: tuple[str, ...] | None = param(
        None, doc="cameras to include in image observations (None = all the task's cameras)"
    )
    camera_width: int | None = param(
        None, doc="width of every sensor camera (None = task default)", range=(8, 4096)
    )
    camera_height: int | None = param(
        None, doc="height of every sensor camera (None = task default)", range=(8, 4096)
    )
    enhanced_determinism: bool = param(
        True, doc="seed every (auto-)reset from the env's seed, so runs are reproducible"
    )
    obs_features: str | None = param(
        None,
        doc="a registered feature set (rlinf_nb.envs.obs_features) computed from the state and put in "
        "front of it: observations become [features, state] (obs_mode 'state' only; None = the state)",
    )

    def validate(self) -> None:
        if self.obs_mode == "state" and self.cameras is not None:
            raise ConfigError("cameras", self.cameras, "only used with obs_mode 'rgb' or 'rgbd'")
        if self.obs_features is not None:
            from rlinf_nb.envs.obs_features import obs_feature_names

            if self.obs_mode != "state":
                raise ConfigError("obs_features", self.obs_features, "only used with obs_mode 'state'")
            if self.obs_features not in obs_feature_names():
                raise ConfigError(
                    "obs_features", self.obs_features, f"allowed values: {', '.join(obs_feature_names())}"
                )


def _import_maniskill() -> Any:
    """Import ManiSkill (registers its envs) and return its env registry."""
    import mani_skill.envs  # noqa: F401 - registers the tasks
    from mani_skill.utils.registration import REGISTERED_ENVS

    return REGISTERED_ENVS


def maniskill_env_ids() -> list[str]:
    """Every ManiSkill env id (imports ManiSkill)."""
    return sorted(_import_maniskill())


def _resolve_backend(name: str) -> str:
    """``physx_cpu`` or ``physx_cuda``; ``physx_cuda`` only once its GPU library is loaded (see below).

    ``auto`` picks ``physx_cuda`` when torch sees a CUDA device and SAPIEN's PhysX GPU library loads, and
    otherwise ``physx_cpu`` (saying why, when there is a GPU). An explicit ``physx_cuda`` that cannot
    run raises, naming what is missing.
    """
    if name == "physx_cpu":
        return name
    import torch

    if not torch.cuda.is_available():
        if name == "physx_cuda":
            raise RuntimeError(
                "make_env: sim_backend='physx_cuda' needs a CUDA GPU and torch sees none; use "
                "sim_backend='physx_cpu' (or 'auto', which picks it on a machine without a GPU)"
            )
        return "physx_cpu"
    try:
        enable_physx_gpu()
    except RuntimeError as exc:
        if name == "physx_cuda":
            raise
        warnings.warn(f"{exc} Using sim_backend='physx_cpu'.", stacklevel=3)
        return "physx_cpu"
    return "physx_cuda"


def enable_physx_gpu() -> None:
    """Load SAPIEN's PhysX GPU library, which SAPIEN downloads from GitHub on first use.

    Raises ``RuntimeError`` saying where the library goes when that download fails (a machine that
    cannot reach GitHub: place the zip's contents there by hand).
    """
    import platform

    import requests
    import sapien.physx

    try:
        sapien.physx.enable_gpu()
    except (requests.RequestException, OSError, zipfile.BadZipFile) as exc:
        version = sapien.physx.version()
        folder = Path.home() / ".sapien" / "physx" / version
        zip_name = "linux-aarch64-so.zip" if platform.machine() in ("aarch64", "arm64") else "linux-so.zip"
        url = f"https://github.com/sapien-sim/physx-precompiled/releases/download/{version}/{zip_name}"
        raise RuntimeError(
            f"ManiSkill's GPU simulation needs SAPIEN's PhysX GPU library (libPhysXGpu_64.so), and loading "
            f"it failed ({type(exc).__name__}: {exc}). SAPIEN downloads it from GitHub on first use; on a "
            f"machine that cannot reach GitHub, fetch {url} elsewhere and unzip it into {folder}."
        ) from exc


def _without_autograd(method: Any) -> Any:
    """Run ``method`` under ``torch.inference_mode()`` (ManiSkill's torch ops need no gradients)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.inference_mode():
            return method(*args, **kwargs)

    return wrapper


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class ManiSkillVecEnv:
    """``num_envs`` ManiSkill envs of one task with :class:`~rlinf_nb.envs.VecEnv`'s interface.

    Args:
        env_id: a ManiSkill id such as ``"PushCube-v1"``.
        num_envs: envs stepped together.
        seed: base seed; env ``i`` is reset with ``seed + i`` and every later
            auto-reset is derived from it (``None`` = unseeded).
        config: backend options.
        **make_kwargs: passed to ManiSkill's ``gym.make`` (``robot_uids``, ``sim_config``, ...).

    Raises:
        ValueError: for an unknown env id (with close matches).
    """

    @_without_autograd
    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int | None = None,
        config: ManiSkillEnvConfig | None = None,
        **make_kwargs: Any,
    ):
        registry = _import_maniskill()
        if env_id not in registry:
            close = difflib.get_close_matches(env_id, list(registry), n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f"make_env: unknown ManiSkill env id {env_id!r}{hint} "
                f"({len(registry)} ids: rlinf_nb.envs.maniskill.maniskill_env_ids())"
            )
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.config = cfg = config if config is not None else ManiSkillEnvConfig()
        self._features = None
        if cfg.obs_features is not None:
            from rlinf_nb.envs.obs_features import get_obs_features

            self._features = get_obs_features(cfg.obs_features)
        self.sim_backend = _resolve_backend(cfg.sim_backend)
        self._batched = self.sim_backend == "physx_cuda"
        self._seed = seed

        kwargs: dict[str, Any] = {"obs_mode": cfg.obs_mode, "sim_backend": self.sim_backend}
        for name in ("control_mode", "reward_mode", "render_mode", "max_episode_steps"):
            if getattr(cfg, name) is not None:
                kwargs[name] = getattr(cfg, name)
        if cfg.enhanced_determinism:
            kwargs["enhanced_determinism"] = True
        if cfg.camera_width is not None or cfg.camera_height is not None:
            sensor = dict(make_kwargs.pop("sensor_configs", None) or {})
            if cfg.camera_width is not None:
                sensor["width"] = cfg.camera_width
            if cfg.camera_height is not None:
                sensor["height"] = cfg.camera_height
            kwargs["sensor_configs"] = sensor
        kwargs.update(make_kwargs)

        t0 = time.perf_counter()
        if self._batched:
            self._envs = [gym.make(env_id, num_envs=self.num_envs, **kwargs)]
        else:
            self._envs = [gym.make(env_id, num_envs=1, **kwargs) for _ in range(self.num_envs)]
        self.construct_seconds = time.perf_counter() - t0
        base = self._envs[0].unwrapped
        self.max_episode_steps = _time_limit(self._envs[0])

        act_space = base.single_action_space
        if not isinstance(act_space, gym.spaces.Box):
            raise ValueError(
                f"make_env: {env_id!r} has a {type(act_space).__name__} action space; only Box is supported"
            )
        self.action_space = gym.spaces.Box(
            act_space.low.astype(np.float32), act_space.high.astype(np.float32), dtype=np.float32
        )

        self._cameras: list[str] = []
        if cfg.obs_mode != "state":
            available = list(base._init_raw_obs["sensor_data"])
            wanted = list(cfg.cameras) if cfg.cameras is not None else available
            missing = [c for c in wanted if c not in available]
            if missing:
                raise ValueError(
                    f"make_env: cameras {missing} not in {env_id!r}; its cameras: {', '.join(available)}"
                )
            self._cameras = wanted
        if self._features is not None and base._init_raw_obs.shape[-1] != self._features.state_dim:
            raise ValueError(
                f"make_env: obs_features {cfg.obs_features!r} reads a state of {self._features.state_dim} "
                f"values, and {env_id!r} has {base._init_raw_obs.shape[-1]}"
            )
        self.observation_space = self._make_obs_space(base._init_raw_obs)

        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._success = np.zeros(self.num_envs, dtype=bool)

    # ------------------------------------------------------------------ observations

    def _convert(self, raw: Any) -> np.ndarray | dict[str, np.ndarray]:
        """ManiSkill's batched torch observation -> our numpy layout ``[n, ...]``."""
        if self.config.obs_mode == "state":
            state = _to_numpy(raw).astype(np.float32, copy=False)
            return state if self._features is None else self._features(state)
        from mani_skill.utils.common import flatten_state_dict

        state = {k: v for k, v in raw.items() if k not in ("sensor_data", "sensor_param")}
        out: dict[str, np.ndarray] = {
            "state": _to_numpy(flatten_state_dict(state, use_torch=True)).astype(np.float32, copy=False)
        }
        sensors = raw["sensor_data"]
        for cam in self._cameras:
            out[f"rgb_{cam}"] = _to_numpy(sensors[cam]["rgb"])
        if self.config.obs_mode == "rgbd":
            for cam in self._cameras:
                out[f"depth_{cam}"] = _to_numpy(sensors[cam]["depth"]).astype(np.float32) / 1000.0
        return out

    def _make_obs_space(self, raw: Any) -> gym.Space:
        sample = self._convert(raw)
        if isinstance(sample, np.ndarray):
            return gym.spaces.Box(-np.inf, np.inf, sample.shape[1:], np.float32)
        spaces: dict[str, gym.Space] = {}
        for key, arr in sample.items():
            if key.startswith("rgb_"):
                spaces[key] = gym.spaces.Box(0, 255, arr.shape[1:], np.uint8)
            elif key.startswith("depth_"):
                spaces[key] = gym.spaces.Box(0.0, np.inf, arr.shape[1:], np.float32)
            else:
                spaces[key] = gym.spaces.Box(-np.inf, np.inf, arr.shape[1:], np.float32)
        return gym.spaces.Dict(spaces)

    def raw_state(self, obs: np.ndarray) -> np.ndarray:
        """The task's plain state inside ``obs`` (what scripted experts read): ``obs`` itself without
        ``obs_features``, else its last ``state_dim`` values."""
        return obs if self._features is None else obs[..., -self._features.state_dim :]

    @staticmethod
    def _cat(parts: list[Any]) -> Any:
        if isinstance(parts[0], dict):
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return np.concatenate(parts)

    # ------------------------------------------------------------------ API

    @_without_autograd
    def reset(self, seed: int | Sequence[int] | None = None) -> np.ndarray | dict[str, np.ndarray]:
        """Reset every env; ``seed`` (int: env ``i`` gets ``seed + i``; or one seed per env)."""
        if seed is None:
            seed = self._seed
        if seed is None:
            # Unseeded: fresh seeds (ManiSkill would give every single CPU env the same default seed).
            seed = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
        seeds: list[int]
        if isinstance(seed, int | np.integer):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: got {len(seeds)} seeds for {self.num_envs} envs")
        self._returns[:] = 0
        self._lengths[:] = 0
        self._success[:] = False
        if self._batched:
            obs, _ = self._envs[0].reset(seed=seeds)
            return self._convert(obs)
        parts = []
        for i, env in enumerate(self._envs):
            obs, _ = env.reset(seed=seeds[i])
            parts.append(self._convert(obs))
        return self._cat(parts)

    @_without_autograd
    def step(self, action: np.ndarray) -> StepResult:
        """Step every env with ``action[N, A]``; finished envs are reset in the same step."""
        import torch

        # ManiSkill clips actions to the action space itself.
        action = np.asarray(action, dtype=np.float32).reshape(self.num_envs, -1)
        if self._batched:
            obs_t, rew_t, term_t, trunc_t, info = self._envs[0].step(
                torch.as_tensor(action, device=self._envs[0].unwrapped.device)
            )
            reward = _to_numpy(rew_t).astype(np.float32).reshape(self.num_envs)
            terminated = _to_numpy(term_t).astype(bool).reshape(self.num_envs)
            truncated = _to_numpy(trunc_t).astype(bool).reshape(self.num_envs)
            success = _to_numpy(info["success"]).astype(bool) if "success" in info else None
            if self.config.ignore_terminations:
                terminated[:] = False
            done = terminated | truncated
            obs = self._convert(obs_t)
            final_obs = None
            if done.any():
                final_obs = _masked_copy(obs, done)
                idx = torch.as_tensor(np.flatnonzero(done), device=self._envs[0].unwrapped.device)
                new_obs, _ = self._envs[0].reset(options={"env_idx": idx})
                obs = self._convert(new_obs)
        else:
            reward = np.zeros(self.num_envs, np.float32)
            terminated = np.zeros(self.num_envs, bool)
            truncated = np.zeros(self.num_envs, bool)
            success = None
            parts, finals = [], {}
            for i, env in enumerate(self._envs):
                o, r, te, tr, info = env.step(torch.from_numpy(action[i : i + 1]))
                reward[i] = float(r)
                terminated[i] = bool(te) and not self.config.ignore_terminations
                truncated[i] = bool(tr)
                if "success" in info:
                    if success is None:
                        success = np.zeros(self.num_envs, bool)
                    success[i] = bool(info["success"])
                o = self._convert(o)
                if terminated[i] or truncated[i]:
                    finals[i] = o
                    o = self._convert(env.reset()[0])
                parts.append(o)
            obs = self._cat(parts)
            done = terminated | truncated
            final_obs = None
            if finals:
                final_obs = _zeros_like(obs)
                for i, o in finals.items():
                    _assign(final_obs, i, o)

        self._returns += reward
        self._lengths += 1
        if success is not None:
            self._success |= success
        result = StepResult(obs, reward, terminated, truncated, final_obs)
        if done.any():
            result.episode_returns = self._returns[done].tolist()
            result.episode_lengths = self._lengths[done].tolist()
            if success is not None:
                result.successes = [float(s) for s in self._success[done]]
            self._returns[done] = 0
            self._lengths[done] = 0
            self._success[done] = False
        return result

    @_without_autograd
    def render(self) -> np.ndarray | None:
        """A frame ``uint8 [H, W, 3]`` of env 0 (needs ``render_mode="rgb_array"``), else None."""
        if self.config.render_mode is None:
            return None
        frame = self._envs[0].render()
        if frame is None:
            return None
        frame = _to_numpy(frame)
        return frame[0] if frame.ndim == 4 else frame

    @_without_autograd
    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


def _time_limit(env: Any) -> int | None:
    """The ``max_episode_steps`` of the first time-limit wrapper around ``env``."""
    while env is not None:
        limit = env.__dict__.get("_max_episode_steps")
        if limit is not None:
            return int(limit)
        env = env.__dict__.get("env")
    return None


def _zeros_like(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: np.zeros_like(v) for k, v in obs.items()}
    return np.zeros_like(obs)


def _assign(dst: Any, i: int, src: Any) -> None:
    """``dst[i] = src[0]`` for an array or a dict of arrays."""
    if isinstance(dst, dict):
        for k in dst:
            dst[k][i] = src[k][0]
    else:
        dst[i] = src[0]


def _masked_copy(obs: Any, mask: np.ndarray) -> Any:
    """A copy of ``obs`` with rows outside ``mask`` zeroed."""
    if isinstance(obs, dict):
        return {k: _masked_copy(v, mask) for k, v in obs.items()}
    out = np.zeros_like(obs)
    out[mask] = obs[mask]
    return out


@register_env_backend("maniskill")
def _maniskill_backend(env_id: str, num_envs: int, seed: int | None, **kwargs: Any) -> ManiSkillVecEnv:
    known = fields_of(ManiSkillEnvConfig)
    cfg = build(ManiSkillEnvConfig, {k: v for k, v in kwargs.items() if k in known})
    extra = {k: v for k, v in kwargs.items() if k not in known}
    return ManiSkillVecEnv(env_id, num_envs, seed, cfg, **extra)
