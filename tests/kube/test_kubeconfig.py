"""Reading kubeconfigs and the in-cluster configuration without the ``kubernetes`` library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.kube import client, clientconfig, kubeconfig
from dra_driver.testing.fakeapi import certs, fakeserver


def write(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> Path:
    doc = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_token_kubeconfig_gives_the_bearer_header(tmp_path: Path) -> None:
    config = kubeconfig.load(write(tmp_path / "kc", {"token": "abc"}))
    assert config is not None
    assert config.host == "https://10.0.0.1:6443"
    assert config.auth_settings() == {"BearerToken": {"value": "Bearer abc"}}


def test_what_the_transport_cannot_do_is_left_to_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    exec_user = {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}
    assert kubeconfig.load(write(tmp_path / "a", exec_user)) is None
    assert kubeconfig.load(write(tmp_path / "b", {"username": "x", "password": "y"})) is None
    proxied = {"server": "https://10.0.0.1:6443", "proxy-url": "http://p:3128"}
    assert kubeconfig.load(write(tmp_path / "c", {}, proxied)) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://p:3128")
    assert kubeconfig.load(write(tmp_path / "d", {"token": "t"})) is None
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert kubeconfig.load(write(tmp_path / "e", {"token": "t"})) is not None


def test_a_missing_context_names_the_file_and_the_context(tmp_path: Path) -> None:
    path = write(tmp_path / "kc", {"token": "t"})
    with pytest.raises(kubeconfig.ConfigError, match=r"kc: no context named 'other'"):
        kubeconfig.load(path, "other")
    with pytest.raises(client.ConfigError, match=r"cannot load kubeconfig .*no context named"):
        client.KubeClient.connect(path, context="other")


def test_in_cluster_reads_the_service_account_and_rereads_a_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("one\n")
    (tmp_path / "ca.crt").write_text("x")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = kubeconfig.in_cluster(tmp_path, env)
    assert config.host == "https://[fd00::1]:443"
    assert config.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert config.auth_settings()["BearerToken"]["value"] == "Bearer one"
    (tmp_path / "token").write_text("two\n")
    assert config.auth_settings()["BearerToken"]["value"] == "Bearer one"  # within a minute
    monkeypatch.setattr(kubeconfig, "TOKEN_REFRESH_S", 0.0)
    assert config.auth_settings()["BearerToken"]["value"] == "Bearer two"
    with pytest.raises(kubeconfig.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        kubeconfig.in_cluster(tmp_path, {})


def test_inline_client_certificates_reach_a_tls_server_without_the_library(
    tmp_path: Path,
) -> None:
    bundle = certs.make_bundle(client_name="system:node:n1")
    with fakeserver.FakeApiServer(tls=bundle) as server:
        server.api.put_node("n1")
        kube = client.KubeClient.connect(server.write_kubeconfig(tmp_path / "kc"))
        try:
            assert isinstance(kube._client, clientconfig.NoLibrary)
            assert kube.get_node("n1")["metadata"]["name"] == "n1"
            kube.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
            assert server.api.get_node("n1")["metadata"]["labels"]["a"] == "b"
        finally:
            kube.close()


def test_a_json_kubeconfig_reads_like_its_yaml_and_loads_no_yaml_parser(tmp_path: Path) -> None:
    """JSON is read with json (no PyYAML in the agent, docs/fleet.md); the same document in YAML
    gives the same configuration; YAML flow style that is not JSON still reads as YAML."""
    user = {"token": "abc", "client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"}
    as_yaml = write(tmp_path / "y", user)
    doc = yaml.safe_load(as_yaml.read_text())
    as_json = tmp_path / "j"
    as_json.write_text("\n " + json.dumps(doc, indent=2))  # JSON may open with white space
    loaded = [kubeconfig.load(p) for p in (as_yaml, as_json)]
    assert loaded[0] is not None and loaded[1] is not None
    settings = [{k: v for k, v in vars(c).items() if k != "_lock"} for c in loaded]
    assert settings[0] == settings[1] and settings[0]["cert_data"] == b"cert"
    assert kubeconfig.parse("{current-context: c, users: []}") == {
        "current-context": "c",
        "users": [],
    }
    probe = (
        "import sys; from pathlib import Path; from dra_driver.kube import kubeconfig; "
        "c = kubeconfig.load(Path(sys.argv[1])); "
        "assert c.auth_settings()['BearerToken']['value'] == 'Bearer abc'; "
        "print('yaml' in sys.modules)"
    )
    for path, holds_yaml in ((as_json, "False"), (as_yaml, "True")):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == holds_yaml, path


def test_a_broken_kubeconfig_names_the_line_and_column(tmp_path: Path) -> None:
    broken = tmp_path / "kc"
    broken.write_text('{"current-context": "c",\n  "users": [}\n')  # neither JSON nor YAML
    problem = "expected the node content, but found '}'"
    with pytest.raises(client.ConfigError) as raised:
        client.KubeClient.connect(broken)
    assert str(raised.value) == (
        f"cannot load kubeconfig {broken}: not valid YAML at line 2, column 13: {problem}"
    )
    with pytest.raises(kubeconfig.ConfigError) as read:
        kubeconfig.load(broken)
    assert str(read.value) == f"kubeconfig {broken}: cannot read it: {problem} at line 2, column 13"
