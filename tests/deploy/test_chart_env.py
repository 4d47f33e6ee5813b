"""Every environment variable the chart sets reaches a flag of ``dra-driver``, with its value.

The chart configures the agents through the flags' environment twins; a renamed twin would
silently fall back to a default in the cluster. Here each rendered container's environment is
put in place and the real argument parser is built and run: each variable must change the
parsed flags to the chart's value.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest

from dra_driver import cli

# Set by the chart for the agent's benefit, but no flag reads them yet: name them here so a new,
# unread variable still fails the test.
NOT_A_FLAG = {
    "POD_NAMESPACE": "informational (log context)",
    "PYTHONOPTIMIZE": "read by the interpreter itself (docs/fleet.md)",
}
# Read, but overridden by another variable the same value set also sets.
SHADOWED = {"POD_IP": "METRICS_ADDRESS"}
FIELD_VALUES = {
    "spec.nodeName": "node-a",
    "metadata.uid": "uid-1",
    "metadata.namespace": "ns",
    "status.podIP": "10.1.2.3",
}


def _parse(env: dict[str, str], argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        return cli.build_parser().parse_args(argv)


def _container_env(ds: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    env = {}
    for e in c["env"]:
        env[e["name"]] = (
            e["value"] if "value" in e else FIELD_VALUES[e["valueFrom"]["fieldRef"]["fieldPath"]]
        )
    return list(c["args"]), env


def _flag_values(ns: argparse.Namespace) -> dict[str, str]:
    return {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in vars(ns).items()
        if k != "handler"
    }


# Every value differs from the CLI's default, so a variable nobody reads cannot go unnoticed.
_PATHS = {
    "registryDir": "/x/registry",
    "pluginsDir": "/x/plugins",
    "cdiRoot": "/x/cdi",
    "driverRoot": "/run/nvidia/driver",
}
_COMMON = {
    "driverName": "gpu.example.com",
    "logging": {"level": "debug", "format": "console"},
    "metrics": {"port": 9400},
    "nodeLabels": {"resyncSeconds": 2.5},
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "kubelet-plugin-real": {**_COMMON, "kubeletPlugin": {**_PATHS, "publishGraceSeconds": 45.5}},
    "kubelet-plugin-fake": {
        **_COMMON,
        "fakeGPU": {"profile": "dgx-h100"},
        "kubeletPlugin": {
            **_PATHS,
            "seamlessUpgrade": True,
            "shareable": "H100",
            "dynamicMig": "H100",
            "publishGraceSeconds": 45.5,
        },
    },
    "kubelet-plugin-auto": {
        **_COMMON,
        "fakeGPU": {"profile": "h100-mig"},
        "kubeletPlugin": {
            **_PATHS,
            "shareable": "auto:A100|H100",
            "dynamicMig": "auto:H100",
            "publishGraceSeconds": 45.5,
        },
    },
    "kubelet-plugin-address": {
        **_COMMON,
        "metrics": {"port": 9400, "address": "::"},
        "kubeletPlugin": {**_PATHS, "publishGraceSeconds": 45.5, "watchAllocations": False},
    },
    "kubelet-plugin-no-node-labels": {
        **_COMMON,
        "kubeletPlugin": {**_PATHS, "publishGraceSeconds": 45.5, "gpuSets": False},
        "nodeLabels": {"enabled": False, "resyncSeconds": 2.5},
    },
    "device-plugin-fake": {
        **_COMMON,
        "kubeletPlugin": {"enabled": False},
        "fakeGPU": {"profile": "pcie-l4"},
        "devicePlugin": {
            "enabled": True,
            "replicas": 3,
            "sharingStrategy": "mps",
            "mpsDir": "/x/mps",
            "migStrategy": "mixed",
            "deviceListStrategy": "envvar",
            "resourceName": "example.com/gpu",
            "devicePluginDir": "/x/dp",
            "cdiRoot": "/x/cdi",
        },
    },
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_chart_variable_sets_a_flag(
    rc: ModuleType, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in (
        "NODE_NAME",
        "FAKE_PROFILE",
        "LOG_LEVEL",
        "LOG_FORMAT",
        "KUBECONFIG",
        "POD_IP",
        "METRICS_ADDRESS",
        "NODE_LABELS",
        "GPU_SETS",
        "WATCH_ALLOCATIONS",
    ):
        monkeypatch.delenv(key, raising=False)
    (ds,) = [m.obj for m in rc.render(VALUE_SETS[name]) if m.obj["kind"] == "DaemonSet"]
    argv, env = _container_env(ds)
    full = _flag_values(_parse(env, argv, monkeypatch))
    unread = []
    for var, value in env.items():
        without = _flag_values(
            _parse({k: v for k, v in env.items() if k != var}, argv, monkeypatch)
        )
        changed = {k: v for k, v in full.items() if without.get(k) != v}
        if not changed:
            if var not in NOT_A_FLAG and SHADOWED.get(var) not in env:
                unread.append(var)
            continue
        assert value in changed.values(), f"{var}={value!r} changed {changed}, not to its value"
    assert unread == [], f"chart sets variables no flag of `{argv[0]}` reads: {unread}"


def test_the_chart_passes_auto_selections_through(
    rc: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_driver.cli import common

    (ds,) = [
        m.obj for m in rc.render(VALUE_SETS["kubelet-plugin-auto"]) if m.obj["kind"] == "DaemonSet"
    ]
    argv, env = _container_env(ds)
    assert (env["SHAREABLE"], env["DYNAMIC_MIG"]) == ("auto:A100|H100", "auto:H100")
    args = _parse(env, argv, monkeypatch)
    shareable, dynamic = common.shareable_from(args), common.dynamic_mig(args)
    assert (shareable.auto, shareable.spec) == (True, "A100|H100")
    assert (dynamic.auto, dynamic.spec) == (True, "H100")
