"""A tiny real HTTP server that serves an in-memory API over the Kubernetes REST paths.

Why it exists: the real client adapter (:mod:`dra_driver.kube.client`) must be tested over real
HTTP — URL building, field selectors, chunked watch streams, Status bodies, preconditions in
DELETE bodies, merge patches of Nodes, connection errors — and no kube-apiserver can run here.
This server speaks exactly the paths the driver uses, backed by
:class:`~dra_driver.testing.fakeapi.memory.InMemoryApi`, on 127.0.0.1 with an ephemeral port; tests
start it in-process or as a subprocess (``python -m dra_driver.testing.fakeapi.fakeserver``) and
point a kubeconfig at it.

Like a real API server it can serve TLS and require a client certificate (``tls``, a bundle from
:mod:`dra_driver.testing.fakeapi.certs`; the TLS handshake runs on the connection's own thread),
and close kept-alive connections that stay idle (``idle_timeout_s``; kube-apiserver closes them
after 90 s). It counts the connections it accepted and the TLS sessions resumed (``stats``, also
served at ``/fakeapi/stats``) so tests and benchmarks can see handshakes. What each request
does is :mod:`.resthandler`'s; this module is the server object, its kubeconfig and its CLI.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.testing.fakeapi import (
    discovery,
    featuregates,
    httpserver,
    memory,
    requestlog,
    resthandler,
)

if TYPE_CHECKING:
    from dra_driver.testing.fakeapi import certs


class FakeApiServer:
    """Serve ``api`` on 127.0.0.1:<ephemeral port> in a background thread."""

    def __init__(
        self,
        api_: memory.InMemoryApi | None = None,
        *,
        port: int = 0,
        token: str | None = None,
        tls: certs.Bundle | None = None,
        idle_timeout_s: float | None = None,
        disabled_gates: Iterable[str] | None = None,
        served_versions: Iterable[str] = ("v1",),
        denied: Iterable[tuple[str, str]] = (),
        access_reviews: bool = True,
        requests: requestlog.RequestLog | None = None,
        bound_node: str | None = None,
        pod_namespaces: Iterable[str] | None = None,
    ) -> None:
        """``tls``: serve HTTPS and require a client certificate of that bundle's CA;
        ``idle_timeout_s``: close a kept-alive connection idle that long (None: never);
        ``disabled_gates``: DRA feature gates off in the API served (:mod:`.featuregates`);
        ``served_versions`` of ``resource.k8s.io``, ``(verb, resource)`` access reviews
        ``denied``, or no ``access_reviews`` served at all (:mod:`.discovery`); ``requests``:
        the log requests are counted in (:mod:`.requestlog`; pass the last server's to a
        restarted one to go on counting); ``bound_node``: the node the credentials are bound
        to, the only one a request may impersonate (None: any; :mod:`.impersonation`);
        ``pod_namespaces``: the only namespaces where the token may read Pods as itself, as
        with the default chart's RBAC (None: anywhere)."""
        if api_ is None:
            api_ = memory.InMemoryApi(disabled_gates=disabled_gates or ())
        elif disabled_gates is not None and frozenset(disabled_gates) != api_.disabled_gates:
            raise ValueError("disabled_gates differ from those of the InMemoryApi given")
        self.api = api_
        self.tls = tls
        self._httpd = httpserver.Server(
            ("127.0.0.1", port),
            resthandler.RequestHandler,
            tls=tls.server_context() if tls is not None else None,
            idle_timeout_s=idle_timeout_s,
        )
        self._httpd.api = self.api
        self._httpd.token = token
        self._httpd.bound_node = bound_node
        self._httpd.pod_namespaces = None if pod_namespaces is None else frozenset(pod_namespaces)
        self._httpd.served = discovery.Served.of(served_versions, denied, reviews=access_reviews)
        self.requests = requests or requestlog.RequestLog()
        self._httpd.requests = self.requests
        self.token = token
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    def stats(self) -> dict[str, int]:
        """Connections accepted, TLS sessions resumed, connections open now."""
        return self._httpd.stats()

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.api.end_watches()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def write_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.url, token=self.token, tls=self.tls)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_kubeconfig(
    path: Path, server_url: str, *, token: str | None = None, tls: certs.Bundle | None = None
) -> Path:
    """Write a kubeconfig whose only context points at ``server_url`` (with ``tls``: trusting
    its CA and presenting its client certificate, all inline). It is written as JSON, which is
    YAML too (``kubectl config view -o json``): an agent reads it without PyYAML, as it reads
    its in-cluster configuration in a DaemonSet (docs/fleet.md)."""
    user: dict[str, str] = {"token": token} if token else {}
    cluster: dict[str, str] = {"server": server_url}
    if tls is not None:
        cluster["certificate-authority-data"] = base64.b64encode(tls.ca_pem).decode()
        user["client-certificate-data"] = base64.b64encode(tls.client_cert_pem).decode()
        user["client-key-data"] = base64.b64encode(tls.client_key_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Run a fake API server until SIGTERM/SIGINT; write a kubeconfig for it."""
    parser = argparse.ArgumentParser(prog="python -m dra_driver.testing.fakeapi.fakeserver")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig to write")
    parser.add_argument("--node", action="append", default=[], help="Node object to create")
    parser.add_argument("--token", default=None, help="require this bearer token")
    parser.add_argument(
        "--feature-gates",
        default="",
        help="DRA gates as kube-apiserver takes them (DRADeviceTaints=false,...); default all on",
    )
    args = parser.parse_args(argv)
    try:
        disabled = featuregates.parse(args.feature_gates)
    except ValueError as exc:
        parser.error(str(exc))
    server = FakeApiServer(token=args.token, disabled_gates=disabled)
    for node in args.node:
        server.api.put_node(node)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    server.start()
    tmp = args.kubeconfig.with_suffix(".tmp")
    write_kubeconfig(tmp, server.url, token=args.token)
    tmp.replace(args.kubeconfig)  # appears complete or not at all
    print(server.url, flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
