"""What the fake API server was asked: requests counted by verb and resource, with their bytes.

Why it exists: a fleet of node agents on one API server is judged by the load it puts there —
how many lists, watches and writes of which resource, how many bytes — at start, idle, after an
outage. kube-apiserver counts that in ``apiserver_request_total``; the fake counts the same way
(the verb as the server names it: ``get``/``list``/``watch``/``create``/``update``/``patch``/
``delete``, dry-run requests apart) so a benchmark can read it per phase
(``/fakeapi/requests``, or :meth:`RequestLog.snapshot` in-process). A log may outlive one
server object: a restarted server on the same store keeps counting into it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

_RESOURCE = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


@dataclasses.dataclass(slots=True)
class Tally:
    requests: int = 0
    bytes_in: int = 0  # request bodies
    bytes_out: int = 0  # response bodies (a watch: every event streamed)


def classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str]:
    """(verb, resource) as kube-apiserver's metrics name them; a non-resource path is its own
    resource (``/version``)."""
    match = _RESOURCE.match(path)
    if match is None:
        return method.lower(), path
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    named = match["name"] is not None
    if method == "GET":
        if named:
            verb = "get"
        else:
            verb = "watch" if query.get("watch") not in (None, "", "0", "false") else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, method.lower()
        )
    return verb, resource


class RequestLog:
    """Thread-safe tallies by (verb, resource, dry run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str, bool], Tally] = {}

    def record(self, verb: str, resource: str, *, dry_run: bool, bytes_in: int) -> Tally:
        """Count one request; returns its tally, to add the response's bytes to
        (:meth:`sent`)."""
        with self._lock:
            tally = self._tallies.setdefault((verb, resource, dry_run), Tally())
            tally.requests += 1
            tally.bytes_in += bytes_in
            return tally

    def sent(self, tally: Tally, count: int) -> None:
        with self._lock:
            tally.bytes_out += count

    def snapshot(self) -> list[dict[str, Any]]:
        """One row per (verb, resource, dryRun): requests, bytesIn, bytesOut."""
        with self._lock:
            return [
                {
                    "verb": verb,
                    "resource": resource,
                    "dryRun": dry_run,
                    "requests": t.requests,
                    "bytesIn": t.bytes_in,
                    "bytesOut": t.bytes_out,
                }
                for (verb, resource, dry_run), t in sorted(self._tallies.items())
            ]
