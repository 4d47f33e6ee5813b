"""A TCP proxy that breaks the connection to the API server the ways networks do.

Why it exists: the node agent must survive API outages, dropped connections and connections
that die silently (a NAT entry or a proxy that forgets them: no FIN, no RST, just no more bytes),
and only a real TCP hop between the real API client and the fake API server
(:mod:`~dra_driver.testing.fakeapi.fakeserver`) shows what the client then does. HTTP-level faults
(5xx, 429, 409, 410) are injected in the in-memory API behind it (``fail_next``); this proxy does
the transport:

- :meth:`FaultProxy.outage`: new connections are refused (nothing listens on the port) and open
  ones are reset; :meth:`FaultProxy.restore` listens again on the same port.
- :meth:`FaultProxy.reset_all`: every open connection is reset (RST), as a restarted server.
- :meth:`FaultProxy.blackhole_all`: every open connection stops forwarding in both directions
  but stays open: the client sees silence, nothing else. New connections work normally.

It listens on 127.0.0.1 (an ephemeral port by default); one thread accepts, two per connection
forward (short ``select`` timeouts, so faults take effect at once).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading

_POLL_S = 0.05


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.request = b""  # the first bytes the client sent (its request line, headers)

    def close(self, *, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if reset:  # SO_LINGER 0: close() sends RST instead of FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``upstream`` (host, port), with injectable faults."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self.port = port
        self.connections = 0  # accepted so far

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._close_listener()
        self.reset_all()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults
    def outage(self) -> None:
        """Refuse new connections and reset open ones, until :meth:`restore`."""
        self._close_listener()
        self.reset_all()

    def restore(self) -> None:
        """Listen again (same port) after :meth:`outage`."""
        if self._listener is None:
            self._listen()

    def reset_all(self) -> int:
        """Reset every open connection; returns how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close(reset=True)
        return len(pairs)

    def blackhole_all(self, *, sent: bytes = b"") -> int:
        """Silence every open connection (kept open, nothing forwarded) whose first request
        contains ``sent`` (e.g. ``b"watch=1"``); returns how many."""
        with self._lock:
            pairs = [p for p in self._pairs if not p.closed.is_set() and sent in p.request]
        for pair in pairs:
            pair.frozen.set()
        return len(pairs)

    def open_connections(self, *, sent: bytes = b"") -> int:
        """Open connections whose first request contains ``sent``."""
        with self._lock:
            return sum(1 for p in self._pairs if not p.closed.is_set() and sent in p.request)

    # ------------------------------------------------------------------ machinery
    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accepting = threading.Thread(
            target=self._accept, args=(listener,), name="fault-proxy", daemon=True
        )
        self._accepting.start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        if self._accepting is not None:
            self._accepting.join(timeout=2)
            self._accepting = None

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set() and self._listener is listener:
            try:
                ready, _, _ = select.select([listener], [], [], _POLL_S)
                if not ready:
                    continue
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(pair, src, dst), name="fault-proxy-pump", daemon=True
                ).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not pair.closed.is_set() and not self._stop.is_set():
                if pair.frozen.is_set():  # silent: hold the connection, forward nothing
                    ready, _, _ = select.select([src], [], [], _POLL_S)
                    if ready and src is pair.client and not src.recv(1, socket.MSG_PEEK):
                        break  # the client gave up on it: the dead connection can go
                    pair.closed.wait(_POLL_S)
                    continue
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready or pair.frozen.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if src is pair.client and len(pair.request) < 4096:
                    pair.request += data[:4096]
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        pair.close()
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
