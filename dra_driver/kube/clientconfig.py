"""Which configuration a :class:`~dra_driver.kube.client.KubeClient` connects with.

Why it exists apart from :mod:`dra_driver.kube.client` (the port over HTTP): finding the
kubeconfig, checking that it is a readable mapping, choosing between the lean configuration
(:mod:`dra_driver.kube.kubeconfig`, no ``kubernetes`` package) and the library's
(:mod:`dra_driver.kube.library`), and turning every failure into one :class:`ConfigError` line
naming the file and the reason, are the configuration's concerns, not the requests'.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dra_driver.kube import kubeconfig as _kubeconfig
from dra_driver.kube import library


class ConfigError(Exception):
    """No usable kubeconfig or in-cluster configuration; the message says what is missing."""


def check_kubeconfig(path: Path) -> Any:
    """The document in the kubeconfig at ``path``; :class:`ConfigError` (one line: the file and
    the reason) unless it is a readable YAML (or JSON) mapping: the client library would crash
    on anything else with a traceback."""
    if not path.exists():
        raise ConfigError(f"kubeconfig {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"kubeconfig {path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot load kubeconfig {path}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    try:
        loaded = _kubeconfig.parse(text)
    except _kubeconfig.ParseError as exc:
        raise ConfigError(
            f"cannot load kubeconfig {path}: not valid YAML{exc.where}: {exc.problem}"
        ) from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(
            f"cannot load kubeconfig {path}: not a kubeconfig (YAML "
            f"{'list' if isinstance(loaded, list) else 'scalar'}, not a mapping of clusters, "
            "users and contexts)"
        )
    return loaded


class NoLibrary:
    """Stands where the library's ``ApiClient`` would: a lean configuration, no library."""

    def __init__(self, configuration: _kubeconfig.Configuration) -> None:
        self.configuration = configuration

    def close(self) -> None:
        pass


def api_client(kubeconfig: Path | None, context: str | None, *, lean: bool, pool_size: int) -> Any:
    """What :class:`~dra_driver.kube.client.KubeClient` sends through: a :class:`NoLibrary`
    lean configuration when ``lean`` and the transport can speak it, else the library's
    ``ApiClient`` (``pool_size`` connections); from ``kubeconfig`` (or ``$KUBECONFIG``), else
    the in-cluster service account."""
    path = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    doc = check_kubeconfig(path) if path is not None else None
    client: Any = None
    if lean:
        try:
            lean_config = (
                _kubeconfig.load(path, context, doc=doc) if path else _kubeconfig.in_cluster()
            )
        except _kubeconfig.ConfigError as exc:
            where = f"kubeconfig {path}" if path else "in-cluster configuration"
            raise ConfigError(f"cannot load {where}: {exc}") from exc
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            # A wrongly shaped entry (``clusters: 5``) surfaces as a Python error.
            raise ConfigError(
                f"cannot load kubeconfig {path}: not a valid kubeconfig "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if lean_config is not None:
            client = NoLibrary(lean_config)
    if client is None:  # what the transport does not do: the library's
        try:
            client = library.api_client(path, context, pool_size)
        except library.LibraryConfigError as exc:
            where = f"kubeconfig {path}" if path else "in-cluster configuration"
            raise ConfigError(f"cannot load {where}: {exc}") from exc
    return client
