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
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _frozen_setattr(self: object, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


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
        # A class defining either is refused here, as for any frozen dataclass.
        made = dataclasses.dataclass(frozen=True, slots=True, kw_only=kw_only)(target)
        made.__setattr__ = _frozen_setattr  # type: ignore[method-assign]
        made.__delattr__ = _frozen_delattr  # type: ignore[method-assign]
        return made

    return make if cls is None else make(cls)
