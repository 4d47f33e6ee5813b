"""The fake backend's strict decoder: one test per rule, each asserting the exact problem text,
so dropping a rule (or blurring its message) fails here."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Any, Literal

import pytest

from dra_driver.devices.fake import strict


def _half(value: object) -> int:
    if not isinstance(value, str) or not value.endswith("/2"):
        raise ValueError(f"{value!r} is not a half like 6/2")
    return int(value[:-2]) // 2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inner:
    count: int = field(metadata=strict.rules(alias="itemCount", ge=1, le=10))
    ratio: float = 0.5


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Outer:
    name: str = field(metadata=strict.rules(pattern=r"[a-z]+", min_length=2, max_length=5))
    flag: bool = False
    half: Annotated[int, strict.Parser(_half)] = 0
    kind: Literal["a", "b"] = "a"
    version: Literal[1] = 1
    inner: Inner | None = None
    items: list[Inner] = field(default_factory=list)
    pair: tuple[int, int] = (0, 0)
    tags: tuple[str, ...] = ()
    by_key: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind == "b" and self.inner is None:
            raise ValueError("kind b needs an inner")


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(strict.DecodeError) as info:
        strict.decode(Outer, data)
    assert str(info.value) == "; ".join(info.value.problems)
    return info.value.problems


ACCEPTED = "name, flag, half, kind, version, inner, items, pair, tags, by_key"


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param({"colour": 1}, f"colour: unknown field (accepted: {ACCEPTED})", id="unknown"),
        pytest.param({}, "name: required field missing", id="required"),
        pytest.param({"name": 5}, "name: expected a string, got an integer 5", id="str-not-int"),
        pytest.param(
            {"inner": {"itemCount": True}},
            "inner.itemCount: expected an integer, got a boolean True",
            id="int-not-bool",
        ),
        pytest.param(
            {"inner": {"itemCount": "3"}},
            "inner.itemCount: expected an integer, got a string '3'",
            id="int-not-str",
        ),
        pytest.param(
            {"inner": {"itemCount": 2.0}},
            "inner.itemCount: expected an integer, got a number 2.0",
            id="int-not-float",
        ),
        pytest.param(
            {"inner": {"itemCount": 2, "ratio": False}},
            "inner.ratio: expected a number, got a boolean False",
            id="float-not-bool",
        ),
        pytest.param({"flag": 1}, "flag: expected true or false, got an integer 1", id="bool"),
        pytest.param({"flag": None}, "flag: expected true or false, got null", id="null"),
        pytest.param(
            {"inner": {"itemCount": 0}}, "inner.itemCount: must be at least 1, got 0", id="ge"
        ),
        pytest.param(
            {"inner": {"itemCount": 11}}, "inner.itemCount: must be at most 10, got 11", id="le"
        ),
        pytest.param(
            {"name": "ab1"}, "name: 'ab1' does not match the pattern [a-z]+", id="pattern"
        ),
        pytest.param(
            {"name": "abc\n"},
            "name: 'abc\\n' does not match the pattern [a-z]+",
            id="pattern-whole-value",
        ),
        pytest.param({"name": "a"}, "name: must have a length of at least 2", id="min-length"),
        pytest.param({"name": "abcdef"}, "name: must have a length of at most 5", id="max-length"),
        pytest.param(
            {"kind": "c"}, "kind: must be one of 'a', 'b', got a string 'c'", id="literal"
        ),
        pytest.param(
            {"version": True}, "version: must be one of 1, got a boolean True", id="literal-type"
        ),
        pytest.param(
            {"inner": {"itemCount": 2, "count": 2}},
            "inner.itemCount: given twice, as itemCount and count",
            id="alias-and-name",
        ),
        pytest.param({"pair": [1, 2, 3]}, "pair: expected 2 items, got 3", id="tuple-length"),
        pytest.param(
            {"pair": [1, "x"]}, "pair.1: expected an integer, got a string 'x'", id="tuple-item"
        ),
        pytest.param({"tags": "a"}, "tags: expected a list, got a string 'a'", id="list"),
        pytest.param({"items": [{}]}, "items.0.itemCount: required field missing", id="list-item"),
        pytest.param({"inner": [1]}, "inner: expected a mapping, got a list", id="mapping"),
        pytest.param({"by_key": [1]}, "by_key: expected a mapping, got a list", id="dict"),
        pytest.param({"by_key": {1: 2}}, "by_key.1: keys must be strings", id="dict-key"),
        pytest.param(
            {"by_key": {"x": "y"}},
            "by_key.x: expected an integer, got a string 'y'",
            id="dict-value",
        ),
        pytest.param({"half": "6/3"}, "half: '6/3' is not a half like 6/2", id="parser"),
        pytest.param({"kind": "b"}, "kind b needs an inner", id="post-init"),
    ],
)
def test_each_rule_names_the_field_and_the_reason(data: dict[str, Any], problem: str) -> None:
    given = data if "name" in data or not data else {"name": "ok", **data}  # {}: name missing
    assert _problems(given) == [problem]


def test_a_post_init_error_deeper_down_is_reported_at_its_path() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Holder:
        outer: Outer

    with pytest.raises(strict.DecodeError, match=r"^outer: kind b needs an inner$"):
        strict.decode(Holder, {"outer": {"name": "ok", "kind": "b"}})


def test_every_problem_is_listed_at_once() -> None:
    problems = _problems({"flag": 2, "pair": [1], "colour": 1})
    assert problems == [
        f"colour: unknown field (accepted: {ACCEPTED})",
        "name: required field missing",
        "flag: expected true or false, got an integer 2",
        "pair: expected 2 items, got 1",
    ]


def test_a_long_value_is_cut_in_the_message() -> None:
    (problem,) = _problems({"name": "ok", "flag": "x" * 100})
    assert problem == "flag: expected true or false, got a string '" + "x" * 36 + "..."


def test_good_data_decodes_by_alias_or_by_name() -> None:
    data = {
        "name": "ok",
        "flag": True,
        "half": "6/2",
        "kind": "b",
        "inner": {"itemCount": 3, "ratio": 1},
        "items": [{"count": 1}],
        "pair": [4, 5],
        "tags": ["x", "y"],
        "by_key": {"k": 1},
    }
    got = strict.decode(Outer, data)
    assert got == Outer(
        name="ok",
        flag=True,
        half=3,
        kind="b",
        inner=Inner(count=3, ratio=1.0),
        items=[Inner(count=1)],
        pair=(4, 5),
        tags=("x", "y"),
        by_key={"k": 1},
    )
    assert isinstance(got.inner and got.inner.ratio, float)  # an int given to a float field


def test_encode_uses_aliases_and_plain_containers() -> None:
    value = Outer(name="ok", inner=Inner(count=3), pair=(1, 2), tags=("t",))
    assert strict.encode(value, exclude_none=True) == {
        "name": "ok",
        "flag": False,
        "half": 0,
        "kind": "a",
        "version": 1,
        "inner": {"itemCount": 3, "ratio": 0.5},
        "items": [],
        "pair": [1, 2],
        "tags": ["t"],
        "by_key": {},
    }
    by_name = strict.encode(Outer(name="ok"), by_alias=False)
    assert by_name["inner"] is None and "by_key" in by_name
    assert strict.encode(Inner(count=2), by_alias=False) == {"count": 2, "ratio": 0.5}
