"""Robot specs: which components sit at which paths, with which driver and config.

A spec is YAML (a file, a dict, or a packaged name from ``robots/specs/``)::

    name: mock_arm
    clock: sim                      # sim: simulated time (mock/sim drivers); real: wall clock
    control_hz: 20
    devices:                        # hardware shared by several components
      world: {driver: mock_world, config: {seed: 0}}
    components:
      arm:        {kind: arm, driver: mock, device: world, safety: {max_delta: 0.2}}
      cams/front: {kind: camera, driver: mock, device: world, config: {width: 64, height: 64}}

Swapping hardware changes the ``driver``/``device`` lines only; tasks and policies
address the paths. ``overrides`` patch a spec by dotted key before it is checked:
``{"devices.follower.config.port": "/dev/ttyACM1"}``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rlinf_nb.robots.components import KINDS
from rlinf_nb.robots.errors import SpecError

SPECS_DIR = Path(__file__).resolve().parent / "specs"
_PATH_RE = re.compile(r"^[a-z0-9_\-]+(/[a-z0-9_\-]+)*$")
_TOP_KEYS = {"name", "description", "clock", "control_hz", "devices", "components"}
_COMPONENT_KEYS = {"kind", "driver", "device", "config", "safety"}
_DEVICE_KEYS = {"driver", "config"}


@dataclass
class DeviceSpec:
    """Hardware shared by components (one motor bus, one mock world)."""

    name: str
    """Name components refer to with ``device: <name>``."""
    driver: str
    """Registered device driver (``mock_world``, ``lerobot``...)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Fields of the device driver's config dataclass."""


@dataclass
class ComponentSpec:
    """One component at one path."""

    path: str
    """Address in the robot tree: ``arm``, ``left/arm``, ``cams/wrist``."""
    kind: str
    """``arm``, ``gripper``, ``hand``, ``camera``, ``mobile_base``, ``teleop`` or ``scene``."""
    driver: str
    """Registered driver for that kind (``mock``, ``lerobot``...)."""
    device: str | None = None
    """Name of a shared device in ``devices``, when the driver needs one."""
    config: dict[str, Any] = field(default_factory=dict)
    """Fields of the driver's config dataclass."""
    safety: dict[str, Any] | None = None
    """Arms only: fields of :class:`~rlinf_nb.robots.safety.SafetyConfig` (defaults apply when absent)."""


