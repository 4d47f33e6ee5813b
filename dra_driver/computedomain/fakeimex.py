"""A stand-in IMEX daemon for fake GPU nodes: ``python -m dra_driver.computedomain.fakeimex``.

Why it exists: ComputeDomains must work end to end without NVLink hardware (the demo, kind
clusters, the tests), and what the rest of the driver depends on is the daemon's contract, not
its memory brokering: it runs on the directory the node agent prepared (``/imexd`` in its pod),
reads ``imexd.cfg`` (``SERVER_PORT``, ``IMEX_NODE_CONFIG_FILE``) and the nodes config it names,
listens on its own address (``IMEX_NODE_IP``, from its CDI spec) and port, and is *ready* once
every peer in the nodes config answers it — for the same domain (``COMPUTE_DOMAIN_UUID``). It
re-reads the nodes config as it changes (peers join and leave) and reports in ``status.json``
(:func:`dra_driver.computedomain.imexconfig.write_status`) every ``--interval``, which the agent
turns into the node's readiness. It exits when its directory goes (its claim was unprepared) or
on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path

from dra_driver import computedomain as cd
from dra_driver import logs
from dra_driver.computedomain import imexconfig

_log = logs.get("fake-imex")


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(256).decode(errors="replace").strip()
        domain: str = self.server.domain  # type: ignore[attr-defined]
        answer = "OK" if line == f"IMEX {domain}" else "WRONG-DOMAIN"
        self.wfile.write(f"{answer} {domain}\n".encode())


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def ask(address: str, port: int, domain: str, timeout_s: float = 0.5) -> bool:
    """Whether the daemon at ``address:port`` answers for ``domain``."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as conn:
            conn.sendall(f"IMEX {domain}\n".encode())
            conn.settimeout(timeout_s)
            reply = conn.makefile("rb").readline(256).decode(errors="replace")
    except OSError:
        return False
    return reply.startswith("OK ")


def nodes_file(directory: Path, config: dict[str, str]) -> Path:
    """The nodes config the daemon's config names, seen from here (``/imexd/...`` is
    ``directory`` when the stand-in runs outside a container)."""
    named = config.get("IMEX_NODE_CONFIG_FILE") or f"{cd.DAEMON_DIR}/{imexconfig.NODES}"
    if named.startswith(cd.DAEMON_DIR + "/"):
        return directory / named[len(cd.DAEMON_DIR) + 1 :]
    return Path(named)


def run(
    directory: Path, *, own_ip: str, domain: str, interval_s: float, stop: threading.Event
) -> int:
    config = imexconfig.read_config(directory)
    port = int(config.get("SERVER_PORT") or cd.DEFAULT_IMEX_PORT)
    try:
        server = _Server((own_ip, port), _Handler)
    except OSError as exc:
        _log.error("fake IMEX daemon cannot listen", address=own_ip, port=port, error=str(exc))
        return 1
    server.domain = domain  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="imex-listen", daemon=True).start()
    _log.info("fake IMEX daemon listening", address=own_ip, port=port, domain=domain)
    last: tuple[str, tuple[str, ...]] | None = None
    try:
        while not stop.is_set():
            if not directory.is_dir():
                _log.info("fake IMEX daemon's directory is gone; exiting", directory=str(directory))
                return 0
            nodes = _read(nodes_file(directory, config))
            peers = {ip: ask(ip, port, domain) for ip in nodes if ip != own_ip}
            ready = own_ip in nodes and all(peers.values())
            state = imexconfig.READY_STATE if ready else "NOT_READY"
            try:
                imexconfig.write_status(directory, state, nodes=list(nodes), peers=peers)
            except OSError:
                continue  # the directory went meanwhile: the loop's check ends us
            if (state, nodes) != last:
                last = (state, nodes)
                _log.info(
                    "fake IMEX daemon state",
                    state=state,
                    nodes=list(nodes),
                    answering=sorted(p for p, ok in peers.items() if ok),
                )
            stop.wait(interval_s)
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _read(path: Path) -> tuple[str, ...]:
    """The nodes config's addresses (none while it is missing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ()
    return tuple(s for s in (line.strip() for line in text.splitlines()) if s and s[0] != "#")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fakeimex", description=(__doc__ or "").split("\n", 1)[0] or None
    )
    parser.add_argument("--config-dir", type=Path, default=Path(cd.DAEMON_DIR))
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between checks")
    args = parser.parse_args(argv)
    logs.configure(level=os.environ.get("LOG_LEVEL", "info"), fmt="json")
    own_ip = os.environ.get("IMEX_NODE_IP", "")
    domain = os.environ.get("COMPUTE_DOMAIN_UUID", "")
    if not own_ip or not domain:
        print(
            "fakeimex: IMEX_NODE_IP and COMPUTE_DOMAIN_UUID must be set (CDI spec)", file=sys.stderr
        )
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return run(args.config_dir, own_ip=own_ip, domain=domain, interval_s=args.interval, stop=stop)


if __name__ == "__main__":
    sys.exit(main())
