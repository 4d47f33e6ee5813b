"""Frozen records: ``dataclasses.dataclass(frozen=True, slots=True)`` at less memory per class.

Why it exists: one node agent runs per GPU node and holds ~80 frozen record classes (devices,
claims, settings, checkpoint records). Python 3.11's dataclasses give every frozen class its own
generated ``__setattr__`` and ``__delattr__``, and their closures keep alive the class object that
``slots=True`` replaced: ~5 KiB per class, ~0.4 MiB per agent (docs/fleet.md). :func:`record`
makes the very same dataclass (fields, ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__match_args__``, pickling, :func:`dataclasses.replace`, :func:`dataclasses.fields`) and puts one
shared pair in their place: assigning or deleting an attribute of an instance raises
:class:`dataclasses.FrozenInstanceError`, as before; ``object.__setattr__`` (``__post_init__``)
still works.

The generated ``__repr__``, ``__eq__`` and ``__hash__`` are the same kind of cost (each class's
own code objects, compiled from source at every import: ~4 KiB per class, ~0.4 MiB per agent,
issue 46), so a record has shared ones too, driven by one :func:`operator.attrgetter` per class:
the same results as the generated ones (the fields' ``repr``, ``compare`` and ``hash`` flags, the
``NotImplemented`` for another class, the recursion guard of ``repr``), and a class that defines
one of them keeps its own, as with ``dataclass``.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
import typing
from collections.abc import Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _frozen_setattr(self: object, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _values(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The fields ``names`` of an instance as a tuple (as the generated methods compare and hash
    them; ``attrgetter`` of one name returns the bare value)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda obj: (one(obj),)
    return operator.attrgetter(*names)


@reprlib.recursive_repr()
def _record_repr(self: Any) -> str:
    cls = self.__class__
    values = cls._record_repr_values(self)
    shown = ", ".join(f"{n}={v!r}" for n, v in zip(cls._record_repr_names, values, strict=True))
    return f"{cls.__qualname__}({shown})"


def _record_eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__class__._record_eq_values
    return key(self) == key(other)


def _record_hash(self: Any) -> int:
    return hash(self.__class__._record_hash_values(self))


def _shared_methods(made: type, body: dict[str, Any]) -> None:
    """Give ``made`` the shared ``__repr__``, ``__eq__`` and ``__hash__`` where ``body`` (the
    class as written) does not define its own, by ``dataclass``'s rules for frozen classes."""
    fields = dataclasses.fields(made)
    if "__repr__" not in body:
        names = [f.name for f in fields if f.repr]
        made._record_repr_names = tuple(names)  # type: ignore[attr-defined]
        made._record_repr_values = staticmethod(_values(names))  # type: ignore[attr-defined]
        made.__repr__ = _record_repr  # type: ignore[method-assign,assignment]
    if "__eq__" not in body:
        names = [f.name for f in fields if f.compare]
        made._record_eq_values = staticmethod(_values(names))  # type: ignore[attr-defined]
        made.__eq__ = _record_eq  # type: ignore[method-assign,assignment]
    class_hash = body.get("__hash__", dataclasses.MISSING)
    explicit = not (class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in body))
    if not explicit:  # frozen and compared: hashed by the compared fields (or hash=True ones)
        names = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
        made._record_hash_values = staticmethod(_values(names))  # type: ignore[attr-defined]
        made.__hash__ = _record_hash  # type: ignore[method-assign,assignment]


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@typing.dataclass_transform(frozen_default=True)
def record(
    cls: type[T] | None = None, /, *, kw_only: bool = False
) -> type[T] | Callable[[type[T]], type[T]]:
    """``@record`` or ``@record(kw_only=True)`` on a class: a frozen, slotted dataclass."""

    def make(target: type[T]) -> type[T]:
        body = dict(target.__dict__)
        # A class defining __setattr__ or __delattr__ is refused here, as for any frozen
        # dataclass; repr and eq are not generated: the shared ones take their place.
        made = dataclasses.dataclass(
            frozen=True, slots=True, kw_only=kw_only, repr=False, eq=False
        )(target)
        made.__setattr__ = _frozen_setattr  # type: ignore[method-assign]
        made.__delattr__ = _frozen_delattr  # type: ignore[method-assign]
        _shared_methods(made, body)
        return made

    return make if cls is None else make(cls)
