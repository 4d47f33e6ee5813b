"""What a running node agent has loaded: only what its node and its claims use (docs/fleet.md).

One agent runs per GPU node, so every module it holds is paid on every node of a fleet (#38).
The real agent process (fake GPUs, the fake API server over loopback HTTP) publishes its slices
and prepares and unprepares a claim through the kubelet's gRPC; then it is asked, by a signal
handler the test wraps around ``python -m dra_driver``, which modules it holds. The ComputeDomain
driver, the MPS machinery, pydantic (opaque configs only) and the ``kubernetes`` library must
not be among them; a claim with an opaque config then does load the config models (and still
no MPS), which shows the probe sees lazy loading at all. It runs plain and as the chart runs the
agents, with ``PYTHONOPTIMIZE=2`` (no docstrings, no asserts): the whole path must work there too.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.driver import claims
from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

# Runs the agent as ``python -m dra_driver`` does; SIGUSR1 writes sys.modules to a file.
WRAPPER = """
import json, runpy, signal, sys
out = sys.argv.pop(1)
dump = lambda: {"modules": sorted(sys.modules), "optimize": sys.flags.optimize}
signal.signal(signal.SIGUSR1, lambda *_: open(out, "w").write(json.dumps(dump())))
sys.argv[0] = "dra_driver"
runpy.run_module("dra_driver", run_name="__main__", alter_sys=True)
"""

NOT_LOADED = (
    "kubernetes",
    "urllib3",
    "pydantic",  # and pydantic_core
    "zipfile",  # importlib.resources' readers
    "dra_driver.driver.configmodels",
    "dra_driver.driver.nvidiamodels",
    "dra_driver.driver.mps",  # mps, mpsclaims, mpsrecords, ...
    "dra_driver.devices.fake.fakemps",
    "dra_driver.cdagent",
    "dra_driver.computedomain.nodedriver",
    "dra_driver.computedomain.monitor",
    "encodings.idna",  # a str host in getaddrinfo, or http.server's reverse lookup at bind
    "yaml",  # a JSON kubeconfig (in a DaemonSet: in-cluster) and the profile's JSON twin
)


@pytest.mark.parametrize("optimize", [0, 2])
def test_an_agent_that_served_a_plain_claim_holds_none_of_what_it_did_not_use(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, optimize: int
) -> None:
    agent, kubelet = start_agent(short_dir, apiserver, optimize=optimize)
    try:
        plain = put_claim(apiserver, "plain", "gpu-0", config=None)
        assert kubelet.prepare([plain]).claims[plain.uid].error == ""
        assert kubelet.unprepare([plain]).claims[plain.uid].error == ""
        loaded = modules_of(agent, optimize=optimize)
        assert "dra_driver.driver.checkpoint" in loaded and "grpc" in loaded  # it ran the agent
        held = sorted(m for m in loaded if m.startswith(NOT_LOADED))
        assert not held, f"the agent holds modules it did not use: {held[:10]}"
        configured = put_claim(
            apiserver,
            "configured",
            "gpu-1",
            config={"apiVersion": "gpu.nvidia.com/v1", "kind": "GpuConfig", "env": {"A": "b"}},
        )
        assert kubelet.prepare([configured]).claims[configured.uid].error == ""
        spec = (agent.cdi_root / f"k8s.gpu.nvidia.com-claim_{configured.uid}.json").read_text()
        assert '"A=b"' in spec  # the config was decoded and applied
        loaded = modules_of(agent, optimize=optimize)
        assert {"pydantic", "dra_driver.driver.configmodels"} <= loaded  # loaded once needed
        assert not any(m.startswith("dra_driver.driver.mps") for m in loaded)
    finally:
        kubelet.close()
        agent.kill()


def start_agent(
    base: Path, apiserver: fakeserver.FakeApiServer, *, optimize: int
) -> tuple[PluginProcess, Any]:
    agent = PluginProcess(
        base=base,
        kubeconfig=apiserver.write_kubeconfig(base / "kubeconfig"),
        publish=True,
        env={"PYTHONOPTIMIZE": str(optimize)} if optimize else None,
    )
    assert agent.argv[1:3] == ["-m", "dra_driver"]
    agent.argv[1:3] = ["-c", WRAPPER, str(base / "modules.json")]
    kubelet = KubeletSim(agent.registry_dir)
    agent.start()
    agent.wait_ready(timeout_s=60)
    kubelet.register("gpu.nvidia.com")
    polling.wait_for(
        lambda: bool(apiserver.api.all_resource_slices()), what="the first publish", timeout_s=60
    )
    return agent, kubelet


def modules_of(agent: PluginProcess, *, optimize: int) -> set[str]:
    """The agent's ``sys.modules`` now (its SIGUSR1 handler writes them), checking that it runs
    at the ``optimize`` level asked for."""
    out = Path(agent.argv[3])
    out.unlink(missing_ok=True)
    agent.signal(signal.SIGUSR1)
    polling.wait_for(out.exists, what="the agent's module list", timeout_s=20)
    polling.wait_for(lambda: out.read_text().endswith("}"), what="the whole list", timeout_s=5)
    dumped = json.loads(out.read_text())
    assert dumped["optimize"] == optimize
    return set(dumped["modules"])


def put_claim(
    server: fakeserver.FakeApiServer, name: str, device: str, *, config: dict[str, Any] | None
) -> claims.ClaimRef:
    """A claim allocated ``device`` of pool ``n1``, with ``config`` as its opaque config."""
    uid = str(uuid.uuid4())
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": device}
            ]
        }
    }
    if config is not None:
        allocation["devices"]["config"] = [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": "gpu.nvidia.com", "parameters": config},
            }
        ]
    server.api.put_resource_claim(
        {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            },
            "status": {"allocation": allocation},
        }
    )
    return claims.ClaimRef(uid=uid, namespace="team", name=name)
