"""What the fake API server answers about itself: ``resource.k8s.io`` group discovery and
self-subject access reviews.

Why it exists: ``dra-driver doctor`` (:mod:`dra_driver.kube.features`) asks a server which
``resource.k8s.io`` versions it serves (``GET /apis/resource.k8s.io``, an ``APIGroup`` with
``versions`` and ``preferredVersion``) and what its credentials may do (``POST
/apis/authorization.k8s.io/v1/selfsubjectaccessreviews``). The fake answers both as a real
server does so that the doctor is tested over HTTP. A v1.36 server with default settings serves
``v1`` only (the betas are off by default); a fake can serve other versions, or none (the group
then answers 404, as on a server without DRA), and its ``resource.k8s.io/v1`` paths answer 404
when ``v1`` is not served. The fake has no authorizer: every review is allowed except the
``(verb, resource)`` pairs it was told to deny; or, told to, it serves no access reviews (404,
as a server whose authorization API is off or behind a proxy that filters it).

It also serves the legacy discovery documents kubectl reads before ``kubectl get`` (``/api``,
``/apis``, ``/api/v1``, ``/apis/<group>/<version>``: what resources there are, their kinds,
scopes and verbs), listing the resources the fake actually serves, so that kubectl can be
pointed at ``dra-driver dev-cluster``. Aggregated discovery is not served: kubectl then falls
back to these.

Test kit: nothing in the driver imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dra_driver import records
from dra_driver.kube import api, objects

GROUP = "resource.k8s.io"
# Highest priority first, as kube-apiserver lists a group's versions.
KNOWN_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
# (group, version, plural, kind, namespaced, verbs): the resthandler's own routes, then the
# generic kinds every store serves (:mod:`.objectroutes`).
RESOURCES: tuple[tuple[str, str, str, str, bool, tuple[str, ...]], ...] = (
    ("", "v1", "nodes", "Node", False, ("get", "patch")),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        False,
        ("create",),
    ),
    (
        GROUP,
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        ("create", "delete", "get", "list", "update", "watch"),
    ),
    (GROUP, "v1", "resourceclaims", "ResourceClaim", True, ("create", "get", "list", "patch")),
    (GROUP, "v1", "deviceclasses", "DeviceClass", False, ("create", "get")),
    *((k.group, k.version, k.plural, k.kind, k.namespaced, _ALL_VERBS) for k in objects.KINDS),
)


@records.record
class Served:
    """What one fake server serves of ``resource.k8s.io``, and the access it denies."""

    versions: tuple[str, ...] = ("v1",)
    denied: frozenset[tuple[str, str]] = frozenset()  # (verb, resource), e.g. ("patch", "nodes")
    reviews: bool = True  # whether access reviews are served at all

    @classmethod
    def of(
        cls, versions: Iterable[str], denied: Iterable[tuple[str, str]], *, reviews: bool = True
    ) -> Served:
        """Checked: only known versions, listed in the server's priority order."""
        wanted = set(versions)
        unknown = sorted(wanted - set(KNOWN_VERSIONS))
        if unknown:
            raise ValueError(f"the fake API server cannot serve {GROUP} {', '.join(unknown)}")
        ordered = tuple(v for v in KNOWN_VERSIONS if v in wanted)
        return cls(versions=ordered, denied=frozenset(denied), reviews=reviews)

    def check_path(self, path: str) -> None:
        """404 for a path of a ``resource.k8s.io`` version that is not served."""
        prefix = f"/apis/{GROUP}/"
        if path.startswith(prefix):
            version = path[len(prefix) :].split("/", 1)[0]
            if version and version not in self.versions:
                raise api.NotFound("the server could not find the requested resource")

    def api_group(self) -> dict[str, Any]:
        """``GET /apis/resource.k8s.io``; 404 when no version of the group is served."""
        if not self.versions:
            raise api.NotFound("the server could not find the requested resource")
        entries = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": GROUP,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def access_review(self, body: Any) -> dict[str, Any]:
        """The answer to a ``SelfSubjectAccessReview`` (resource attributes only)."""
        if not self.reviews:
            raise api.NotFound("the server could not find the requested resource")
        if not isinstance(body, dict) or body.get("kind") not in (None, "SelfSubjectAccessReview"):
            raise api.Invalid("SelfSubjectAccessReview expected", status=400)
        attrs = (body.get("spec") or {}).get("resourceAttributes")
        if not isinstance(attrs, dict):
            raise api.Invalid(
                "spec.resourceAttributes: Required value: the fake API server reviews "
                "resource attributes only"
            )
        verb, resource = str(attrs.get("verb") or ""), str(attrs.get("resource") or "")
        allowed = (verb, resource) not in self.denied
        status: dict[str, Any] = {
            "allowed": allowed,
            "reason": "the fake API server allows it"
            if allowed
            else "denied by the fake API server's settings",
        }
        return {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": {"resourceAttributes": attrs},
            "status": status,
        }

    def api_versions(self, server_address: str) -> dict[str, Any]:
        """``GET /api``: the core group's versions."""
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def api_group_list(self) -> dict[str, Any]:
        """``GET /apis``: every named group served, its versions preferred first."""
        groups: dict[str, list[str]] = {}
        for group, version, *_ in RESOURCES:
            if group and self._served(group, version):
                groups.setdefault(group, [])
                if version not in groups[group]:
                    groups[group].append(version)
        if self.versions:
            groups[GROUP] = list(self.versions)
        listed = []
        for name, versions in groups.items():
            entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            listed.append({"name": name, "versions": entries, "preferredVersion": entries[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": listed}

    def resource_list(self, group: str, version: str) -> dict[str, Any]:
        """``GET /api/v1`` or ``/apis/<group>/<version>``: the resources served there."""
        if not self._served(group, version) and not (group == GROUP and version in self.versions):
            raise api.NotFound("the server could not find the requested resource")
        resources = [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": list(verbs),
            }
            for g, v, plural, kind, namespaced, verbs in RESOURCES
            if (g, v) == (group, version)
        ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _served(self, group: str, version: str) -> bool:
        if group == GROUP:
            return version in self.versions
        return any((g, v) == (group, version) for g, v, *_ in RESOURCES)
