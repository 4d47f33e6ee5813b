"""What a running node agent has loaded: only what its node and its claims use (docs/fleet.md).

One agent runs per GPU node, so every module it holds is paid on every node of a fleet (#38).
The real agent process (fake GPUs, the fake API server over loopback HTTP) publishes its slices
and prepares and unprepares a claim through the kubelet's gRPC; then it is asked, by a signal
handler the test wraps around ``python -m dra_driver``, which modules it holds. The ComputeDomain
driver, the MPS machinery, pydantic (opaque configs only) and the ``kubernetes`` library must
not be among them; a claim with an opaque config then does load the config models (and still
no MPS), which shows the probe sees lazy loading at all. It runs plain and as the chart and the
image run the agents: the chart's ``PYTHONOPTIMIZE`` (no docstrings, no asserts: the whole path
must work there too), the image's ``PYTHONDONTWRITEBYTECODE`` and ``MALLOC_ARENA_MAX``, and
byte-code compiled at the chart's level as the image's build compiles it — where it is missing,
every import compiles from source and the agent keeps ~9 MiB more (issue 46), so the agent must
then have found the byte-code of every module it loaded (``dra_driver.bytecode``).

As the chart runs it, the agent's resident memory is also held to a bar: its own share, its RSS
over the floor of the interpreter and the libraries it cannot do without (``agent_floor.py``'s
probe: gRPC with two servers, structlog, prometheus-client, pynvml), measured in the same run
with the same interpreter and environment, so that neither the machine nor the venv moves it.
Here (the test kit's fake API server over plain HTTP: no TLS connection) the share measured 6.8
MiB with a hand-written kubelet codec in place of the protobuf runtime (1.9 MiB), which was not
taken (docs/fleet.md), so ~8.7 MiB; ``SHARE_MIB`` allows 0.7 MiB over that. From the image's
venv against a TLS server (``benchmarks/agent_rss.py``) the share is ~10 MiB (~50 MiB over a
40.1 MiB floor); the issue's 45 MiB bar would be ~4.9 MiB there: not met (docs/fleet.md).
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import re
import signal
import subprocess
import sys
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
from dra_driver import bytecode
def dump():
    report = bytecode.check()
    missing = list(report.missing) if report else []
    return {"modules": sorted(sys.modules), "optimize": sys.flags.optimize, "missing": missing}
signal.signal(signal.SIGUSR1, lambda *_: open(out, "w").write(json.dumps(dump())))
sys.argv[0] = "dra_driver"
runpy.run_module("dra_driver", run_name="__main__", alter_sys=True)
"""

# The MPS package but its lazy stand-in (lazymps, which the agent always holds).
_MPS = "daemons mpsclaims mpspod mpspodspec mpsprocess mpsrecords mpsrunner mpssteps"
MPS_MODULES = tuple(f"dra_driver.driver.mps.{m}" for m in _MPS.split())
NOT_LOADED = (
    "kubernetes",
    "urllib3",
    "pydantic",  # and pydantic_core
    "zipfile",  # importlib.resources' readers
    "dra_driver.driver.configmodels",
    "dra_driver.driver.nvidiamodels",
    *MPS_MODULES,
    "dra_driver.devices.fake.fakemps",
    "dra_driver.cdagent",
    "dra_driver.computedomain.nodedriver",
    "dra_driver.computedomain.monitor",
    "encodings.idna",  # a str host in getaddrinfo, or http.server's reverse lookup at bind
    "yaml",  # a JSON kubeconfig (in a DaemonSet: in-cluster) and the profile's JSON twin
)


REPO = Path(__file__).resolve().parents[2]
SHARE_MIB = 9.4  # the agent's RSS over the same-run floor, as the chart runs it (see above)


def chart_optimize() -> int:
    """The chart's ``python.optimize`` (its agents' ``PYTHONOPTIMIZE``)."""
    values = (REPO / "deployments/helm/dra-driver/values.yaml").read_text()
    found = re.search(r"^python:\n(?:[ \t]+#.*\n)*[ \t]+optimize:[ \t]*(\d+)", values, re.M)
    assert found
    return int(found.group(1))


