"""A node agent loads the opaque-config models and the MPS machinery only for a claim that needs
them (docs/fleet.md: one agent per GPU node, so what every agent loads is paid fleet-wide).

What is checked, precisely: in a fresh interpreter that imports what the agent imports, builds
the driver core on a fake node, prepares, supervises, restarts (recovery) and unprepares one
claim,

* a claim without opaque config loads neither config models module (``configmodels``,
  ``nvidiamodels``) nor any module of ``dra_driver.driver.mps`` but ``lazymps``, no module of
  ours executes an ``import pydantic``, and pydantic is not loaded at all (checkpoint records
  and the fake GPU backend are dataclasses with their own strict decoders);
* a claim with our config loads our models only, one with NVIDIA's MPS config both models and
  MPS, and both are prepared as they ask.

And :class:`~dra_driver.driver.mps.lazymps.LazyMpsClaims` builds the real MPS part exactly when
something on the node needs it (counted with a stand-in).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_driver.driver import claims
from dra_driver.driver.mps import lazymps

from .conftest import gpu_config, opaque

LAZY = ("dra_driver.driver.configmodels", "dra_driver.driver.nvidiamodels")

AGENT = r"""
import builtins, json, sys
from pathlib import Path

importers = set()  # modules of ours that execute an ``import pydantic...``
_import = builtins.__import__


def _track(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] == "pydantic" and globals:
        importers.add(globals.get("__name__", "?"))
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _track
import dra_driver.cli.kubelet_plugin, dra_driver.app  # the entry point and its wiring
from dra_driver.driver import cdi, driver, recovery  # the core the agent runs
from dra_driver import app, logs
from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.testing.fakeapi import memory

base, claim = Path(sys.argv[1]), json.loads(sys.argv[2])
(base / "boot_id").write_text("boot-1\n")
settings = app.PluginSettings(
    node_name="n1", driver_name="gpu.nvidia.com", registry_dir=base / "reg",
    plugins_dir=base / "plugins", cdi_root=base / "cdi", driver_root=base / "root", fake=True,
    boot_id_file=base / "boot_id", cleanup_interval_s=0, publish=False,
)
api = memory.InMemoryApi(use_default_cel=False)
api.put_resource_claim(claim)
ref = claims.ClaimRef(uid=claim["metadata"]["uid"], namespace="default", name="c")
devices = fake.FakeBackend.from_name("dgx-h100").discover()
agent = app.build_driver(settings, devices=devices, api=api, log=logs.get("t"))
error = agent.prepare([ref])[ref.uid].error
[spec] = [json.loads(p.read_text()) for p in (base / "cdi").glob(f"*{ref.uid}*.json")]
agent.state.mps.check()  # a round of MPS supervision
agent.close()
agent = app.build_driver(settings, devices=devices, api=api, log=logs.get("t"))  # recovery
unprepared = agent.unprepare([ref])[ref.uid]
ours = sorted(m for m in importers if m.startswith("dra_driver."))
env = spec["devices"][0]["containerEdits"].get("env", [])
(base / "result.json").write_text(json.dumps({
    "error": error, "unprepared": unprepared, "env": env, "modules": sorted(sys.modules),
    "importers": ours,
}))
"""


def run_agent(tmp_path: Path, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "default",
            "uid": "9e5a1c3c-0d5e-4b7e-9f43-6c1d2a7b8e90",
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "n1",
                            "device": "gpu-3",
                        }
                    ],
                    "config": config or [],
                }
            }
        },
    }
    proc = subprocess.run(
        [sys.executable, "-c", AGENT, str(tmp_path), json.dumps(claim)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    assert (found["error"], found["unprepared"]) == ("", "")
    return found


def mps_modules(modules: list[str]) -> list[str]:
    """The MPS package's modules but its lazy stand-in (``lazymps``) and the package itself."""
    return [
        m
        for m in modules
        if m.startswith("dra_driver.driver.mps.") and m != "dra_driver.driver.mps.lazymps"
    ]


def test_a_claim_without_opaque_config_loads_no_config_model_and_no_mps(tmp_path: Path) -> None:
    found = run_agent(tmp_path)
    assert "dra_driver.driver.state" in found["modules"]  # it did run the driver core
    assert [m for m in LAZY if m in found["modules"]] == []
    assert mps_modules(found["modules"]) == []
    assert "dra_driver.devices.fake.fakemps" not in found["modules"]
    assert found["importers"] == [], "these modules now import pydantic at start-up"
    assert [m for m in found["modules"] if m.split(".")[0] in ("pydantic", "pydantic_core")] == []


def test_our_config_loads_our_models_and_is_applied(tmp_path: Path) -> None:
    params = gpu_config(sharing={"strategy": "TimeSlicing"}, env={"MY_VAR": "x"})
    found = run_agent(tmp_path, [opaque(params)])
    assert "MY_VAR=x" in found["env"]
    assert "dra_driver.driver.configmodels" in found["modules"]
    assert "dra_driver.driver.nvidiamodels" not in found["modules"]
    assert mps_modules(found["modules"]) == []  # time-slicing, and no MPS daemon on the node


