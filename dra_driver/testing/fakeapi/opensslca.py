"""A throw-away certificate authority made with the ``openssl`` command.

Why it exists: :mod:`.certs` needs the ``cryptography`` package, a development dependency; a
runtime-only install (``make demo``) has the ``openssl`` command on most machines instead, and
``dra-driver dev-cluster`` should start there too. Same shape as :func:`.certs.make_bundle`: a
CA, a server certificate for ``127.0.0.1`` / ``::1`` / ``localhost`` and a client certificate
(RSA 2048, SHA-256, one day), in a private temporary directory removed at once.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from dra_driver.testing.fakeapi.bundle import Bundle

DAYS = "1"


class OpensslError(Exception):
    """No ``openssl`` command, or it failed; the message says which step."""


def available() -> bool:
    return shutil.which("openssl") is not None


def make_bundle(*, client_name: str = "system:node:bench-node") -> Bundle:
    """A fresh CA, server and client certificate; :class:`OpensslError` if openssl fails."""
    if not available():
        raise OpensslError("no openssl command on PATH")
    with tempfile.TemporaryDirectory(prefix="fakeapi-ca-") as tmp:
        d = Path(tmp)
        _run(
            d,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            DAYS,
            "-subj",
            "/CN=fakeapi-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
        )
        _issue(
            d,
            "server",
            "/CN=kube-apiserver",
            "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\nextendedKeyUsage=serverAuth\n",
        )
        _issue(d, "client", f"/O=system:nodes/CN={client_name}", "extendedKeyUsage=clientAuth\n")
        return Bundle(
            ca_pem=(d / "ca.crt").read_bytes(),
            server_cert_pem=(d / "server.crt").read_bytes(),
            server_key_pem=(d / "server.key").read_bytes(),
            client_cert_pem=(d / "client.crt").read_bytes(),
            client_key_pem=(d / "client.key").read_bytes(),
        )


def _issue(d: Path, name: str, subject: str, extensions: str) -> None:
    (d / f"{name}.ext").write_text(extensions)
    _run(
        d,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
    )
    _run(
        d,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        DAYS,
        "-sha256",
        "-extfile",
        f"{name}.ext",
    )


def _run(d: Path, *args: str) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise OpensslError(f"openssl {args[0]} failed: {last[0]}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpensslError(f"openssl {args[0]}: {exc}") from exc
