"""Which kubeconfig files a command reads, and how several are merged: kubectl's rules.

Why it exists: an operator's muscle memory is kubectl's. Every command that talks to an API
server finds its configuration in the same order: ``--kubeconfig`` (that file alone); else
``KUBECONFIG``, a list of files separated by ``:`` (``os.pathsep``) merged as kubectl merges
them; else ``~/.kube/config`` under ``$HOME``; else the pod's service account (in-cluster). In a
``KUBECONFIG`` list, files that do not exist are skipped — unless none does, which is an error
naming every entry — and a file that exists but cannot be read or parsed is an error naming it.
The merge: the first file to set a map key wins (a cluster, user or context of a given name, and
``current-context``), and each file's relative paths (certificates, token files, an exec
plugin's command) are taken relative to the file that names them. Reading stays lean: JSON
kubeconfigs are parsed without PyYAML (:func:`dra_driver.kube.kubeconfig.parse`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver.kube import kubeconfig as _kubeconfig

HOME_CONFIG = Path(".kube") / "config"
NAMED = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))
# Keys holding a path, relative to the kubeconfig that names them (client-go's ResolvePaths).
_PATHS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


class ConfigError(Exception):
    """No usable kubeconfig or in-cluster configuration; the message says what is missing."""


def home_config(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$HOME/.kube/config`` (None without a home)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME")
    if home is None:
        try:
            home = str(Path.home())
        except RuntimeError:  # no HOME and no passwd entry
            return None
    return Path(home) / HOME_CONFIG if home else None


def env_list(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The files ``KUBECONFIG`` names, in order, empty entries and repeats left out."""
    env = os.environ if environ is None else environ
    seen: list[Path] = []
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry and Path(entry) not in seen:
            seen.append(Path(entry))
    return seen


def locate(explicit: Path | None, environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The kubeconfig files to read, in merge order; none: the in-cluster configuration."""
    if explicit is not None:
        return (explicit,)
    listed = env_list(environ)
    if listed:
        present = tuple(path for path in listed if path.exists())
        if not present:
            missing = ", ".join(str(path) for path in listed)
            raise ConfigError(f"KUBECONFIG names no file that exists ({missing})")
        return present
    home = home_config(environ)
    if home is not None and (home.exists()):
        return (home,)
    return ()


def searched(environ: Mapping[str, str] | None = None) -> str:
    """What :func:`locate` looked for and did not find, for an error when in-cluster fails."""
    home = home_config(environ)
    where = f"no {home}" if home is not None else "no home directory"
    return f"no --kubeconfig, KUBECONFIG not set and {where}"


def read(path: Path) -> Any:
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


def merge(docs: Sequence[tuple[Path, Any]]) -> dict[str, Any]:
    """One kubeconfig from several (``(path, document)`` in ``KUBECONFIG`` order): the first
    file to set a cluster, user or context name, or ``current-context``, wins; relative paths
    are made absolute against the directory of the file that holds them."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for section, _ in NAMED:
        merged[section] = []
    for path, doc in docs:
        if doc is None:  # an empty file sets nothing
            continue
        if not merged.get("current-context") and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
        for section, key in NAMED:
            entries = doc.get(section) or []
            if not isinstance(entries, list):
                raise ConfigError(f"cannot load kubeconfig {path}: {section} is not a list")
            names = {entry["name"] for entry in merged[section]}
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise ConfigError(
                        f"cannot load kubeconfig {path}: an entry of {section} has no name"
                    )
                if entry["name"] not in names:
                    names.add(entry["name"])
                    merged[section].append(_resolved(entry, key, path.parent))
        for key in ("preferences", "extensions"):
            if key not in merged and key in doc:
                merged[key] = doc[key]
    return merged


def context_namespace(doc: Any, context: str | None) -> str | None:
    """The namespace of ``context`` (default: the current one) in a kubeconfig document."""
    if not isinstance(doc, dict):
        return None
    name = context or doc.get("current-context")
    for entry in doc.get("contexts") or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            ctx = entry.get("context")
            namespace = ctx.get("namespace") if isinstance(ctx, dict) else None
            return str(namespace) if namespace else None
    return None


def describe(paths: Sequence[Path]) -> str:
    """How error messages name the configuration: one file, or the merged list."""
    if len(paths) == 1:
        return f"kubeconfig {paths[0]}"
    return f"kubeconfig {os.pathsep.join(str(p) for p in paths)} (KUBECONFIG, merged)"


def _resolved(entry: dict[str, Any], key: str, base: Path) -> dict[str, Any]:
    body = entry.get(key)
    if not isinstance(body, dict):
        return entry
    body = dict(body)
    for field in _PATHS.get(key, ()):
        value = body.get(field)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[field] = str(base / value)
    plugin = body.get("exec") if key == "user" else None
    if isinstance(plugin, dict):
        command = plugin.get("command")
        # As client-go: a bare command name is looked up in PATH; one with a slash is a path.
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            body["exec"] = {**plugin, "command": str(base / command)}
    return {**entry, key: body}
