"""The line reader of block YAML (dra_driver/yamllines.py): what it accepts it reads exactly as
PyYAML does, and what it does not accept it leaves to PyYAML (``Unusual``), never a different
answer and never an error of its own."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from dra_driver import cli, yamllines, yamlload

KUBECTL_STYLE = """\
apiVersion: v1
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels: {}
    name: n1-gpu.nvidia.com-0
    ownerReferences: []
  spec:
    devices:
    - attributes:
        resource.kubernetes.io/pciBusID:
          string: "0000:18:00.0"
        resource.kubernetes.io/pcieRoot:
          string: pci0000:15
        driverVersion:
          version: 580.95.5
        on:
          bool: yes
        sexagesimal:
          int: 1:30
        'quoted key': 'it''s'
      name: gpu-0
    - name: gpu-1
      empty:
    pool:
      generation: 1
      name: n1
kind: List
"""


def _same(text: str) -> None:
    """The reader gives what PyYAML gives, types included (repr: ``1``, ``True`` and ``1.0`` are
    equal in Python)."""
    assert repr(yamllines.load_all(text)) == repr(list(yaml.safe_load_all(text)))


def test_kubectl_style_text_is_read_as_pyyaml_reads_it() -> None:
    _same(KUBECTL_STYLE)
    got = yamllines.load_all(KUBECTL_STYLE)[0]
    attrs = got["items"][0]["spec"]["devices"][0]["attributes"]
    assert attrs[True] == {"bool": True}  # YAML 1.1, as PyYAML: "on" and "yes" are booleans
    assert attrs["sexagesimal"] == {"int": 90}
    assert attrs["quoted key"] == "it's"
    assert got["items"][0]["spec"]["devices"][1]["empty"] is None


def test_an_exported_fleet_is_read_by_the_line_reader() -> None:
    """What ``slices`` prints (yaml.safe_dump_all, as the capacity benchmark's files) is inside
    the subset: read by the fast path, not left to libyaml."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["slices", "--fake", "dgx-h100", "--node-name", "n1"]) == 0
    text = out.getvalue() * 2  # it starts with ---: two exports, one after the other
    _same(text)
    assert len(yamllines.load_all(text)) == 2 * len(list(yaml.safe_load_all(out.getvalue())))


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\n  b: 2\n",  # a continuation line
        "a: b\n  c\n",  # a multi-line plain scalar
        "a: |\n  text\n",  # a block scalar
        "a: &x 1\nb: *x\n",  # an anchor and an alias
        "a: !!str 1\n",  # a tag
        "a: [1, 2]\n",  # a flow collection
        "a: 1 # comment\n",
        "a: 1\n\nb: 2\n",  # a blank line
        "a:\tb\n",
        "a: é\n",
        "<<: {a: 1}\n",
        "%YAML 1.1\n---\na: 1\n",
        "a: 1\n...\n",
        "",
        "  a: 1\n",  # an indented root
        "a: 'x\n  y'\n",  # a quoted scalar over two lines
        'a: "x\\ty"\n',  # an escape
        "a: b: c\n",  # PyYAML's error
        "- a\nb: 1\n",  # PyYAML's error
        "a: %x\n",  # PyYAML's error: '%' cannot start a plain scalar
        "a: 1\n---\n",  # a last, empty document
        "x" * 1_001 + ": 1\n",  # longer than PyYAML's simple keys
    ],
)
def test_outside_the_subset_is_left_to_pyyaml(text: str) -> None:
    """Then yamlload answers as before the line reader: libyaml's answer, or its error."""
    with pytest.raises(yamllines.Unusual):
        yamllines.load_all(text)
    before = _outcome(_libyaml, text)
    assert _outcome(yamlload.load_all, text) == before


def test_indentless_and_nested_sequences() -> None:
    for text in (
        "a:\n- 1\n- - 2\n  - 3\n-\n- x: 1\n  y:\n  - z\nb: 2\n",
        "- - - a\n    - b\n  - c\n- []\n- {}\n-\n",
        "a:\n  b:\n    c:\n  d: 1\ne:\n",
        "-   a: 1\n    b: 2\n-  x\n",
    ):
        _same(text)


def test_new_empty_collections_each_time() -> None:
    """``[]`` and ``{}`` lines are cached as text but built anew: no two values share one."""
    a, b = yamllines.load_all("a: []\nb: []\n")[0].values()
    assert a == b == [] and a is not b


# The seeded fuzz: random objects dumped by PyYAML in its styles, then mutated line by line.
WORDS = [
    "on", "yes", "1:30", "2024-01-02", "2024-01-02T03:04:05Z", "null", "~", "1", "0x1f", "017",
    "<<", "-a", "a b", "a:b", ".inf", "1e3", "1_000", "=", "a#b", "'q'", "", "x ", "é", "a: b",
    "- x", "---", "...", "[]", "{}", "%x", "@x", "!x", "&a", "*a", "|", ">", "?", "-", "true",
    "0", "-1", "+1", "x" * 90, "a " * 50, "pci0000:15", "0000:18:00.0", "9.0.0", "a\tb", "a'b",
    'a"b', "a\\b", "a:", ":a", "#x", "x]", "`x", "plain", "k", "v",
]  # fmt: skip


def _value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth < 4 and roll < 0.25:
        return {_key(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 4 and roll < 0.45:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice([*WORDS, *WORDS, 7, 123456, True, None, 1.5, float("inf")])


def _key(rng: random.Random) -> Any:
    return rng.choice([*WORDS, 1, True, None, 2.5])


def _mutate(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        line = lines[i]
        op = rng.randrange(7)
        if op == 0:
            lines[i] = " " * rng.randint(1, 3) + line
        elif op == 1:
            lines[i] = line[rng.randint(1, 3) :] if line.startswith(" ") else line
        elif op == 2 and len(lines) > 1:
            del lines[i]
        elif op == 3:
            lines.insert(i, line)
        elif op == 4:
            lines[i] = "- " + line
        elif op == 5:
            lines[i] = line.replace("- ", "", 1)
        else:
            j = rng.randrange(len(line) + 1)
            lines[i] = line[:j] + rng.choice(" :-#'\"\t[]{}&*!|>?,%@") + line[j:]
    return "\n".join(lines)


def _libyaml(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=yaml.CSafeLoader))


def _outcome(load: Any, text: str) -> str:
    try:
        return repr(load(text))
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        return f"error {type(err).__name__}"


def test_fuzz_equal_to_pyyaml_or_left_to_it() -> None:
    rng = random.Random(47)
    accepted = 0
    for _ in range(250):
        docs = [_value(rng, 0) for _ in range(rng.randint(1, 3))]
        docs = [d if isinstance(d, (dict, list)) else {"k": d} for d in docs]
        text = yaml.safe_dump_all(
            docs,
            default_flow_style=rng.choice([False, False, None]),
            indent=rng.choice([2, 3, 4]),
            width=rng.choice([20, 80, 1000]),
            explicit_start=rng.random() < 0.3,
            sort_keys=rng.random() < 0.5,
        )
        for candidate in [text] + [_mutate(rng, text) for _ in range(5)]:
            try:
                got = repr(yamllines.load_all(candidate))
            except yamllines.Unusual:
                continue
            accepted += 1
            assert got == _outcome(lambda t: list(yaml.safe_load_all(t)), candidate), candidate
            assert got == _outcome(_libyaml, candidate), candidate
    assert accepted > 150  # the fuzz reaches the reader, not only its refusals
