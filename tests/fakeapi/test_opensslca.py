"""The ``openssl`` CA (no ``cryptography``) serves the fake API over TLS with client
certificates exactly as :mod:`dra_driver.testing.fakeapi.certs`'s does: the real client
connects with the kubeconfig it writes, a client without the certificate is refused."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

import pytest

from dra_driver.kube import client
from dra_driver.testing.fakeapi import fakeserver, opensslca

pytestmark = pytest.mark.skipif(not opensslca.available(), reason="no openssl command")


def test_an_openssl_bundle_serves_tls_with_client_certificates(tmp_path: Path) -> None:
    bundle = opensslca.make_bundle(client_name="someone")
    with fakeserver.FakeApiServer(tls=bundle) as server:
        kube = client.KubeClient.connect(server.write_kubeconfig(tmp_path / "kc"))
        try:
            assert kube.get_version()["gitVersion"].startswith("v1.")
        finally:
            kube.close()
        anonymous = ssl.create_default_context(cadata=bundle.ca_pem.decode())
        with pytest.raises((ssl.SSLError, OSError)):
            urllib.request.urlopen(server.url + "/version", context=anonymous, timeout=10).read()
