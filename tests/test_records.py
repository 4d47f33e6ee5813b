"""Records behave as ``dataclass(frozen=True, slots=True)``; their frozen methods are shared."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
import weakref

import pytest

from dra_driver import records


@records.record
class Point:
    x: int
    y: str = "a"
    tags: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must not be negative")


@records.record(kw_only=True)
class Named:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    x: int
    y: str = "a"
    tags: tuple[str, ...] = dataclasses.field(default=(), compare=False)


def test_a_record_is_the_frozen_slotted_dataclass_it_replaces() -> None:
    p, ref = Point(1, "b", ("t",)), Reference(1, "b", ("t",))
    assert dataclasses.is_dataclass(p) and Point.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert vars(Point)["__slots__"] == vars(Reference)["__slots__"] == ("x", "y", "tags")
    assert not hasattr(p, "__dict__")
    assert repr(p) == repr(ref).replace("Reference", "Point")
    assert p == Point(1, "b", ("other",)) and p != Point(2, "b")  # tags: compare=False
    assert hash(p) == hash(Point(1, "b")) and p.__eq__(ref) is NotImplemented
    assert Point.__match_args__ == ("x", "y", "tags")
    assert dataclasses.replace(p, x=5) == Point(5, "b")
    assert pickle.loads(pickle.dumps(p)) == p and copy.deepcopy(p) == p
    with pytest.raises(ValueError, match="negative"):
        Point(-1)
    assert Named(name="n").name == "n"
    with pytest.raises(TypeError):
        Named("n")  # type: ignore[call-arg]


def test_assigning_or_deleting_a_field_raises_as_for_a_frozen_dataclass() -> None:
    p = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'y'"):
        del p.y
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'z'"):
        p.z = 1  # type: ignore[attr-defined]
    assert (p.x, p.y) == (1, "a")


def test_every_record_shares_one_pair_and_the_class_slots_replaced_is_freed() -> None:
    """What saves the memory (docs/fleet.md): no per-class frozen methods, whose closures kept
    the pre-slots class alive."""
    assert Point.__setattr__ is Named.__setattr__
    assert Point.__delattr__ is Named.__delattr__
    assert Reference.__setattr__ is not Point.__setattr__

    class Draft:
        x: int

    Draft.__annotations__ = {"x": "int"}
    before = weakref.ref(Draft)
    made = records.record(Draft)
    assert made is not Draft  # slots=True made a new class
    del Draft
    gc.collect()
    assert before() is None, "the class slots=True replaced is still alive"


def test_a_record_may_not_define_its_own_frozen_methods_as_no_frozen_dataclass_may() -> None:
    class Custom:
        x: int

        def __setattr__(self, name: str, value: object) -> None:
            object.__setattr__(self, name, value)

    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__ in class Custom"):
        records.record(Custom)


@records.record
class Flags:
    shown: int
    hidden: str = dataclasses.field(default="h", repr=False)
    unhashed: int = dataclasses.field(default=0, hash=False)
    one: tuple[object, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class FlagsReference:
    shown: int
    hidden: str = dataclasses.field(default="h", repr=False)
    unhashed: int = dataclasses.field(default=0, hash=False)
    one: tuple[object, ...] = ()


@records.record
class Single:
    value: float


@records.record
class Empty:
    pass


@records.record
class Own:
    x: int

    def __repr__(self) -> str:
        return "mine"

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True, slots=True)
class OwnReference:
    x: int

    def __repr__(self) -> str:
        return "mine"

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


@records.record
class OwnHash:
    x: int

    def __hash__(self) -> int:
        return 7


def test_repr_eq_and_hash_are_shared_and_answer_as_the_generated_ones() -> None:
    """The generated ones cost each class its own code (issue 46): one function each, for every
    record, with the dataclass's results (field flags, one field, none, NotImplemented)."""
    assert Flags.__repr__ is Point.__repr__ is Named.__repr__
    assert Flags.__eq__ is Point.__eq__ and Flags.__hash__ is Point.__hash__
    for args in [(1,), (1, "x", 2), (2, "y", 3, ("a", 1))]:
        ours, theirs = Flags(*args), FlagsReference(*args)  # type: ignore[arg-type]
        assert repr(ours) == repr(theirs).replace("FlagsReference", "Flags")
        assert hash(ours) == hash(theirs)  # the same tuple of the same fields is hashed
        assert ours == Flags(*args)  # type: ignore[arg-type]
        assert not ours != Flags(*args)  # noqa: SIM202 - __ne__ from __eq__
    assert Flags(1, unhashed=1) != Flags(1, unhashed=2)  # compared, not hashed
    assert hash(Flags(1, unhashed=1)) == hash(Flags(1, unhashed=2))
    assert Flags(1).__eq__(FlagsReference(1)) is NotImplemented
    nan = float("nan")
    assert Single(nan) == Single(nan)  # the same object: equal in a tuple, as generated
    assert Single(1.0) != Single(2.0) and repr(Single(1.5)) == "Single(value=1.5)"
    assert Empty() == Empty() and hash(Empty()) == hash(()) and repr(Empty()) == "Empty()"


def test_a_record_that_defines_repr_or_eq_keeps_its_own_and_a_cycle_repr_ends() -> None:
    assert repr(Own(1)) == "mine" and Own(1) == Own(2)
    # A written __eq__ with __hash__ = None: frozen dataclasses hash by the fields anyway.
    assert hash(Own(1)) == hash(OwnReference(1)) == hash((1,))
    assert hash(OwnHash(1)) == 7 and OwnHash(1) == OwnHash(1) != OwnHash(2)
    items: list[object] = []
    looped = Flags(1, one=(items,))
    items.append(looped)
    assert repr(looped) == "Flags(shown=1, unhashed=0, one=([...],))"
