"""The typed-config engine: dataclasses ⇄ plain values ⇄ YAML, with field types checked.

It knows no config kinds: a schema module registers how a field selects a subclass
(:func:`register_kinds`, e.g. ``algorithm.name``), which strings stand for a whole object
(:func:`register_shorthand`, e.g. ``credit="shapley"``) and which classes validate themselves
(:func:`checks_itself`). Every error is a one-line :class:`ConfigError` naming the field, the
value and the fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from topologies.errors import MarlError

__all__ = [
    "ConfigError",
    "checks_itself",
    "dump_yaml",
    "from_plain",
    "load_yaml_mapping",
    "register_kinds",
    "register_shorthand",
    "set_path",
    "to_plain",
    "typed",
]


class ConfigError(MarlError, ValueError):
    """An experiment config that cannot run; the message names the field and the fix."""


def drop_default_fields(
    data: Any, old: Any, key: str, kinds: dict[str, type], changed: Any = ()
) -> None:
    """After a change of ``data[key]`` (a kind), drop the fields the new kind lacks that hold
    the old kind's default or null (the rest stay, so building the new kind names them), and
    the fields both have that hold the old kind's default where the new kind's differs (a
    preset's own default wins: ``PPO`` → ``MAPPO`` gives MAPPO's ``critic``), except the
    fields named in ``changed`` (set by the same change)."""
    if not isinstance(data, dict) or data.get(key) == getattr(old, key):
        return
    new_cls = kinds.get(data.get(key))  # type: ignore[arg-type]
    if new_cls is None:
        return  # an unknown kind: building names it
    keep = {f.name for f in dataclasses.fields(new_cls)}
    defaults = to_plain(type(old)())
    try:
        new_defaults = to_plain(new_cls())
    except (TypeError, ConfigError):  # a kind with required fields
        new_defaults = {}
    for name in [k for k in data if k != key and k not in changed]:
        if name not in keep:
            if data[name] is None or data[name] == defaults.get(name):
                del data[name]
        elif name in new_defaults and data[name] == defaults.get(name) != new_defaults[name]:
            del data[name]


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted="a.b"``, creating mappings on the way."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {key!r} is not a mapping")
        node = child
    node[keys[-1]] = value


# ----- YAML files of configs and jobs ------------------------------------------------------------
def dump_yaml(data: dict[str, Any], path: str | Path | None = None) -> str:
    """YAML text of a plain dict (field order kept); also written to ``path`` if given."""
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    if path is not None:
        Path(path).write_text(text)
    return text


def load_yaml_mapping(source: str | Path, what: str, example: str) -> dict[str, Any] | None:
    """The mapping in YAML text or a ``.yaml``/``.yml`` file (None for an empty document).

    Raises:
        ConfigError: a missing file, invalid YAML or a document that is not a mapping; the
            message names ``what`` ("config", "job") and shows ``example`` fields.
    """
    text = str(source)
    if isinstance(source, Path) or ("\n" not in text and text.endswith((".yaml", ".yml"))):
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"{what} file {path} does not exist: give the path of a {what} YAML")
        text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"a {what} YAML must be a mapping ({example})")
    return data


# ----- generic dataclass <-> plain conversion -----------------------------------------------
def to_plain(value: Any) -> Any:
    """A dataclass (nested dataclasses, dicts, lists) as plain YAML-safe values.

    Floats stay floats (``0`` in a ``float`` field is written ``0.0``), so a YAML round trip
    through :func:`from_plain` gives back an equal object.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            floaty = hints[f.name] in (float, float | None)
            if floaty and isinstance(item, int) and not isinstance(item, bool):
                item = float(item)  # 0 and 0.0 must write the same YAML
            out[f.name] = to_plain(item)
        return out
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def typed(obj: Any, where: str) -> None:
    """Check (and normalise) every field of dataclass ``obj`` against its type, in place.

    Called by the configs' ``__post_init__``, so an object built in Python is checked as one
    read from YAML: ``BudgetConfig(iterations=2.5)`` is a :class:`ConfigError`, booleans are
    not numbers, and the YAML shorthands apply (``algorithm="APPO"``). ``where`` names the
    object in errors (``"budget"``; ``""`` for the top level).
    """
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.init:
            value = getattr(obj, f.name)
            new = _coerce(hints[f.name], value, f"{where}.{f.name}" if where else f.name)
            if new is not value:
                object.__setattr__(obj, f.name, new)


