"""Which kubeconfig files are read, and their merge, as kubectl does it: real files in a temp
directory and a real temp HOME (:mod:`dra_driver.kube.configfiles`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import clientconfig, configfiles


def config(
    path: Path,
    *,
    current: str | None = None,
    clusters: dict[str, dict[str, Any]] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
    contexts: dict[str, dict[str, Any]] | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": c} for n, c in (clusters or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
        "contexts": [{"name": n, "context": c} for n, c in (contexts or {}).items()],
    }
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_explicit_kubeconfig_wins_over_kubeconfig_and_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config(home / ".kube" / "config")
    listed = config(tmp_path / "listed")
    env = {"HOME": str(home), "KUBECONFIG": str(listed)}
    assert configfiles.locate(tmp_path / "given", env) == (tmp_path / "given",)
    assert configfiles.locate(None, env) == (listed,)
    assert configfiles.locate(None, {"HOME": str(home)}) == (home / ".kube" / "config",)
    assert configfiles.locate(None, {"HOME": str(tmp_path / "nohome")}) == ()  # in-cluster


def test_kubeconfig_list_skips_missing_files_empty_entries_and_repeats(tmp_path: Path) -> None:
    a, b = config(tmp_path / "a"), config(tmp_path / "b")
    listed = f"{tmp_path}/missing::{b}:{a}:{b}"
    assert configfiles.locate(None, {"KUBECONFIG": listed}) == (b, a)
    # With KUBECONFIG set, ~/.kube/config is not read even when the list's files are missing.
    home = tmp_path / "home"
    config(home / ".kube" / "config")
    with pytest.raises(configfiles.ConfigError) as raised:
        configfiles.locate(None, {"HOME": str(home), "KUBECONFIG": f"{tmp_path}/x:{tmp_path}/y"})
    assert str(raised.value) == (
        f"KUBECONFIG names no file that exists ({tmp_path}/x, {tmp_path}/y)"
    )
    assert configfiles.locate(None, {"HOME": str(home), "KUBECONFIG": ":"}) == (
        home / ".kube" / "config",
    )  # only empty entries: as if unset


def test_merge_first_file_to_set_a_name_or_current_context_wins(tmp_path: Path) -> None:
    first = config(
        tmp_path / "one" / "kc",
        clusters={"k": {"server": "https://first:6443", "certificate-authority": "ca.crt"}},
        users={"u": {"tokenFile": "token", "client-key": "/abs/key"}},
        contexts={"only-first": {"cluster": "k", "user": "u"}},
    )
    second = config(
        tmp_path / "two" / "kc",
        current="shared",
        clusters={"k": {"server": "https://second:6443"}, "k2": {"server": "https://k2:6443"}},
        users={"u": {"token": "second"}, "exec": {"exec": {"command": "bin/plugin"}}},
        contexts={"shared": {"cluster": "k", "user": "u", "namespace": "team"}},
    )
    third = config(tmp_path / "three" / "kc", current="ignored")
    merged = configfiles.merge([(p, configfiles.read(p)) for p in (first, second, third)])
    assert merged["current-context"] == "shared"  # the first file that sets it
    clusters = {e["name"]: e["cluster"] for e in merged["clusters"]}
    assert clusters == {
        "k": {"server": "https://first:6443", "certificate-authority": f"{tmp_path}/one/ca.crt"},
        "k2": {"server": "https://k2:6443"},
    }
    users = {e["name"]: e["user"] for e in merged["users"]}
    assert users["u"] == {"tokenFile": f"{tmp_path}/one/token", "client-key": "/abs/key"}
    assert users["exec"] == {"exec": {"command": f"{tmp_path}/two/bin/plugin"}}
    assert [e["name"] for e in merged["contexts"]] == ["only-first", "shared"]
    assert configfiles.context_namespace(merged, None) == "team"
    assert configfiles.context_namespace(merged, "only-first") is None


def test_merged_kubeconfig_connects_with_the_first_files_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = config(tmp_path / "a", clusters={"k": {"server": "https://first:6443"}})
    second = config(
        tmp_path / "b",
        current="c",
        clusters={"k": {"server": "https://second:6443"}},
        users={"u": {"token": "t"}},
        contexts={"c": {"cluster": "k", "user": "u"}, "d": {"cluster": "k"}},
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path}/gone:{second}")
    client = clientconfig.api_client(None, None, lean=True, pool_size=1)
    assert client.configuration.host == "https://first:6443"
    assert client.configuration.auth_settings() == {"BearerToken": {"value": "Bearer t"}}
    assert clientconfig.namespace(None, None) is None
    with pytest.raises(clientconfig.ConfigError) as raised:
        clientconfig.api_client(None, "nope", lean=True, pool_size=1)
    assert f"kubeconfig {first}:{second} (KUBECONFIG, merged): no context named 'nope'" in str(
        raised.value
    )


def test_a_bad_file_in_the_list_is_named_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = config(tmp_path / "good", current="c")
    bad = tmp_path / "bad"
    bad.write_bytes(b"clusters: [\xff\n")
    monkeypatch.setenv("KUBECONFIG", f"{good}:{bad}")
    with pytest.raises(clientconfig.ConfigError, match=f"^cannot load kubeconfig {bad}: not UTF-8"):
        clientconfig.api_client(None, None, lean=True, pool_size=1)
    (tmp_path / "dir").mkdir()
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/dir:{good}")
    with pytest.raises(
        clientconfig.ConfigError, match=f"^kubeconfig {tmp_path}/dir is not a file$"
    ):
        clientconfig.api_client(None, None, lean=True, pool_size=1)
    unnamed = tmp_path / "unnamed"
    unnamed.write_text(json.dumps({"clusters": [{"cluster": {}}]}))
    monkeypatch.setenv("KUBECONFIG", f"{good}:{unnamed}")
    with pytest.raises(clientconfig.ConfigError, match="unnamed: an entry of clusters has no name"):
        clientconfig.api_client(None, None, lean=True, pool_size=1)


def test_home_config_is_read_and_in_cluster_error_says_what_was_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(clientconfig.ConfigError) as raised:
        clientconfig.api_client(None, None, lean=True, pool_size=1)
    message = str(raised.value)
    assert f"no --kubeconfig, KUBECONFIG not set and no {tmp_path}/.kube/config" in message
    assert "KUBERNETES_SERVICE_HOST" in message
    with pytest.raises(clientconfig.ConfigError, match="--context x: no kubeconfig to take it"):
        clientconfig.api_client(None, "x", lean=True, pool_size=1)
    config(
        tmp_path / ".kube" / "config",
        current="c",
        clusters={"k": {"server": "https://home:6443"}},
        contexts={"c": {"cluster": "k", "namespace": "mine"}},
    )
    client = clientconfig.api_client(None, None, lean=True, pool_size=1)
    assert client.configuration.host == "https://home:6443"
    assert clientconfig.namespace(None, None) == "mine"


def test_merged_kubeconfig_the_transport_cannot_speak_goes_to_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = config(tmp_path / "a", users={"u": {"username": "x", "password": "y"}})
    second = config(
        tmp_path / "b",
        current="c",
        clusters={"k": {"server": "https://library:6443"}},
        users={"u": {"token": "ignored"}},
        contexts={"c": {"cluster": "k", "user": "u"}},
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    client = clientconfig.api_client(None, None, lean=True, pool_size=1)
    try:
        assert not isinstance(client, clientconfig.NoLibrary)  # basic auth: the library's
        assert client.configuration.host == "https://library:6443"
        basic = "Basic eDp5"  # base64 of x:y: the first file's user, not the second's token
        assert client.configuration.api_key == {"BearerToken": basic}
    finally:
        client.close()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_merge_agrees_with_kubectl(tmp_path: Path) -> None:
    """kubectl itself as the reference: the server, user and namespace each context resolves to
    through the same KUBECONFIG list (missing file, overlaps, current-context set late)."""
    first = config(
        tmp_path / "a",
        clusters={"k": {"server": "https://first:6443"}},
        users={"u": {"token": "first"}},
        contexts={"x": {"cluster": "k", "user": "u", "namespace": "nx"}},
    )
    second = config(
        tmp_path / "b",
        current="y",
        clusters={"k": {"server": "https://second:6443"}, "k2": {"server": "https://k2:6443"}},
        users={"u": {"token": "second"}, "u2": {"token": "two"}},
        contexts={"y": {"cluster": "k2", "user": "u"}, "x": {"cluster": "k2", "user": "u2"}},
    )
    listed = f"{tmp_path}/none:{first}:{second}"
    env = {"KUBECONFIG": listed, "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    docs = [(p, configfiles.read(p)) for p in configfiles.locate(None, env)]
    merged = configfiles.merge(docs)
    for context in (None, "x", "y"):
        args = ["kubectl", "config", "view", "--minify", "--raw", "-o", "json"]
        view = subprocess.run(
            [*args, *(["--context", context] if context else [])],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            check=True,
        )
        theirs = json.loads(view.stdout)
        name = context or merged["current-context"]
        assert theirs["current-context"] == name
        ctx = next(c["context"] for c in merged["contexts"] if c["name"] == name)
        cluster = next(c["cluster"] for c in merged["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in merged["users"] if u["name"] == ctx["user"])
        assert theirs["clusters"][0]["cluster"]["server"] == cluster["server"], context
        assert theirs["users"][0]["user"]["token"] == user["token"], context
        assert theirs["contexts"][0]["context"].get("namespace") == ctx.get("namespace")
