"""A small strict decoder from YAML/JSON data to dataclasses, for the fake GPU backend's formats.

Why it exists: the fake profile format (:mod:`~dra_driver.devices.fake.profiles`) and the fake MIG
state file (:mod:`~dra_driver.devices.fake.migstate`) were pydantic models, so every fake agent
(the demo, the kind suite, the fleet benchmark's hundred agents) loaded pydantic for them while an
agent on real GPUs does not; that overstated a node agent's memory. Their needs are small: plain
dataclasses whose field types are ``int``/``float``/``str``/``bool``, ``X | None``, ``list``,
``tuple``, ``dict[str, X]``, ``Literal`` and nested dataclasses, plus per-field rules kept in
field metadata by :func:`rules` (an alias such as ``pciBusId``, bounds, a pattern, lengths) and
a converter for a type (``Annotated[int, Parser(parse_bytes)]``).

Decoding is strict: unknown fields, missing required ones, wrong types (a bool is not an int, a
number is not a string), values out of bounds and pattern mismatches are all errors; a field is
accepted under its alias or its Python name (not both at once). Every problem found is collected
with its path (``gpus.1.pciBusId``) and :class:`DecodeError` carries them all. A ``ValueError``
raised by a dataclass's ``__post_init__`` (cross-field checks) is reported at the object's path.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from dra_driver import records

T = TypeVar("T")
_NO_DEFAULT: Any = dataclasses.MISSING


@records.record
class Parser:
    """An ``Annotated`` marker: the raw value goes through ``parse`` (its ValueError is the
    reason given) instead of the type's own check."""

    parse: Callable[[object], Any]


class DecodeError(ValueError):
    """The data does not fit; ``problems`` are ``path: reason`` lines, one per mistake."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def rules(
    *,
    alias: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """A field's decoding rules, as its metadata: ``field(metadata=rules(alias="pciBusId"))``
    (the key in the data, bounds, a pattern the whole value must match, lengths)."""
    return {
        "alias": alias,
        "ge": ge,
        "le": le,
        "pattern": re.compile(pattern) if pattern else None,
        "min_length": min_length,
        "max_length": max_length,
    }


def decode(cls: type[T], data: object) -> T:
    """``data`` (parsed YAML or JSON) as a ``cls``; :class:`DecodeError` lists every problem."""
    problems: list[str] = []
    value = _decode(cls, data, "", problems)
    if problems:
        raise DecodeError(problems)
    return typing.cast(T, value)


def encode(obj: object, *, by_alias: bool = True, exclude_none: bool = False) -> Any:
    """A dataclass (and what it holds) as plain JSON/YAML data, keys by alias unless told."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for spec in _specs(type(obj)):
            value = getattr(obj, spec.name)
            if value is None and exclude_none:
                continue
            key = spec.key if by_alias else spec.name
            out[key] = encode(value, by_alias=by_alias, exclude_none=exclude_none)
        return out
    if isinstance(obj, list | tuple):
        return [encode(v, by_alias=by_alias, exclude_none=exclude_none) for v in obj]
    if isinstance(obj, dict):
        return {k: encode(v, by_alias=by_alias, exclude_none=exclude_none) for k, v in obj.items()}
    return obj


# ---- internals ----------------------------------------------------------------------------------


class _Bad:
    """Stands for a value that failed (its problems are already recorded)."""


_BAD = _Bad()


@records.record
class _Spec:
    name: str
    key: str  # the alias, or the name
    type: Any
    required: bool
    meta: typing.Mapping[str, Any]


_SPECS: dict[type, list[_Spec]] = {}


def _specs(cls: type) -> list[_Spec]:
    found = _SPECS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = [
            _Spec(
                name=f.name,
                key=f.metadata.get("alias") or f.name,
                type=hints[f.name],
                required=f.default is _NO_DEFAULT and f.default_factory is _NO_DEFAULT,
                meta=f.metadata,
            )
            for f in dataclasses.fields(cls)
        ]
        _SPECS[cls] = found
    return found


