"""Typed dataclass configs: one docstring per field, eager validation, clear errors.

A config is a (nested) dataclass whose fields are declared with :func:`param`,
which records the field's doc, whether it may change while a run is live, and
its allowed range or choices. :func:`build` turns a plain mapping (parsed YAML,
keyword overrides) into such a dataclass and raises :class:`ConfigError` naming
the key path, the bad value and what is allowed. The user's mapping is never
mutated; :func:`with_overrides` returns a new config.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad config value: names the key path, the value and what is allowed."""

    def __init__(self, key_path: str, value: Any, allowed: str, line: int | None = None):
        self.key_path = key_path
        self.value = value
        self.allowed = allowed
        self.line = line
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"{key_path or '<root>'}{where}: got {value!r}; {allowed}")

    def __reduce__(self):  # survive pickling across Ray processes with all four fields
        return (ConfigError, (self.key_path, self.value, self.allowed, self.line))


def param(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    live: bool = False,
    range: tuple[float | None, float | None] | None = None,  # noqa: A002 - reads well at call sites
    choices: tuple[Any, ...] | None = None,
) -> Any:
    """Declare a config field.

    Args:
        default: the default value (or use ``factory`` for mutable defaults).
        doc: what the field means, in one sentence; shown in errors and panels.
        live: whether the field may be changed while a run is running (``set_hparams``).
        range: inclusive ``(low, high)`` bounds for numbers; ``None`` on a side means unbounded.
        choices: the allowed values, for strings and enums.
    """
    metadata = {"doc": doc, "live": live, "range": range, "choices": choices}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# ----------------------------------------------------------------------------- YAML with lines


def load_yaml_with_lines(text: str) -> tuple[Any, dict[str, int]]:
    """Parse YAML and return ``(data, lines)`` where ``lines`` maps key paths to 1-based lines.

    A YAML syntax error is re-raised as :class:`ConfigError` with its line.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError("<yaml>", "", f"invalid YAML: {problem}", line=line) from None
    lines: dict[str, int] = {}

    def walk(n: yaml.Node | None, path: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
                lines[child] = key_node.start_mark.line + 1
                walk(value_node, child)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                child = f"{path}[{i}]"
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    walk(node, "")
    data = yaml.safe_load(text) if node is not None else None
    return data, lines


# ----------------------------------------------------------------------------- building


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str, lines: Mapping[str, int]) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses."""
    line = lines.get(path)
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path, lines)
            except ConfigError as exc:
                errors.append(exc)
        names = " or ".join(_type_name(a) for a in args)
        raise ConfigError(path, value, f"expected {names}", line)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(path, value, f"expected a mapping of {tp.__name__} fields", line)
        return build(tp, value, path=path, lines=lines)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(path, value, "expected a list", line)
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{path}[{i}]", lines) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, value, "expected a mapping", line)
        args = typing.get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, val_tp, _join(path, str(k)), lines) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "expected true or false", line)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, value, "expected an integer", line)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, value, "expected a number", line)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, value, "expected a string", line)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(path, value, f"expected {tp.__name__}", line)
    return value


def _check_field(value: Any, field: dataclasses.Field, path: str, lines: Mapping[str, int]) -> None:
    line = lines.get(path)
    choices = field.metadata.get("choices")
    if choices is not None and value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigError(path, value, f"allowed values: {allowed}", line)
    bounds = field.metadata.get("range")
    if bounds is not None and value is not None:
        low, high = bounds
        if (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(path, value, f"allowed range: [{low}, {high}]", line)


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    """The dataclass fields of ``cls`` by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def build(
    cls: type[T], data: Mapping[str, Any] | None, path: str = "", lines: Mapping[str, int] | None = None
) -> T:
    """Build dataclass ``cls`` from ``data``, validating every key and value.

    Raises:
        ConfigError: for an unknown key (with close matches), a wrong type, or a
            value outside its range or choices.
    """
    lines = lines or {}
    data = dict(data or {})
    fields = fields_of(cls)
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            allowed = f"unknown key{hint}; allowed keys: {', '.join(sorted(fields))}"
            raise ConfigError(_join(path, str(key)), data[key], allowed, lines.get(_join(path, str(key))))
    kwargs = {}
    for name, field in fields.items():
        child = _join(path, name)
        if name in data:
            value = _coerce(data[name], hints[name], child, lines)
            _check_field(value, field, child, lines)
            kwargs[name] = value
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(
                child, None, f"required key is missing: {field.metadata.get('doc', '')}", lines.get(path)
            )
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError as exc:
            # validate() names keys relative to its own dataclass: make the path absolute.
            full = _join(path, exc.key_path) if exc.key_path else path
            line = exc.line or lines.get(full) or lines.get(path)
            raise ConfigError(full, exc.value, exc.allowed, line) from None
    return obj


def to_dict(obj: Any) -> Any:
    """A plain (YAML/JSON-ready) copy of a config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def nest_dotted(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"algo.lr": 1e-3}`` -> ``{"algo": {"lr": 1e-3}}`` (double underscores also split)."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.replace("__", ".").split(".")
        cur = nested
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
            if not isinstance(cur, dict):
                raise ConfigError(key, value, f"'{part}' is not a section")
        cur[parts[-1]] = value
    return nested


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: ``base`` with ``update`` merged in recursively."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def with_overrides(obj: T, overrides: Mapping[str, Any]) -> T:
    """A new config: ``obj`` with dotted-key ``overrides`` applied and validated."""
    merged = deep_merge(to_dict(obj), nest_dotted(overrides))
    return build(type(obj), merged)


def live_fields(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every field (by dotted path) that may change while a run is live."""
    out: dict[str, dataclasses.Field] = {}
    hints = typing.get_type_hints(cls)
    for name, field in fields_of(cls).items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            out.update(live_fields(tp, _join(prefix, name)))
        elif field.metadata.get("live"):
            out[_join(prefix, name)] = field
    return out


def parse_bytes(text: str | int) -> int:
    """``"512MiB"`` -> 536870912; plain integers pass through."""
    if isinstance(text, int):
        return text
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30, "": 1}
    s = str(text).strip().lower().removesuffix("b")
    num = s.rstrip("kmgi")
    unit = s[len(num) :]
    if unit not in units:
        raise ValueError(f"cannot parse a size from {text!r}: use e.g. 512MiB or 2GiB")
    return int(float(num) * units[unit])