def test_nvidias_mps_config_loads_both_models_and_mps(tmp_path: Path) -> None:
    params = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}},
    }
    found = run_agent(tmp_path, [opaque(params)])
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20" in found["env"]
    assert set(LAZY) <= set(found["modules"])
    mps = {"dra_driver.driver.mps.mpsclaims", "dra_driver.driver.mps.daemons"}
    assert mps <= set(found["modules"])


# ---- LazyMpsClaims with a stand-in for the real part ------------------------------------------


class Real:
    """Records what the lazy front passes on."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.daemons = "the daemons"

    def plan(self, ref: object, items: object) -> tuple[tuple[object, ...], dict[str, Any]]:
        self.calls.append("plan")
        return ("need",), {"env": []}

    def check_time_slicing(self, ref: object, uuids: object) -> None:
        self.calls.append("check_time_slicing")

    def acquire(self, ref: object, needs: object, *, time_sliced: object) -> None:
        self.calls.append("acquire")

    def release(self, record: object) -> None:
        self.calls.append("release")

    def check(self) -> None:
        self.calls.append("check")

    def recover(self, prepared: object) -> list[str]:
        self.calls.append("recover")
        return ["from the real one"]


class Store:
    def __init__(self, records: list[Any]) -> None:
        self._records = records

    def records(self) -> list[Any]:
        return self._records


class Dev:
    def __init__(self, daemon: str | None) -> None:
        self.mpsDaemon = daemon


class Rec:
    def __init__(self, *daemons: str | None) -> None:
        self.devices = [Dev(d) for d in daemons]


def lazy(tmp_path: Path, *records: Rec, eager: bool = False) -> tuple[Any, list[Real]]:
    built: list[Real] = []

    def build() -> Real:
        built.append(Real())
        return built[-1]

    front = lazymps.LazyMpsClaims(
        build=build,  # type: ignore[arg-type]
        root=tmp_path / "mps",
        store=Store(list(records)),  # type: ignore[arg-type]
        eager=eager,
    )
    return front, built


REF = claims.ClaimRef(uid="u", namespace="ns", name="c")


def test_nothing_mps_on_the_node_builds_nothing(tmp_path: Path) -> None:
    front, built = lazy(tmp_path, Rec(None))
    (tmp_path / "mps" / "locks").mkdir(parents=True)  # every stop leaves its lock file
    (tmp_path / "mps" / "locks" / "gpu-0.lock").write_text("")
    (tmp_path / "mps" / "daemons").mkdir()
    assert front.recover([Rec(None)]) == []
    front.check()
    front.check_time_slicing(REF, ["GPU-1"])
    front.release(Rec(None, None))
    front.acquire(REF, (), time_sliced=())
    assert front.plan(REF, []) == ((), {})
    assert built == [] and front.loaded is None


@pytest.mark.parametrize(
    "leftover",
    [
        "daemons/gpu-0.json",  # a daemon's record
        "daemons/.gpu-0.json.tmp",  # a temporary one (recovery removes it)
        "gpu-0/pipe/control",  # a daemon's directories without a record
    ],
)
def test_anything_of_a_daemon_on_disk_builds_it_for_recovery_and_checks(
    tmp_path: Path, leftover: str
) -> None:
    path = tmp_path / "mps" / leftover
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    front, built = lazy(tmp_path)
    assert front.recover([]) == ["from the real one"]
    front.check_time_slicing(REF, ["GPU-1"])
    front.check()
    assert [b.calls for b in built] == [["recover", "check_time_slicing", "check"]]


def test_a_record_naming_a_daemon_builds_it(tmp_path: Path) -> None:
    front, built = lazy(tmp_path)
    front.release(Rec(None, "gpu-2"))
    assert [b.calls for b in built] == [["release"]]
    front, built = lazy(tmp_path, Rec("claim-u"))
    front.check()  # the store names a daemon: a missing one must be started
    assert [b.calls for b in built] == [["check"]]
    front, built = lazy(tmp_path)
    assert front.recover([Rec("gpu-1")]) == ["from the real one"]
    assert len(built) == 1


def test_once_built_everything_goes_through_the_real_one(tmp_path: Path) -> None:
    front, built = lazy(tmp_path, eager=True)  # daemons as Pods: strays are on the API server
    assert len(built) == 1 and front.loaded is built[0]
    front.check()
    front.check_time_slicing(REF, [])  # no GPU to time-slice: nothing to ask
    front.check_time_slicing(REF, ["GPU-1"])
    assert front.plan(REF, []) == (("need",), {"env": []})
    assert front.daemons == "the daemons"
    assert built[0].calls == ["check", "check_time_slicing", "plan"]


def test_a_build_that_fails_is_tried_again(tmp_path: Path) -> None:
    tries: list[int] = []

    def build() -> Real:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("no space left")
        return Real()

    front = lazymps.LazyMpsClaims(
        build=build,  # type: ignore[arg-type]
        root=tmp_path / "mps",
        store=Store([]),  # type: ignore[arg-type]
    )
    with pytest.raises(OSError, match="no space left"):
        front.release(Rec("gpu-0"))
    front.release(Rec("gpu-0"))
    assert len(tries) == 2 and front.loaded is not None


def test_an_unreadable_mps_directory_counts_as_something_there(tmp_path: Path) -> None:
    (tmp_path / "mps").write_text("not a directory")
    front, built = lazy(tmp_path)
    front.check()
    assert len(built) == 1
