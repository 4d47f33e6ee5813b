"""Kubeconfig and in-cluster configuration, read without the ``kubernetes`` client library.

Why it exists: the node agent runs one per GPU node, hundreds to thousands per cluster, and
``import kubernetes`` alone costs each of them ~10 MiB of resident memory and ~0.2 s of CPU at
start (its generated models, ``requests``/``oauthlib``, the dynamic client with ``jsonschema``,
websockets). The agent needed the library only to read its configuration: every request already
goes over :mod:`dra_driver.kube.transport`. This module reads the configurations an agent meets
— the in-cluster service account (the DaemonSet), and kubeconfigs with a bearer token, a token
file or client certificates (tests, benchmarks, ``--kubeconfig``) — into a
:class:`Configuration` carrying the attributes of ``kubernetes.client.Configuration`` that the
transport reads, so the same :func:`~dra_driver.kube.transport.from_configuration` serves both.

What it does not do is handed back to the library (:func:`load` returns None): exec credential
plugins, auth providers, basic auth, and a proxy (``proxy-url`` or ``HTTPS_PROXY`` not exempted
by ``NO_PROXY``), which the transport does not speak.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S = 60.0  # bound service-account tokens rotate; re-read the file this often


class ConfigError(Exception):
    """The configuration is missing or unusable; the message says what and where."""


class Configuration:
    """The attributes of ``kubernetes.client.Configuration`` that the transport reads."""

    def __init__(
        self,
        *,
        host: str,
        ssl_ca_cert: str | None = None,
        ca_cert_data: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        cert_data: bytes | None = None,
        key_data: bytes | None = None,
        verify_ssl: bool = True,
        tls_server_name: str | None = None,
        token: str | None = None,
        token_file: Path | None = None,
    ) -> None:
        self.host = host
        self.ssl_ca_cert = ssl_ca_cert
        self.ca_cert_data = ca_cert_data
        self.cert_file = cert_file
        self.key_file = key_file
        self.cert_data = cert_data  # PEM, when the kubeconfig has them inline
        self.key_data = key_data
        self.verify_ssl = verify_ssl
        self.tls_server_name = tls_server_name
        self.assert_hostname = None
        self.proxy = None
        self._token = token
        self._token_file = token_file
        self._token_read = 0.0
        self._lock = threading.Lock()

    def auth_settings(self) -> dict[str, dict[str, str]]:
        """As the library's: ``{"BearerToken": {"value": "Bearer ..."}}`` (or nothing)."""
        token = self._current_token()
        return {"BearerToken": {"value": f"Bearer {token}"}} if token else {}

    def _current_token(self) -> str | None:
        if self._token_file is None:
            return self._token
        with self._lock:
            now = time.monotonic()
            if self._token is None or now - self._token_read >= TOKEN_REFRESH_S:
                try:
                    self._token = self._token_file.read_text(encoding="utf-8").strip()
                    self._token_read = now
                except OSError:
                    pass  # keep the last one; the server says 401 if it expired
            return self._token


def in_cluster(
    root: Path = SERVICE_ACCOUNT, environ: dict[str, str] | None = None
) -> Configuration:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``PORT``, its token (re-read
    every :data:`TOKEN_REFRESH_S`) and CA."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError(
            "in-cluster configuration: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
            "are not set (not running in a pod? pass --kubeconfig)"
        )
    token_file = root / "token"
    if not token_file.is_file():
        raise ConfigError(f"in-cluster configuration: no service account token at {token_file}")
    bracketed = f"[{host}]" if ":" in host else host
    ca = root / "ca.crt"
    return Configuration(
        host=f"https://{bracketed}:{port}",
        ssl_ca_cert=str(ca) if ca.is_file() else None,
        token_file=token_file,
    )


def in_cluster_namespace(root: Path = SERVICE_ACCOUNT) -> str | None:
    """The pod's own namespace, as its service account states it (None outside a pod)."""
    try:
        return (root / "namespace").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class ParseError(ValueError):
    """A kubeconfig's text is neither JSON nor YAML; ``where`` is `` at line L, column C`` when
    known, ``problem`` the parser's own words."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(f"{problem}{where}")
        self.problem, self.where = problem, where


def parse(text: str) -> Any:
    """A kubeconfig's document. JSON (``kubectl config view -o json`` writes one; JSON is YAML)
    is read with :mod:`json`; only YAML loads PyYAML, so an agent configured in-cluster or by a
    JSON kubeconfig never holds it (~1 MiB per agent, docs/fleet.md)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML's flow style, or broken: YAML decides, and says what is wrong
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ParseError(problem, where) from exc


def load(
    path: Path, context: str | None = None, *, doc: Any = None, where: str | None = None
) -> Configuration | None:
    """The configuration of ``context`` (default: the current one) in the kubeconfig at
    ``path`` (or in ``doc``, that file already parsed, or several merged: ``where`` then names
    them in messages); None when it needs what only the library does (see the module
    docstring)."""
    label = where or f"kubeconfig {path}"
    if doc is None:
        try:
            doc = parse(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{label}: cannot read it: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{label}: not a kubeconfig (no mapping at the top)")
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(f"{label}: no current-context and no context given")
    ctx = _named(doc, "contexts", name, "context", label)
    cluster = _named(doc, "clusters", ctx.get("cluster"), "cluster", label)
    user = _named(doc, "users", ctx.get("user"), "user", label) if ctx.get("user") else {}
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"{label}: cluster {ctx.get('cluster')!r} has no server")
    if set(user) & {"exec", "auth-provider", "username", "password"}:
        return None  # credential plugins and basic auth: the library's
    if cluster.get("proxy-url") or _env_proxy(server):
        return None
    base = path.parent

    def file(value: Any) -> str | None:
        return str(base / str(value)) if value else None

    token_file = user.get("tokenFile")
    return Configuration(
        host=server,
        ssl_ca_cert=file(cluster.get("certificate-authority")),
        ca_cert_data=_decoded(cluster, "certificate-authority-data", label),
        cert_file=file(user.get("client-certificate")),
        key_file=file(user.get("client-key")),
        cert_data=_raw(user, "client-certificate-data", label),
        key_data=_raw(user, "client-key-data", label),
        verify_ssl=not cluster.get("insecure-skip-tls-verify"),
        tls_server_name=cluster.get("tls-server-name") or None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=base / str(token_file) if token_file else None,
    )


def _named(doc: dict[str, Any], section: str, name: Any, key: str, label: str) -> dict[str, Any]:
    for entry in doc.get(section) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if isinstance(value, dict):
                return value
    raise ConfigError(f"{label}: no {key} named {name!r} in {section}")


def _raw(entry: dict[str, Any], key: str, label: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as exc:
        raise ConfigError(f"{label}: {key} is not base64: {exc}") from exc


def _decoded(entry: dict[str, Any], key: str, label: str) -> str | None:
    raw = _raw(entry, key, label)
    return raw.decode("ascii", errors="replace") if raw is not None else None


def _env_proxy(server: str) -> bool:
    """Whether the environment sends requests to ``server`` through a proxy."""
    url = urllib.parse.urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    if not proxies.get(url.scheme):
        return False
    bypass = getattr(urllib.request, "proxy_bypass_environment")  # noqa: B009 (not in typeshed)
    return not bypass(url.hostname or "", proxies)
