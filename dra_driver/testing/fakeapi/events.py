"""The API server's rules for ``events.k8s.io/v1`` Events, for the in-memory API's object store.

Why it exists: the node agent reports a claim whose GPU vanished with an Event on the claim
(:mod:`dra_driver.driver.claimevents`). A real server refuses an Event that the schema alone
would pass: created through ``events.k8s.io/v1`` it must say who reported it and when
(``reportingController``, a qualified name; ``reportingInstance``; ``action``; ``reason``;
``eventTime``), its ``type`` is ``Normal`` or ``Warning``, the ``deprecated*`` fields of the core
API stay unset, lengths are bounded (128 characters, ``note`` 1 kB), and an Event in a namespace
other than ``default``/``kube-system`` must name the namespace of what it regards. The fake
refuses the same with 422 (the messages in the server's field-error form), then checks the
strict 1.36 schema as for every built-in kind. Field selectors of Events
(``regarding.uid=...``) are in :mod:`.selectors`.
"""

from __future__ import annotations

from typing import Any

from dra_driver.apimachinery import fielderrors, metarules, names
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.kube import api
from dra_driver.kube.objects import EVENTS
from dra_driver.testing.fakeapi import serverbits

LIMIT = 128  # reportingInstance, action, reason
NOTE_LIMIT = 1024
_DEPRECATED = ("deprecatedCount", "deprecatedFirstTimestamp", "deprecatedLastTimestamp")


def rule_errors(event: api.Obj) -> list[FieldError]:
    """What the server's Event validation refuses in ``event`` (none: valid)."""
    errors = metarules.object_meta(event.get("metadata") or {}, namespaced=True)
    namespace = str((event.get("metadata") or {}).get("namespace") or "")
    regarding = event.get("regarding") or {}
    if not regarding.get("namespace") and namespace not in ("default", "kube-system"):
        errors.append(
            fielderrors.invalid(
                "regarding.namespace",
                regarding.get("namespace") or "",
                "does not match event.namespace",
            )
        )
    controller = str(event.get("reportingController") or "")
    if not controller:
        errors.append(fielderrors.required("reportingController"))
    errors += metarules.each("reportingController", controller, names.qualified_name(controller))
    for field, limit in (("reportingInstance", LIMIT), ("action", LIMIT), ("reason", LIMIT)):
        value = str(event.get(field) or "")
        if not value:
            errors.append(fielderrors.required(field))
        elif len(value) > limit:
            errors.append(fielderrors.invalid(field, "", f"can have at most {limit} characters"))
    if len(str(event.get("note") or "")) > NOTE_LIMIT:
        errors.append(fielderrors.invalid("note", "", f"can have at most {NOTE_LIMIT} characters"))
    if not event.get("eventTime"):
        errors.append(fielderrors.required("eventTime"))
    kind = event.get("type")
    if kind not in ("Normal", "Warning"):
        errors.append(fielderrors.invalid("type", "", f"has invalid value: {kind or ''}"))
    for field in _DEPRECATED:
        if event.get(field):
            errors.append(fielderrors.invalid(field, "", "needs to be unset"))
    source: Any = event.get("deprecatedSource") or {}
    if source.get("component") or source.get("host"):
        errors.append(fielderrors.invalid("deprecatedSource", "", "needs to be unset"))
    return errors


def validate(event: api.Obj) -> list[str]:
    """The store's validator of Events: the server's rules, then the strict schema."""
    errors = rule_errors(event)
    if errors:
        return [fielderrors.summary(errors)]
    return serverbits.schema_errors(EVENTS, event, None)
