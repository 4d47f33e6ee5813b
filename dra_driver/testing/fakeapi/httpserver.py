"""The listening side of the fake API server: connections, TLS handshakes, idle cut-off.

Why it exists apart from the request handling (:mod:`dra_driver.testing.fakeapi.resthandler`):
what a client's connection pool meets — kept-alive connections, TLS with a client certificate,
the handshake on the connection's own thread (never holding up ``accept``), idle connections
closed by the server after a while, and all of them dropped when the server stops — is one
concern, and tests and benchmarks read its counters (connections accepted, TLS sessions
resumed).
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import sys
import threading
from typing import Any

from dra_driver.testing.fakeapi import discovery, memory, requestlog


class Server(http.server.ThreadingHTTPServer):
    """A threading HTTP server that tracks its connections, serves TLS and closes idle ones."""

    daemon_threads = True
    # kube-apiserver (Go's net.Listen) listens with the kernel's somaxconn backlog: socketserver's
    # default of 5 would drop the SYNs of a burst of connections (each then waits 1 s for the
    # client's retransmit), a delay the real server does not have.
    request_queue_size = 4096
    api: memory.InMemoryApi  # what the handler serves
    token: str | None  # the bearer token the handler requires, if any
    bound_node: str | None = None  # the node the token is bound to (impersonation)
    pod_namespaces: frozenset[str] | None = None  # where the token reads Pods as itself
    served: discovery.Served  # resource.k8s.io versions served, access reviews denied
    requests: requestlog.RequestLog  # what was asked, by verb and resource

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[http.server.BaseHTTPRequestHandler],
        *,
        tls: ssl.SSLContext | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        super().__init__(address, handler)
        self.tls = tls
        self.idle_timeout_s = idle_timeout_s
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        self.accepted = 0
        self.resumed = 0

    def stats(self) -> dict[str, int]:
        with self.connections_lock:
            return {
                "connections": self.accepted,
                "tlsResumed": self.resumed,
                "open": len(self.open_connections),
            }

    def get_request(self) -> tuple[socket.socket, Any]:
        request, address = self.socket.accept()
        if self.tls is not None:  # the handshake itself runs on the connection's thread
            request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        return request, address

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.open_connections.add(request)
            self.accepted += 1
        super().process_request(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(10.0)
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError):
                return  # refused (no or a bad client certificate) or gone; closed by the caller
            if request.session_reused:
                with self.connections_lock:
                    self.resumed += 1
        super().finish_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset, broken pipe, TLS cut off) is no server error; others
        are printed."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError | ssl.SSLEOFError):
            return
        super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        """Close kept-alive connections too, as a stopped server's clients would see."""
        with self.connections_lock:
            for conn in list(self.open_connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
