"""Runtimes with a watching CDI spec cache (containerd 2, CRI-O) see every spec we write, rewrite
or remove the moment it is complete: real inotify events on the real spec directory, judged by
the cache's own rules (:mod:`.cdicache`). Issue 19: specs linked in from an unnamed file raised
only a create event, which the cache ignores, and every GPU pod failed with "unresolvable CDI
devices" until something else touched the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import inotify_simple
import pytest

from dra_driver.deviceplugin import cdi as dp_cdi
from dra_driver.deviceplugin import inventory as dp_inventory
from dra_driver.devices import fake
from dra_driver.driver import atomicfile

from .cdicache import Op, SpecCache, op_of, triggers_refresh
from .conftest import Node, claim_obj, gpu_config, new_uid, opaque


@pytest.fixture
def cache(node: Node) -> Iterator[SpecCache]:
    """The runtime's cache over /etc/cdi (empty here) and our /var/run/cdi, both existing
    before the runtime starts, as on a node."""
    static = node.cdi_root.parent / "etc-cdi"
    static.mkdir(parents=True, exist_ok=True)
    node.cdi_root.mkdir(parents=True, exist_ok=True)
    with SpecCache([static, node.cdi_root]) as c:
        yield c


def cdi_ids(result: Any) -> list[str]:
    assert result.error == ""
    return [i for d in result.devices for i in d.cdi_device_ids]


def test_a_prepared_claims_spec_is_resolvable_as_soon_as_prepare_returns(
    node: Node, cache: SpecCache
) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0", "gpu-1"]))
    ids = cdi_ids(node.driver.prepare([ref])[ref.uid])
    assert len(ids) == 2
    handled = cache.pump()
    assert cache.unresolvable(ids) == []
    # What made the cache reload: the rename of our temporary file; nothing it had to skip
    # over was ever loaded half-written.
    refreshing = [e for e in handled if e.refreshed]
    assert refreshing and all(e.op & Op.RENAME for e in refreshing)
    assert cache.errors == {}


def test_a_rewritten_spec_is_reloaded_with_its_new_content(node: Node, cache: SpecCache) -> None:
    specs = node.driver.state.specs
    uid = new_uid()
    ref = node.add(claim_obj(name="a", uid=uid, devices=["gpu-3"]))
    ids = cdi_ids(node.driver.prepare([ref])[ref.uid])
    cache.pump()
    first = cache.devices[ids[0]]["full"]
    rewritten = {**first, "containerEdits": {**first["containerEdits"], "env": ["REWRITTEN=1"]}}
    specs.write(uid, rewritten)
    cache.pump()
    assert cache.unresolvable(ids) == []
    assert cache.devices[ids[0]]["full"]["containerEdits"]["env"] == ["REWRITTEN=1"]


def test_an_unprepared_claims_devices_are_gone_from_the_cache(node: Node, cache: SpecCache) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-2"]))
    ids = cdi_ids(node.driver.prepare([ref])[ref.uid])
    cache.pump()
    assert cache.unresolvable(ids) == []
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    handled = cache.pump()
    assert cache.unresolvable(ids) == ids
    assert any(e.refreshed and e.op & Op.REMOVE for e in handled)


def test_claims_with_config_and_several_in_one_call_are_all_visible(
    node: Node, cache: SpecCache
) -> None:
    refs = [
        node.add(
            claim_obj(
                name=f"c{i}",
                uid=new_uid(),
                devices=[f"gpu-{i}"],
                config=[opaque(gpu_config(env={"STEP": str(i)}))],
            )
        )
        for i in range(4)
    ]
    answers = node.driver.prepare(refs)
    ids = [i for ref in refs for i in cdi_ids(answers[ref.uid])]
    cache.pump()
    assert cache.unresolvable(ids) == []


def test_the_device_plugins_static_spec_is_visible(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    root.mkdir()
    resources = dp_inventory.build(
        fake.FakeBackend.from_name("pcie-l4").discover(),
        resource_name="nvidia.com/gpu",
        mig_strategy=dp_inventory.MigStrategy.NONE,
        mig_minors=None,
    )
    units = [d.unit for r in resources for d in r.devices]
    spec = dp_cdi.StaticSpec(root=root, kind="nvidia.com/gpu", units=units, fake_node="/dev/null")
    with SpecCache([root]) as cache:
        assert spec.ensure()
        cache.pump()
        ids = [f"nvidia.com/gpu={d['name']}" for d in spec.spec["devices"]] if spec.spec else []
        assert ids and cache.unresolvable(ids) == []


def test_the_old_unnamed_link_would_stay_invisible(tmp_path: Path) -> None:
    """The control that shows the model can fail: a complete spec linked in from an O_TMPFILE
    file (the write path before issue 19) raises only IN_CREATE, and the cache never loads it."""
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE on this platform")
    root = tmp_path / "cdi"
    root.mkdir()
    spec = {
        "cdiVersion": "0.3.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": "u-gpu-0", "containerEdits": {"env": ["A=1"]}}],
    }
    with SpecCache([root]) as cache:
        try:
            fd = os.open(root, os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o644)
        except OSError:
            pytest.skip("this filesystem has no O_TMPFILE")
        try:
            os.write(fd, (json.dumps(spec) + "\n").encode())
            os.link(f"/proc/self/fd/{fd}", root / "old.json", src_dir_fd=fd, follow_symlinks=True)
        finally:
            os.close(fd)
        handled = cache.pump()
        # The writes went to the unnamed inode (the kernel names it "#<inode>": no .json, so
        # ignored), then one create of the final name: ignored too.
        assert ("old.json", Op.CREATE) in [(e.name, e.op) for e in handled]
        assert not any(e.refreshed for e in handled)
        assert cache.unresolvable(["k8s.gpu.nvidia.com/claim=u-gpu-0"]) != []
        # ...while our write path makes the same spec visible at once.
        renamed = {**spec, "devices": [{"name": "u-gpu-1", "containerEdits": {"env": ["A=1"]}}]}
        atomicfile.write_json(root / "new.json", renamed, durable=False)
        cache.pump()
        assert cache.unresolvable(["k8s.gpu.nvidia.com/claim=u-gpu-1"]) == []


@pytest.mark.parametrize(
    ("mask_names", "name", "expected"),
    [
        (("MOVED_FROM",), ".tmp-x.json.ab12", True),  # rename of our temporary: refresh
        (("MOVED_TO",), "x.json", False),  # a rename's other half is a Create: ignored
        (("CREATE",), "x.json", False),
        (("MODIFY",), "x.json", True),
        (("MODIFY",), ".tmp-x.json.ab12", False),  # writes to a temporary are ignored
        (("DELETE",), "anything", True),
        (("ATTRIB",), "x.json", False),
        (("MODIFY",), "x.yaml", True),
    ],
)
def test_the_model_follows_the_cache_event_rules(
    mask_names: tuple[str, ...], name: str, expected: bool
) -> None:
    mask = 0
    for flag in mask_names:
        mask |= getattr(inotify_simple.flags, flag)
    assert triggers_refresh(op_of(mask), name) is expected