def _at(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _problem(path: str, reason: str) -> str:
    return f"{path}: {reason}" if path else reason


def _kind(value: object) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{names.get(type(value), type(value).__name__)} {shown}"


def _decode(tp: Any, data: object, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        parser = next((m for m in args[1:] if isinstance(m, Parser)), None)
        if parser is None:
            return _decode(args[0], data, path, problems)
        try:
            return parser.parse(data)
        except ValueError as exc:
            problems.append(_problem(path, str(exc)))
            return _BAD
    if origin is types.UnionType or origin is typing.Union:
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, data, path, problems)
    if origin is typing.Literal:
        if any(data == a and type(data) is type(a) for a in args):
            return data
        allowed = ", ".join(repr(a) for a in args)
        problems.append(_problem(path, f"must be one of {allowed}, got {_kind(data)}"))
        return _BAD
    if origin in (list, tuple, dict):
        return _container(origin, args, data, path, problems)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _object(tp, data, path, problems)
    return _scalar(tp, data, path, problems)


def _scalar(tp: Any, data: object, path: str, problems: list[str]) -> Any:
    if tp is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    # True is an int to Python, not here: a bool is only a bool.
    if tp in (int, str, bool) and isinstance(data, tp) and (tp is bool) == isinstance(data, bool):
        return data
    wanted = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    problems.append(_problem(path, f"expected {wanted[tp]}, got {_kind(data)}"))
    return _BAD


def _container(origin: Any, args: Any, data: object, path: str, problems: list[str]) -> Any:
    if origin is dict:
        if not isinstance(data, dict):
            problems.append(_problem(path, f"expected a mapping, got {_kind(data)}"))
            return _BAD
        out = {}
        for key, value in data.items():
            if not isinstance(key, str):
                problems.append(_problem(_at(path, key), "keys must be strings"))
                continue
            out[key] = _decode(args[1], value, _at(path, key), problems)
        return out
    if not isinstance(data, list | tuple):
        problems.append(_problem(path, f"expected a list, got {_kind(data)}"))
        return _BAD
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(data) != len(args):
            problems.append(_problem(path, f"expected {len(args)} items, got {len(data)}"))
            return _BAD
        kinds = list(args)
    else:
        kinds = [args[0]] * len(data)
    items = [
        _decode(k, v, _at(path, i), problems)
        for i, (k, v) in enumerate(zip(kinds, data, strict=True))
    ]
    return items if origin is list else tuple(items)


def _object(cls: type, data: object, path: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(_problem(path, f"expected a mapping, got {_kind(data)}"))
        return _BAD
    before = len(problems)
    specs = _specs(cls)
    known = {s.key for s in specs} | {s.name for s in specs}
    for key in data:
        if key not in known:
            accepted = ", ".join(s.key for s in specs)
            problems.append(_problem(_at(path, key), f"unknown field (accepted: {accepted})"))
    kwargs: dict[str, Any] = {}
    for spec in specs:
        given = [k for k in dict.fromkeys((spec.key, spec.name)) if k in data]
        if len(given) > 1:
            problems.append(_problem(_at(path, spec.key), f"given twice, as {' and '.join(given)}"))
            continue
        if not given:
            if spec.required:
                problems.append(_problem(_at(path, spec.key), "required field missing"))
            continue
        where = _at(path, given[0])
        value = _decode(spec.type, data[given[0]], where, problems)
        if value is not _BAD and value is not None:
            _check(spec.meta, value, where, problems)
        kwargs[spec.name] = value
    if len(problems) > before:
        return _BAD
    try:
        return cls(**kwargs)
    except ValueError as exc:
        problems.append(_problem(path, str(exc)))
        return _BAD


def _check(meta: typing.Mapping[str, Any], value: Any, path: str, problems: list[str]) -> None:
    """The field's bounds, lengths and pattern."""
    if meta.get("ge") is not None and value < meta["ge"]:
        problems.append(_problem(path, f"must be at least {meta['ge']}, got {value!r}"))
    if meta.get("le") is not None and value > meta["le"]:
        problems.append(_problem(path, f"must be at most {meta['le']}, got {value!r}"))
    if meta.get("min_length") is not None and len(value) < meta["min_length"]:
        problems.append(_problem(path, f"must have a length of at least {meta['min_length']}"))
    if meta.get("max_length") is not None and len(value) > meta["max_length"]:
        problems.append(_problem(path, f"must have a length of at most {meta['max_length']}"))
    pattern = meta.get("pattern")
    if pattern is not None and not pattern.fullmatch(value):  # the whole value, no newline
        problems.append(_problem(path, f"{value!r} does not match the pattern {pattern.pattern}"))