@dataclass
class RobotSpec:
    """A whole robot: devices plus a tree of components."""

    name: str
    """Robot name (used in reports and as the Ray resource name later)."""
    components: list[ComponentSpec]
    """Components, in the order they connect."""
    devices: list[DeviceSpec] = field(default_factory=list)
    """Shared hardware."""
    clock: str = "real"
    """``real`` (wall clock; hardware) or ``sim`` (simulated time; mock and sim drivers)."""
    control_hz: float = 20.0
    """Control rate of one env step / ``robot.tick()``."""
    description: str = ""
    """Free text."""
    source: str = "<dict>"
    """Where the spec came from (file path, packaged name or ``<dict>``) for messages."""

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.components]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> RobotSpec:
        where = f"robot spec {source}"
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: expected a mapping at the top, got {type(data).__name__}")
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_TOP_KEYS)}")
        clock = data.get("clock", "real")
        if clock not in ("real", "sim"):
            raise SpecError(f"{where}: clock must be 'real' or 'sim', got {clock!r}")
        hz = float(data.get("control_hz", 20.0))
        if not hz > 0:
            raise SpecError(f"{where}: control_hz must be > 0, got {data.get('control_hz')!r}")
        devices = []
        for name, d in (data.get("devices") or {}).items():
            dwhere = f"{where}: devices.{name}"
            if not isinstance(d, Mapping) or "driver" not in d:
                raise SpecError(f"{dwhere}: expected a mapping with a 'driver' key, got {d!r}")
            bad = sorted(set(d) - _DEVICE_KEYS)
            if bad:
                raise SpecError(f"{dwhere}: unknown key(s) {bad}; allowed: {sorted(_DEVICE_KEYS)}")
            devices.append(DeviceSpec(str(name), str(d["driver"]), dict(d.get("config") or {})))
        device_names = {d.name for d in devices}
        raw_components = data.get("components") or {}
        if not isinstance(raw_components, Mapping) or not raw_components:
            raise SpecError(f"{where}: 'components' must be a non-empty mapping of path -> component")
        components = []
        for path, c in raw_components.items():
            cwhere = f"{where}: components.{path}"
            path = str(path)
            if not _PATH_RE.match(path):
                raise SpecError(
                    f"{cwhere}: path {path!r} must be lowercase names joined by '/', like 'left/arm'"
                )
            if not isinstance(c, Mapping):
                raise SpecError(f"{cwhere}: expected a mapping, got {c!r}")
            bad = sorted(set(c) - _COMPONENT_KEYS)
            if bad:
                raise SpecError(f"{cwhere}: unknown key(s) {bad}; allowed: {sorted(_COMPONENT_KEYS)}")
            for key in ("kind", "driver"):
                if key not in c:
                    raise SpecError(f"{cwhere}: missing '{key}'")
            if c["kind"] not in KINDS:
                raise SpecError(f"{cwhere}.kind: {c['kind']!r} is not a kind; allowed: {sorted(KINDS)}")
            if c.get("device") is not None and c["device"] not in device_names:
                raise SpecError(
                    f"{cwhere}.device: no device {c['device']!r} in 'devices' "
                    f"(defined: {sorted(device_names) or 'none'})"
                )
            if c.get("safety") is not None and c["kind"] != "arm":
                raise SpecError(f"{cwhere}.safety: only arms take a safety config (this is a {c['kind']})")
            components.append(
                ComponentSpec(
                    path,
                    str(c["kind"]),
                    str(c["driver"]),
                    c.get("device"),
                    dict(c.get("config") or {}),
                    None if c.get("safety") is None else dict(c["safety"]),
                )
            )
        paths = [c.path for c in components]
        for p in paths:
            for q in paths:
                if q.startswith(p + "/"):
                    raise SpecError(f"{where}: {p!r} is a component, so it cannot also be a folder of {q!r}")
        return cls(
            name=str(data.get("name") or source),
            components=components,
            devices=devices,
            clock=clock,
            control_hz=hz,
            description=str(data.get("description", "")),
            source=source,
        )


def packaged_specs() -> list[str]:
    """Names of the specs shipped in ``robots/specs/``."""
    return sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))


def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with each dotted key (``devices.follower.config.port``) set to its value."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise SpecError(f"override {key!r}: {part!r} is not a mapping (it is {nxt!r})")
            node = nxt
        node[parts[-1]] = value
    return out


def load_spec(
    spec: str | Path | Mapping[str, Any] | RobotSpec, overrides: Mapping[str, Any] | None = None
) -> RobotSpec:
    """A :class:`RobotSpec` from a packaged name, a YAML path, a dict, or a RobotSpec."""
    if isinstance(spec, RobotSpec):
        if overrides:
            raise SpecError("load_spec: overrides apply to names, files and dicts, not to a RobotSpec")
        return spec
    if isinstance(spec, Mapping):
        return RobotSpec.from_dict(apply_overrides(dict(spec), overrides or {}), "<dict>")
    text = str(spec)
    if isinstance(spec, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise SpecError(f"robot spec: no file {text!r}; packaged specs: {', '.join(packaged_specs())}")
        source = str(path)
    else:
        path = SPECS_DIR / f"{text}.yaml"
        if not path.is_file():
            raise SpecError(
                f"robot spec: no packaged spec {text!r}; packaged specs: {', '.join(packaged_specs())} "
                "(or give a path to a .yaml file)"
            )
        source = text
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"robot spec {source}: invalid YAML: {exc}") from None
    return RobotSpec.from_dict(apply_overrides(data or {}, overrides or {}), source)


__all__ = ["ComponentSpec", "DeviceSpec", "RobotSpec", "apply_overrides", "load_spec", "packaged_specs"]
