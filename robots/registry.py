"""Driver and device registries (decorators, not string switches) and typed config building.

    @register_driver("mock")
    class MockArm(Arm):
        config_class = MockArmConfig

    @register_device("mock_world")
    class MockWorld(Device): ...

A spec names ``driver: mock`` and ``kind: arm``; :func:`driver_class` finds the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rlinf_nb.robots.errors import SpecError

T = TypeVar("T")

_DRIVERS: dict[tuple[str, str], type] = {}
_DEVICES: dict[str, type] = {}


def register_driver(name: str, kind: str | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: the class serves ``driver: name`` for its ``kind`` (or the one given)."""

    def decorator(cls: type[T]) -> type[T]:
        k = kind or cls.kind  # type: ignore[attr-defined]
        key = (name, k)
        if key in _DRIVERS and _DRIVERS[key] is not cls:
            raise ValueError(f"register_driver: driver {name!r} for kind {k!r} is already registered")
        _DRIVERS[key] = cls
        cls.driver_name = name  # type: ignore[attr-defined]
        return cls

    return decorator


def register_device(name: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: the class serves ``devices: {<x>: {driver: name}}`` in a spec."""

    def decorator(cls: type[T]) -> type[T]:
        if name in _DEVICES and _DEVICES[name] is not cls:
            raise ValueError(f"register_device: device driver {name!r} is already registered")
        _DEVICES[name] = cls
        cls.driver_name = name  # type: ignore[attr-defined]
        return cls

    return decorator


def _ensure_builtin_drivers() -> None:
    import rlinf_nb.robots.drivers  # noqa: F401  (registers mock, lerobot, sim)


def driver_class(name: str, kind: str, where: str = "driver") -> type:
    _ensure_builtin_drivers()
    try:
        return _DRIVERS[(name, kind)]
    except KeyError:
        known = sorted(d for d, k in _DRIVERS if k == kind)
        raise SpecError(
            f"{where}: no driver {name!r} for kind {kind!r}; drivers for {kind}: {', '.join(known) or '(none)'}"
        ) from None


def device_class(name: str, where: str = "device") -> type:
    _ensure_builtin_drivers()
    try:
        return _DEVICES[name]
    except KeyError:
        raise SpecError(
            f"{where}.driver: no device driver {name!r}; known: {', '.join(sorted(_DEVICES)) or '(none)'}"
        ) from None


def drivers() -> dict[str, list[str]]:
    """Registered drivers: kind -> driver names."""
    _ensure_builtin_drivers()
    out: dict[str, list[str]] = {}
    for d, k in sorted(_DRIVERS):
        out.setdefault(k, []).append(d)
    return out


def build_config(cls: type[T] | None, data: Mapping[str, Any] | None, where: str) -> T | None:
    """``cls(**data)`` with errors that name the spec location, the field and the allowed fields."""
    data = dict(data or {})
    if cls is None:
        if data:
            raise SpecError(f"{where}: this driver takes no config, got fields {sorted(data)}")
        return None
    if isinstance(data, cls):
        return data
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed fields: {sorted(fields)}")
    missing = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in data
    ]
    if missing:
        raise SpecError(f"{where}: missing required field(s) {missing}")
    try:
        return cls(**data)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from None
