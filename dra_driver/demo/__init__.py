"""``dra-driver demo``: the whole node pipeline on fake GPUs, as a readable walk-through.

Why it exists: it is the project's main job on a machine with no cluster and no GPU. Nothing in
it is mocked beyond what cannot run here: the GPUs come from a fake profile through the same
NVML code path as real ones, the Kubernetes API is the in-memory API server behind real HTTP on
loopback, and the kubelet is :mod:`dra_driver.testing.kubeletsim` talking gRPC over the plugin's
real unix sockets. The node agent runs as its own process, exactly as in the DaemonSet.

The walk-through is a list of scenes (:data:`SCENES`), each in its own module with its own demo
node (:mod:`dra_driver.demo.rig`): the core scene runs on the chosen profile; other scenes pick
the profile their story needs. The exit code is 0 only when every check of every scene passed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from dra_driver.demo import (
    computedomain,
    health,
    mig,
    passthrough,
    sharing,
    topology,
    upgrade,
    walkthrough,
)
from dra_driver.demo import report as reporting
from dra_driver.devices import fake

DEFAULT_PROFILE = "dgx-h100"


class Scene:
    """One chapter of the walk-through: ``run(report, base=..., backend=..., node_name=...,
    driver_name=...)`` with a fresh working directory ``base``."""

    def __init__(self, name: str, run: Callable[..., None], *, own_profile: bool) -> None:
        self.name = name
        self.run = run
        self.own_profile = own_profile  # True: ignores --fake, uses the profile its story needs


# The core scene first; later scenes (topology, health, sharing, MIG) append themselves here.
SCENES: tuple[Scene, ...] = (
    Scene("core", walkthrough.scene, own_profile=False),
    Scene("health", health.scene, own_profile=True),
    Scene("topology", topology.scene, own_profile=True),
    Scene("mig", mig.scene, own_profile=True),
    Scene("sharing", sharing.scene, own_profile=True),
    Scene("compute-domain", computedomain.scene, own_profile=True),
    Scene("passthrough", passthrough.scene, own_profile=True),
    Scene("upgrade", upgrade.scene, own_profile=True),
)


def scene_names() -> list[str]:
    return [s.name for s in SCENES]


def run(
    *,
    backend: fake.FakeBackend,
    node_name: str,
    driver_name: str,
    out: TextIO,
    keep: Path | None = None,
    scenes: list[str] | None = None,
) -> int:
    """Run the walk-through (all scenes, or those named); returns the exit code (0 = every
    check passed)."""
    report = reporting.Report(out=out)
    chosen = [s for s in SCENES if scenes is None or s.name in scenes]
    with _workdir(keep) as base:
        report.say(
            f"dra-driver demo: node {node_name!r}, driver {driver_name!r}, "
            f"fake profile {backend.profile.name!r}; working directory {base}"
        )
        for index, scene in enumerate(chosen):
            if len(chosen) > 1:
                report.say(f"\n#### Scene {index + 1} of {len(chosen)}: {scene.name}")
            scene.run(
                report,
                base=base / scene.name,
                backend=backend,
                node_name=node_name,
                driver_name=driver_name,
            )
    if keep is not None:
        report.say(f"\nkept the working directory: {keep} (sockets, CDI specs, checkpoints, logs)")
    if report.problems:
        report.say(f"\ndemo FAILED: {len(report.problems)} check(s) failed:")
        for problem in report.problems:
            report.say(f"  - {problem}")
        return 1
    report.say("\ndemo OK: every step did what it must.")
    return 0


@contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    # Short path under /tmp: unix socket paths are limited to 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="dra-demo-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
