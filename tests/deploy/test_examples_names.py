"""Every example owns its names: two example files applied to one namespace never collide.

Why it exists: users apply several examples side by side, and the e2e suite creates several
specs in one namespace (``test_agent_restart_keeps_prepared_claims`` creates ``one-gpu`` and
then ``shared-claim-containers``); two files defining the same kind and name make the second
``create`` a 409 AlreadyExists that no cluster can ever pass. Checked for each set of examples
that is applied together: ``deployments/examples/`` (with ``legacy/``), its package-data copy
``dra_driver/examples/`` and the e2e manifests ``e2e/specs/``. The user-facing examples go one
step further: every object of ``NAME.yaml`` is called ``NAME`` or ``NAME-...``, so a new example
cannot take a name another one uses.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SETS = {
    "deployments/examples": REPO / "deployments" / "examples",
    "dra_driver/examples": REPO / "dra_driver" / "examples",
    "e2e/specs": REPO / "e2e" / "specs",
}
# What makes two objects the same object on the API server: group, kind, namespace, name.
Key = tuple[str, str, str, str]


def object_key(obj: dict[str, Any]) -> Key:
    group = str(obj["apiVersion"]).rpartition("/")[0]  # "v1" → core group ""
    meta = obj.get("metadata") or {}
    return group, str(obj["kind"]), str(meta.get("namespace", "")), str(meta["name"])


def owners(folder: Path) -> dict[Key, list[str]]:
    """Each object key defined under ``folder`` → the files (relative paths) that define it."""
    found: dict[Key, list[str]] = defaultdict(list)
    for path in sorted(folder.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found[object_key(doc)].append(str(path.relative_to(folder)))
    return found


def collisions(folder: Path) -> list[str]:
    """One line per object key that more than one file defines (or one file twice)."""
    return [
        f"{kind} {namespace + '/' if namespace else ''}{name}"
        f"{' (' + group + ')' if group else ''} is defined by {', '.join(files)}"
        for (group, kind, namespace, name), files in sorted(owners(folder).items())
        if len(files) > 1
    ]


@pytest.mark.parametrize("label", sorted(EXAMPLE_SETS))
def test_no_two_examples_define_the_same_object(label: str) -> None:
    folder = EXAMPLE_SETS[label]
    assert any(folder.rglob("*.yaml")), f"{label}: no examples found"
    found = collisions(folder)
    assert not found, f"{label}: examples applied to one namespace collide:\n" + "\n".join(found)


@pytest.mark.parametrize("label", ["deployments/examples", "dra_driver/examples"])
def test_every_object_of_an_example_is_named_after_its_file(label: str) -> None:
    folder = EXAMPLE_SETS[label]
    foreign = [
        f"{path.relative_to(folder)}: {doc['kind']} {doc['metadata']['name']}"
        for path in sorted(folder.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
        and doc["metadata"]["name"] != path.stem
        and not doc["metadata"]["name"].startswith(f"{path.stem}-")
    ]
    assert not foreign, f"{label}: objects not named after their example:\n" + "\n".join(foreign)


def test_the_check_finds_a_collision(tmp_path: Path) -> None:
    """Same kind and name in two files collide; another kind, group or namespace does not."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu"},
    }
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(template))
    (tmp_path / "b.yaml").write_text(
        yaml.safe_dump_all(
            [
                {**template, "kind": "ResourceClaim"},
                {**template, "metadata": {"name": "gpu", "namespace": "other"}},
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"}},
            ]
        )
    )
    assert collisions(tmp_path) == []
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text(yaml.safe_dump(template))
    assert collisions(tmp_path) == [
        "ResourceClaimTemplate gpu (resource.k8s.io) is defined by a.yaml, sub/c.yaml"
    ]
