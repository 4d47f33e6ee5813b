"""Which configuration a :class:`~dra_driver.kube.client.KubeClient` connects with.

Why it exists apart from :mod:`dra_driver.kube.client` (the port over HTTP): finding the
kubeconfig as kubectl does (:mod:`dra_driver.kube.configfiles`: ``--kubeconfig``, the
``KUBECONFIG`` list merged, ``~/.kube/config``, in-cluster), choosing between the lean
configuration (:mod:`dra_driver.kube.kubeconfig`, no ``kubernetes`` package) and the library's
(:mod:`dra_driver.kube.library`), and turning every failure into one :class:`ConfigError` line
naming the file and the reason, are the configuration's concerns, not the requests'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.kube import configfiles, library
from dra_driver.kube import kubeconfig as _kubeconfig
from dra_driver.kube.configfiles import ConfigError as ConfigError


class NoLibrary:
    """Stands where the library's ``ApiClient`` would: a lean configuration, no library."""

    def __init__(self, configuration: _kubeconfig.Configuration) -> None:
        self.configuration = configuration

    def close(self) -> None:
        pass


def api_client(kubeconfig: Path | None, context: str | None, *, lean: bool, pool_size: int) -> Any:
    """What :class:`~dra_driver.kube.client.KubeClient` sends through: a :class:`NoLibrary`
    lean configuration when ``lean`` and the transport can speak it, else the library's
    ``ApiClient`` (``pool_size`` connections); from ``kubeconfig``, else the files of
    ``$KUBECONFIG`` (merged), else ``~/.kube/config``, else the in-cluster service account;
    ``context``: a context of the kubeconfig instead of its current one."""
    files = configfiles.locate(kubeconfig)
    if not files:
        if context:
            raise ConfigError(
                f"--context {context}: no kubeconfig to take it from ({configfiles.searched()})"
            )
        return _in_cluster(lean=lean, pool_size=pool_size)
    docs = [(path, configfiles.read(path)) for path in files]
    path = files[0]
    where = configfiles.describe(files)
    merged = configfiles.merge(docs) if len(files) > 1 else None
    doc = docs[0][1] if merged is None else merged
    client: Any = None
    if lean:
        try:
            lean_config = _kubeconfig.load(path, context, doc=doc, where=where)
        except _kubeconfig.ConfigError as exc:
            raise ConfigError(f"cannot load {where}: {exc}") from exc
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            # A wrongly shaped entry (``clusters: 5``) surfaces as a Python error.
            raise ConfigError(
                f"cannot load {where}: not a valid kubeconfig ({type(exc).__name__}: {exc})"
            ) from exc
        if lean_config is not None:
            client = NoLibrary(lean_config)
    if client is None:  # what the transport does not do: the library's
        try:
            client = library.api_client(path, context, pool_size, doc=merged)
        except library.LibraryConfigError as exc:
            raise ConfigError(f"cannot load {where}: {exc}") from exc
    return client


def namespace(kubeconfig: Path | None, context: str | None) -> str | None:
    """kubectl's default namespace: the context's in the kubeconfig found as :func:`api_client`
    finds it, else (no kubeconfig) the pod's own; None when neither names one."""
    files = configfiles.locate(kubeconfig)
    if not files:
        return _kubeconfig.in_cluster_namespace()
    docs = [(path, configfiles.read(path)) for path in files]
    doc = configfiles.merge(docs) if len(docs) > 1 else docs[0][1]
    return configfiles.context_namespace(doc, context)


def _in_cluster(*, lean: bool, pool_size: int) -> Any:
    where = f"in-cluster configuration ({configfiles.searched()})"
    if lean:
        try:
            return NoLibrary(_kubeconfig.in_cluster())
        except _kubeconfig.ConfigError as exc:
            raise ConfigError(f"cannot load {where}: {exc}") from exc
    try:
        return library.api_client(None, None, pool_size)
    except library.LibraryConfigError as exc:
        raise ConfigError(f"cannot load {where}: {exc}") from exc
