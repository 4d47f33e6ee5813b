"""Small pieces of API-server behaviour shared by the in-memory API, the fake HTTP server and
the real client adapter.

Why it exists: the HTTP status → port error mapping must be the same whether the error came
from the fake or over the wire, and the bits of bookkeeping the server does on a write
(``generateName`` suffixes, ``timeAdded`` on taints, the 409 messages, the field-selector match,
write preconditions, strict schema checks of generic kinds) are facts about the server, not about
any one fake. Pure functions, no client library.
"""

from __future__ import annotations

import datetime
import functools
import random
import re
from collections.abc import Callable, Container
from typing import Any

from dra_driver.kube import api, objects

# A custom kind's schema check (its CRD's openAPIV3Schema): the errors, none when valid.
Validator = Callable[[api.Obj], list[str]]
_SCHEMA_VERSION = "1.36.0"

# What the server's generateName suffix draws from (no vowels, no confusable characters).
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
SLICES = "resourceslices.resource.k8s.io"


def now() -> str:
    """The current time as the server writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def error_for(status: int, message: str, reason: str = "") -> api.ApiError:
    """The port's error for an HTTP status and the server's Status message."""
    if status == 404:
        return api.NotFound(message)
    if status == 409:
        guessed = "AlreadyExists" if "already exists" in message else "Conflict"
        return api.Conflict(message, reason=reason or guessed)
    if status in (400, 422):
        return api.Invalid(message, status=status)
    default = {0: "", 403: "Forbidden", 429: "TooManyRequests"}.get(status, "InternalError")
    return api.ApiError(status, message, reason=reason or default)


def generate_name(prefix: str, taken: Container[str], rng: random.Random) -> str:
    """``prefix`` plus five random characters, not already in ``taken``."""
    while True:
        name = prefix + "".join(rng.choice(NAME_CHARS) for _ in range(5))
        if name not in taken:
            return name


def conflict_message(name: str, detail: str) -> str:
    return f'Operation cannot be fulfilled on {SLICES} "{name}": {detail}'


def stale_update(name: str) -> str:
    return conflict_message(
        name,
        "the object has been modified; please apply your changes to the latest version and "
        "try again",
    )


def stale_delete(name: str, wanted: str, current: str) -> str:
    return conflict_message(
        name,
        f"Precondition failed: ResourceVersion in precondition: {wanted}, "
        f"ResourceVersion in object meta: {current}",
    )


def fill_taint_times(new: api.Obj, old: api.Obj | None = None) -> None:
    """Taints without ``timeAdded`` get one: the old one when the same taint was there."""
    before: dict[tuple[Any, Any, Any], Any] = {}
    for device in ((old or {}).get("spec") or {}).get("devices") or ():
        for taint in device.get("taints") or ():
            key = (device.get("name"), taint.get("key"), taint.get("effect"))
            before[key] = taint.get("timeAdded")
    for device in (new.get("spec") or {}).get("devices") or ():
        for taint in device.get("taints") or ():
            if not taint.get("timeAdded"):
                key = (device.get("name"), taint.get("key"), taint.get("effect"))
                taint["timeAdded"] = before.get(key) or now()


def slice_selected(obj: api.Obj, driver: str, node_name: str) -> bool:
    """The ``spec.driver`` / ``spec.nodeName`` field selectors; empty = no condition."""
    spec = obj.get("spec") or {}
    return (not driver or spec.get("driver") == driver) and (
        not node_name or spec.get("nodeName") == node_name
    )


def precondition_failure(
    name: str, meta: dict[str, Any], rv: str | None, uid: str | None, *, deleting: bool = False
) -> str | None:
    """The 409 message when a write's preconditions (``uid``, ``resourceVersion``) do not match
    the stored object's ``meta``; None when they hold."""
    if uid and uid != meta["uid"]:
        detail = f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
        return conflict_message(name, detail + meta["uid"])
    if rv and rv != meta["resourceVersion"]:
        return stale_delete(name, rv, meta["resourceVersion"]) if deleting else stale_update(name)
    return None


def schema_errors(kind: objects.Kind, obj: api.Obj, validator: Validator | None) -> list[str]:
    if validator is not None:
        return validator(obj)
    if kind.group.endswith(".nvidia.com"):
        return []  # a custom kind without a registered schema: accepted as is
    try:
        import jsonschema
        import kubernetes_validate  # the strict 1.36 schemas (a dev dependency: test kit)
    except ImportError:  # pragma: no cover - the kit runs with the dev dependencies
        return []
    try:
        check = _schema_validator(str(obj.get("apiVersion") or ""), str(obj.get("kind") or ""))
    except (FileNotFoundError, LookupError):  # no such schema: the library says which
        check = None
    try:
        if check is not None:
            check.validate(obj)
        else:
            kubernetes_validate.validate(obj, _SCHEMA_VERSION, strict=True)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "<root>"
        return [f"{where}: {exc.message}"]
    return []


@functools.lru_cache(maxsize=64)
def _schema_validator(api_version: str, kind: str) -> Any:
    """The strict schema validator of one kind, built once: ``kubernetes_validate.validate``
    builds it (schema files, reference registry) on every call, ~20 ms for a Pod, which under
    the store's lock would slow every other request of the fake server as much."""
    import jsonschema
    import referencing
    from kubernetes_validate import utils

    wanted = utils.major_minor(_SCHEMA_VERSION)
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= wanted][-1]
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group}.json", _SCHEMA_VERSION)
    definitions = utils.schema_contents(f"{folder}/_definitions.json", _SCHEMA_VERSION)
    registry = referencing.Resource.from_contents(definitions) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)
