"""The ``kubernetes`` client library, for what the lean transport does not do.

Why it exists apart from :mod:`dra_driver.kube.client`: the library is ~10 MiB of memory and
~0.2 s of CPU per process, and the node agent (one per GPU node) needs it only for exec
credential plugins, auth providers, basic auth and proxies (:mod:`dra_driver.kube.kubeconfig`
reads every other configuration). Everything that touches it is here, and this module imports
it only inside its functions, so importing the client never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.kube import api

_AUTH = ["BearerToken"]


class LibraryConfigError(Exception):
    """The library could not load the configuration (its message)."""


def api_client(
    path: Path | None, context: str | None, pool_size: int, *, doc: dict[str, Any] | None = None
) -> Any:
    """The library's ``ApiClient`` for the kubeconfig at ``path`` (else in-cluster), or for
    ``doc``, several kubeconfigs merged (their relative paths already made absolute)."""
    import kubernetes
    import urllib3

    configuration = kubernetes.client.Configuration()
    try:
        if doc is not None:
            kubernetes.config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
                config_dict=doc, context=context, client_configuration=configuration
            )
        elif path is not None:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path), context=context, client_configuration=configuration
            )
        else:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except kubernetes.config.ConfigException as exc:
        raise LibraryConfigError(str(exc)) from exc
    # Retry only what is safe to repeat: connecting. A request that may have reached the
    # server is never re-sent here; the caller's backoff decides.
    configuration.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, redirect=0, other=0)
    configuration.connection_pool_maxsize = pool_size  # one connection per prepare worker
    return kubernetes.client.ApiClient(configuration)


def proxied(configuration: Any) -> bool:
    """Whether the library would reach the API server through a proxy (kubeconfig
    ``proxy-url`` or ``HTTPS_PROXY``, unless ``NO_PROXY`` covers the server)."""
    if not getattr(configuration, "proxy", None):
        return False
    import kubernetes  # a proxy is set only in the library's own configuration

    bypass = getattr(kubernetes.client.rest, "should_bypass_proxies", None)
    no_proxy = getattr(configuration, "no_proxy", None) or ""
    return not (bypass is not None and bypass(configuration.host, no_proxy))


def request(
    client: Any,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None,
    body: api.Obj | str | None,
    timeout: tuple[float, float],
    content_type: str,
    headers: tuple[tuple[str, str], ...] = (),
) -> Any:
    """Send through ``client`` (an ``ApiClient``); the urllib3 response, any status, its
    body unread. Unreachable: :class:`~dra_driver.kube.api.ApiError` with status 0."""
    import kubernetes
    import urllib3

    sent = {"Accept": "application/json", **dict(headers)}
    if body is not None:
        sent["Content-Type"] = content_type
    try:
        serialized = client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=sent,
            body=body,
            auth_settings=_AUTH,
        )
        return client.call_api(*serialized, _request_timeout=timeout).response
    except kubernetes.client.exceptions.ApiException as exc:
        raise api.ApiError(exc.status or 0, f"{method} {path}: {exc.reason}") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise api.ApiError(0, f"{method} {path}: API server unreachable: {exc}") from exc


def data(response: Any, method: str, path: str) -> bytes:
    """The whole body of a library response; the connection goes back to its pool."""
    import urllib3

    try:
        return bytes(response.data)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise api.ApiError(0, f"{method} {path}: connection lost reading reply: {exc}") from exc
    finally:
        response.release_conn()
