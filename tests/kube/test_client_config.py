"""What a kubeconfig we cannot use, or a server that is not a Kubernetes API server, turns into:
one :class:`~dra_driver.kube.client.ConfigError` / :class:`~dra_driver.kube.api.ApiError`
line naming the file or server and the reason — never the library's traceback or an HTML body."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.kube import api, client
from dra_driver.testing.fakeapi import fakeserver

BAD_KUBECONFIGS = {
    "malformed": (
        b"this: is: not: [valid\n",
        "not valid YAML at line 1, column 9: mapping values are not allowed here",
    ),
    "list": (b"- a\n- b\n", "not a kubeconfig (YAML list, not a mapping"),
    "scalar": (b"hello\n", "not a kubeconfig (YAML scalar, not a mapping"),
    "wrong-shape": (
        b"apiVersion: v1\nclusters: 5\ncurrent-context: c\n"
        b"contexts: [{name: c, context: {cluster: x, user: u}}]\n",
        "not a valid kubeconfig (TypeError: ",
    ),
    "not-utf8": (b"\x80\x81\n", "not UTF-8 text (invalid start byte)"),
}


@pytest.mark.parametrize("case", sorted(BAD_KUBECONFIGS))
def test_a_kubeconfig_we_cannot_use_is_one_config_error_naming_file_and_reason(
    case: str, tmp_path: Path
) -> None:
    content, reason = BAD_KUBECONFIGS[case]
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(client.ConfigError) as info:
        client.KubeClient.connect(path)
    message = str(info.value)
    assert message.startswith(f"cannot load kubeconfig {path}: "), message
    assert reason in message
    assert "\n" not in message


def test_a_directory_given_as_kubeconfig_is_named(tmp_path: Path) -> None:
    with pytest.raises(client.ConfigError, match=f"^kubeconfig {tmp_path} is not a file$"):
        client.KubeClient.connect(tmp_path)


class _WebPage(http.server.BaseHTTPRequestHandler):
    """A web server that is not Kubernetes: an HTML page of many lines for every path."""

    status = 404

    def do_GET(self) -> None:
        body = (
            b"<!DOCTYPE html>\n<html>\n<head>\n<title>Not Found</title>\n</head>\n<body>\n"
            b"<h1>Nothing here</h1>\n<p>line</p>\n<p>line</p>\n</body>\n</html>\n"
        )
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def web_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.mark.parametrize("lean", [True, False], ids=["lean-http", "library-http"])
def test_a_web_server_that_is_not_kubernetes_is_one_line_with_status_and_page_title(
    web_server: str, tmp_path: Path, lean: bool
) -> None:
    kube = client.KubeClient.connect(
        fakeserver.write_kubeconfig(tmp_path / "kc", web_server), lean=lean
    )
    try:
        with pytest.raises(api.ApiError) as info:
            kube.get_version()
    finally:
        kube.close()
    assert info.value.status == 404
    assert str(info.value) == (
        "not a Kubernetes API server: the reply is an HTML page titled 'Not Found'"
    )