def compile_like_the_image(level: int) -> None:
    """Byte-code at levels 0 and ``level`` for every package the agent imports, as the image's
    ``compileall`` has it (the standard library's too, where it may be written)."""
    probe = (
        "import json, sys, dra_driver.app, dra_driver.cli, dra_driver.cli.kubelet_plugin\n"
        "import dra_driver.kubelet.server, dra_driver.testing.fakeapi.fakeserver\n"
        "print(json.dumps(sorted({m.__spec__.origin for m in list(sys.modules.values())\n"
        "    if getattr(m, '__spec__', None) and (m.__spec__.origin or '').endswith('.py')})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    roots: set[Path] = set()
    for origin in json.loads(out.stdout):
        top = Path(origin)
        while (top.parent / "__init__.py").exists():
            top = top.parent
        roots.add(top)
    for root in sorted(roots):
        if root.is_dir():
            compileall.compile_dir(root, quiet=2, optimize=[0, level])
        else:
            compileall.compile_file(root, quiet=2, optimize=[0, level])


@pytest.mark.parametrize("optimize", [0, chart_optimize()])
def test_an_agent_that_served_a_plain_claim_holds_none_of_what_it_did_not_use(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, optimize: int
) -> None:
    if optimize:
        compile_like_the_image(optimize)
    agent, kubelet = start_agent(short_dir, apiserver, optimize=optimize)
    try:
        if optimize:  # as the chart runs it, on the image's byte-code: none compiled from source
            assert dump_of(agent, optimize=optimize)["missing"] == []
        plain = put_claim(apiserver, "plain", "gpu-0", config=None)
        assert kubelet.prepare([plain]).claims[plain.uid].error == ""
        assert kubelet.unprepare([plain]).claims[plain.uid].error == ""
        loaded = modules_of(agent, optimize=optimize)
        assert "dra_driver.driver.checkpoint" in loaded and "grpc" in loaded  # it ran the agent
        if optimize:
            share = rss_mib(agent) - floor_mib(agent)
            print(f"agent share over its floor: {share:.2f} MiB")
            assert share <= SHARE_MIB, f"the agent holds {share:.1f} MiB over its floor"
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
        assert not any(m.startswith(MPS_MODULES) for m in loaded)
    finally:
        kubelet.close()
        agent.kill()


def rss_mib(agent: PluginProcess) -> float:
    assert agent.proc is not None
    status = Path(f"/proc/{agent.proc.pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1)) / 1024  # type: ignore[union-attr]


def floor_mib(agent: PluginProcess) -> float:
    """The RSS of ``benchmarks/agent_floor.py``'s probe with all its steps, run by the agent's
    interpreter in the agent's environment."""
    spec = importlib.util.spec_from_file_location(
        "_agent_floor", REPO / "benchmarks/agent_floor.py"
    )
    assert spec is not None and spec.loader is not None
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    names = [module for _, module in floor.STEPS if module]
    out = subprocess.run(
        [agent.argv[0], "-c", floor.PROBE, *names],
        capture_output=True,
        text=True,
        check=True,
        env=agent.env,
        timeout=60,
    ).stdout
    return int(out.split()[-1]) / 1024


def start_agent(
    base: Path, apiserver: fakeserver.FakeApiServer, *, optimize: int
) -> tuple[PluginProcess, Any]:
    agent = PluginProcess(
        base=base,
        kubeconfig=apiserver.write_kubeconfig(base / "kubeconfig"),
        publish=True,
        # The chart's level with the image's environment (Dockerfile ENV).
        env={
            "PYTHONOPTIMIZE": str(optimize),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2",
        }
        if optimize
        else None,
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
    return set(dump_of(agent, optimize=optimize)["modules"])


def dump_of(agent: PluginProcess, *, optimize: int) -> dict[str, Any]:
    """What the agent's SIGUSR1 handler wrote: its modules, level and missing byte-code."""
    out = Path(agent.argv[3])
    out.unlink(missing_ok=True)
    agent.signal(signal.SIGUSR1)
    polling.wait_for(out.exists, what="the agent's module list", timeout_s=20)
    polling.wait_for(lambda: out.read_text().endswith("}"), what="the whole list", timeout_s=5)
    dumped: dict[str, Any] = json.loads(out.read_text())
    assert dumped["optimize"] == optimize
    return dumped


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
