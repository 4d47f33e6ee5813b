"""The PEM bundle of a throw-away certificate authority, and the TLS contexts made from it.

Why it exists apart from :mod:`.certs` (which makes one with the ``cryptography`` package) and
:mod:`.opensslca` (which makes one with the ``openssl`` command): the fake API server and its
clients need only the PEM bytes and the ``ssl`` contexts, whichever made them.
"""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from dra_driver import records


@records.record
class Bundle:
    """PEM bytes of a CA, a server certificate and key, and a client certificate and key."""

    ca_pem: bytes
    server_cert_pem: bytes
    server_key_pem: bytes
    client_cert_pem: bytes
    client_key_pem: bytes

    def server_context(self, *, require_client_cert: bool = True) -> ssl.SSLContext:
        """A server context that presents the server certificate and (by default) refuses
        clients without a certificate signed by the CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="fakeapi-tls-") as tmp:
            cert, key = Path(tmp) / "server.crt", Path(tmp) / "server.key"
            cert.write_bytes(self.server_cert_pem)
            key.write_bytes(self.server_key_pem)
            context.load_cert_chain(cert, key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=self.ca_pem.decode())
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts the CA and presents the client certificate."""
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        with tempfile.TemporaryDirectory(prefix="fakeapi-tls-") as tmp:
            cert, key = Path(tmp) / "client.crt", Path(tmp) / "client.key"
            cert.write_bytes(self.client_cert_pem)
            key.write_bytes(self.client_key_pem)
            context.load_cert_chain(cert, key)
        return context
