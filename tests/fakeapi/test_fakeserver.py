"""The fake API server as its own process, and the Kubernetes Status bodies it answers with."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from dra_driver.kube import client
from dra_driver.testing.fakeapi import fakeserver


def test_status_bodies_for_unknown_paths_and_methods() -> None:
    with fakeserver.FakeApiServer() as server:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{server.url}/apis/other.k8s.io/v1/things", timeout=5)
        body = json.loads(missing.value.read())
        assert missing.value.code == 404
        assert body["kind"] == "Status" and body["code"] == 404 and body["reason"] == "NotFound"
        request = urllib.request.Request(f"{server.url}/api/v1/nodes/n1", method="DELETE")
        with pytest.raises(urllib.error.HTTPError) as not_allowed:
            urllib.request.urlopen(request, timeout=5)
        assert not_allowed.value.code == 405
        selector = "fieldSelector=metadata.name%3Dx"
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(
                f"{server.url}/apis/resource.k8s.io/v1/resourceslices?{selector}", timeout=5
            )
        assert bad.value.code == 400 and "field label not supported" in bad.value.read().decode()


def test_runs_as_a_subprocess_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dra_driver.testing.fakeapi.fakeserver",
            "--kubeconfig",
            str(kubeconfig),
            "--node",
            "n1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not kubeconfig.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        url = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        assert url.startswith("http://127.0.0.1:")
        kube = client.KubeClient.connect(kubeconfig)
        assert kube.get_node("n1")["metadata"]["name"] == "n1"
        kube.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