def from_plain(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from plain values (:func:`to_plain` output or hand-written YAML).

    Values are checked against the field types (nested dataclasses, lists, dicts, unions,
    ``Literal``); ``where`` names the object in errors (``"config"`` → ``config.algorithm.lr``).
    An instance of ``cls`` is checked the same way (a copy is returned if values change).

    Raises:
        ConfigError: an unknown field (the message lists the valid ones), a wrong type, or a
            value the dataclass itself rejects (a ``ValueError`` from ``__post_init__``).
    """
    if isinstance(data, cls):
        return _checked_instance(data, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; valid fields are {names}")
    hints = _hints(cls)
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _checked_instance(obj: Any, where: str) -> Any:
    hints = _hints(type(obj))
    changes = {}
    for f in dataclasses.fields(obj):
        if f.init:
            value = getattr(obj, f.name)
            new = _coerce(hints[f.name], value, f"{where}.{f.name}")
            if new is not value and (type(new) is not type(value) or new != value):
                changes[f.name] = new
    return dataclasses.replace(obj, **changes) if changes else obj


#: base class → (the field that selects the subclass, kind → class, the default kind);
#: filled by the schema modules (:func:`register_kinds`).
_KINDS: dict[type, tuple[str, dict[str, type], str]] = {}
#: class → how a string stands for it (the YAML shorthands; :func:`register_shorthand`).
_SHORTHANDS: dict[type, typing.Callable[[str], dict[str, Any]]] = {}
#: classes whose own ``check()`` validates every field: an instance is taken as it is.
_CHECKS_ITSELF: set[type] = set()


def register_kinds(base: type, key: str, kinds: dict[str, type], default: str) -> None:
    """Field ``key`` of a mapping read as ``base`` selects its subclass from ``kinds``
    (``default`` when absent): ``{"name": "APPO", ...}`` builds ``APPOAlgo``."""
    _KINDS[base] = (key, kinds, default)


def register_shorthand(cls: type, expand: typing.Callable[[str], dict[str, Any]]) -> None:
    """A string given where ``cls`` is expected stands for ``expand(string)``."""
    _SHORTHANDS[cls] = expand


def checks_itself(cls: type) -> None:
    """An instance of ``cls`` is taken as it is (its own ``check()`` validates every field)."""
    _CHECKS_ITSELF.add(cls)


def _coerce_dataclass(tp: type, value: Any, where: str) -> Any:
    if isinstance(value, str) and tp in _SHORTHANDS:
        value = _SHORTHANDS[tp](value)
    if tp in _CHECKS_ITSELF and isinstance(value, tp):
        return value
    if tp not in _KINDS:
        return from_plain(tp, value, where)
    key, kinds, default = _KINDS[tp]
    if isinstance(value, tp):
        if type(value) not in kinds.values():
            classes = ", ".join(c.__name__ for c in kinds.values())
            raise ConfigError(f"{where}: {type(value).__name__} is a base class: use {classes}")
        return from_plain(type(value), value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    kind = value.get(key, default)
    if kind not in kinds:
        raise ConfigError(
            f"{where}.{key}={kind!r} is not one of {', '.join(map(repr, kinds))}: use one of "
            f"{', '.join(kinds)}"
        )
    cls = kinds[kind]
    fields = {k: v for k, v in value.items() if k != key}
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]} is set but {where}.{key} is {kind!r}, which has no field(s) "
            f"{unknown}: remove them (its fields are {names})"
        )
    return from_plain(cls, fields, where)


def _coerce_union(tp: Any, value: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(arg, value, where)
        except ConfigError as exc:
            errors.append(str(exc))
    if len(errors) == 1:
        raise ConfigError(errors[0])
    kinds = ", ".join(_type_name(a) for a in args)
    raise ConfigError(f"{where} must be {kinds}, got {value!r}")


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    return {dict: "a mapping", list: "a list", str: "a string"}.get(origin or tp, str(tp))


def _coerce_literal(tp: Any, value: Any, where: str) -> Any:
    if value not in typing.get_args(tp):
        choices = ", ".join(map(repr, typing.get_args(tp)))
        raise ConfigError(f"{where}={value!r} is not one of {choices}")
    return value


def _coerce_list(tp: Any, value: Any, where: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where} must be a list, got {value!r}")
    (item,) = typing.get_args(tp)
    return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]


def _coerce_dict(tp: Any, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    _, item = typing.get_args(tp)
    return {str(k): _coerce(item, v, f"{where}.{k}") for k, v in value.items()}


def _coerce_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _coerce_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    return value


def _coerce_float(value: Any, where: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    return float(value)


def _coerce_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


_SCALARS: dict[Any, typing.Callable[[Any, str], Any]] = {
    bool: _coerce_bool,
    int: _coerce_int,
    float: _coerce_float,
    str: _coerce_str,
}
_GENERICS: dict[Any, typing.Callable[[Any, Any, str], Any]] = {
    typing.Union: _coerce_union,
    types.UnionType: _coerce_union,
    Literal: _coerce_literal,
    list: _coerce_list,
    dict: _coerce_dict,
}


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` checked against type ``tp`` (and normalised: ``1`` → ``1.0`` for floats)."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in _GENERICS:
        return _GENERICS[origin](tp, value, where)
    if dataclasses.is_dataclass(tp):
        return _coerce_dataclass(tp, value, where)  # type: ignore[arg-type]
    if tp in _SCALARS:
        return _SCALARS[tp](value, where)
    return value
