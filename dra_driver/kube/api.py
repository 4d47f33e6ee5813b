"""The narrow port through which the driver talks to the Kubernetes API server.

Objects cross it as plain JSON-shaped dicts (``resource.k8s.io/v1`` field names), so the driver
core never imports the ``kubernetes`` client. Two implementations: the real adapter
(:mod:`dra_driver.kube.client`, the only importer of the client library) and the in-memory API
(:mod:`dra_driver.testing.fakeapi.memory`) that tests and the demo use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, Protocol

from dra_driver import records

Obj = dict[str, Any]


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def retriable(self) -> bool:
        return self.status in (0, 409, 429) or self.status >= 500


class NotFound(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(404, message, reason="NotFound")


class Conflict(ApiError):
    """409: stale ``resourceVersion`` on update/delete, or the name exists on create."""

    def __init__(self, message: str, *, reason: str = "Conflict") -> None:
        super().__init__(409, message, reason=reason)


class Invalid(ApiError):
    """422 (or 400 for undecodable objects): the server refused the object itself."""

    def __init__(self, message: str, *, status: int = 422) -> None:
        super().__init__(status, message, reason="Invalid" if status == 422 else "BadRequest")

    @property
    def retriable(self) -> bool:
        return False


@records.record
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
    object: Obj


class KubeApi(Protocol):
    """What the driver needs from the API server, and nothing more."""

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        """GET a ResourceClaim; raises :class:`NotFound`."""
        ...

    def apply_resource_claim_status(
        self, namespace: str, name: str, patch: Obj, field_manager: str
    ) -> Obj:
        """Server-side apply (``application/apply-patch+yaml``, ``force=true``) of a claim's
        status by ``field_manager``: ``patch`` is a ResourceClaim with ``metadata.name`` (and
        ``uid``, a precondition) and ``status.devices``, the entries this manager wants; the
        ones it applied before and no longer lists go, other managers' stay. Returns the claim.
        Raises NotFound, Conflict (UID precondition), Invalid, ApiError (403: RBAC)."""
        ...

    def create_event(self, namespace: str, event: Obj) -> Obj:
        """POST an ``events.k8s.io/v1`` Event in ``namespace`` (about a claim there). Raises
        Conflict (``reason == "AlreadyExists"``: an Event of that name exists), Invalid (the
        server's Event rules: reportingController, reportingInstance, action, eventTime ...),
        ApiError (403: RBAC)."""
        ...

    def get_node(self, name: str) -> Obj:
        """GET a Node (owner of our ResourceSlices; its labels); raises NotFound."""
        ...

    def patch_node(self, name: str, patch: Obj) -> Obj:
        """JSON merge patch (RFC 7386) of a Node: ``null`` removes a key; returns the Node.

        Raises NotFound, Invalid (a label the server refuses), Conflict (a ``resourceVersion``
        in the patch that is no longer current)."""
        ...

    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[Obj], str]:
        """Slices of ``driver`` on ``node_name`` (field selectors) and the list resourceVersion."""
        ...

    def create_resource_slice(self, obj: Obj) -> Obj:
        """Create; ``metadata.generateName`` is honoured. Raises Conflict, Invalid."""
        ...

    def update_resource_slice(self, obj: Obj) -> Obj:
        """Replace; ``metadata.resourceVersion`` must be current (else Conflict)."""
        ...

    def delete_resource_slice(self, name: str, *, resource_version: str | None = None) -> None:
        """Delete, optionally only if unchanged (precondition). Raises NotFound, Conflict."""
        ...

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_s: float
    ) -> Iterator[WatchEvent]:
        """Events after ``resource_version`` until ``timeout_s`` passes (then the iterator ends)."""
        ...
