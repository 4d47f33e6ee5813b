"""The node agent's start-up does not load what it does not use (docs/fleet.md).

One agent runs per GPU node, so every module it loads costs memory and start-up CPU on every node
of a fleet. The ``kubernetes`` client library (~11 MiB and ~0.25 s of CPU per agent, with
``urllib3``, ``requests``/``oauthlib``, websockets and the dynamic client's ``jsonschema``) is
needed only for configurations the lean transport does not handle; this guards that it does not
creep back into the agent's imports, nor into its client set-up from a kubeconfig."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dra_driver.testing.fakeapi import fakeserver

# Never loaded by the agent with an in-cluster or token/certificate kubeconfig.
CUT = ("kubernetes", "urllib3", "requests", "oauthlib", "websocket", "jsonschema")

AGENT = """
import json, sys
from pathlib import Path
import dra_driver.cli.kubelet_plugin, dra_driver.app  # the entry point and its wiring
import dra_driver.agentparts, dra_driver.nodehealth  # what app.run() builds a real node with
from dra_driver.kube import client, features  # imported by the entry point's run()
from dra_driver.cli import build_parser
args = build_parser(["kubelet-plugin"]).parse_args(["kubelet-plugin", "--node-name", "n1"])
kube = client.KubeClient.connect(Path(sys.argv[1]), connections=2, keepalive_s=30)
kube.close()
print(json.dumps(sorted(sys.modules)))
"""


def test_the_agents_start_up_imports_nothing_it_cut(tmp_path: Path) -> None:
    kubeconfig = fakeserver.write_kubeconfig(tmp_path / "kc", "https://10.0.0.1:6443", token="t")
    proc = subprocess.run(
        [sys.executable, "-c", AGENT, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "dra_driver.kube.client" in loaded and "grpc" in loaded  # it did load the agent
    crept = sorted(m for m in loaded if m.split(".")[0] in CUT)
    assert not crept, f"the node agent imports what docs/fleet.md says it cut: {crept[:10]}"
    fake = sorted(m for m in loaded if m.startswith("dra_driver.devices.fake"))
    assert not fake, f"a real node's agent (no --fake) loads the fake GPU backend: {fake}"
    # Its configuration is JSON here (in a DaemonSet: the in-cluster one): no YAML parser.
    assert "yaml" not in loaded, "a real node's agent loads PyYAML though it reads no YAML"
