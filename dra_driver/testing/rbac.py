"""What a ServiceAccount may do under a set of RBAC objects, and as its node under constrained
impersonation: the authorizers kube-apiserver runs, for the chart's rendered roles.

Why it exists: the in-memory API server has no RBAC (its one token may do anything), yet the
acceptance of the chart's permissions (docs/security.md) is a question RBAC answers: *can the
agent's token list the Pods of another node?* This evaluates the rendered ClusterRoles, Roles
and their bindings the way the RBAC authorizer does (a rule matches on verb, API group,
resource and, when it names any, resourceNames; ``*`` matches all), and adds the two checks a
request that acts as the caller's node goes through (KEP-5284, 1.36): the caller's
``impersonate:associated-node`` on ``authentication.k8s.io/nodes`` (only for the node its token
is bound to) and ``impersonate-on:associated-node:<verb>`` on the resource, then the Node
authorizer for the node, which lists and watches Pods only with ``spec.nodeName=<itself>`` and
gets only Pods bound to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver import records


@records.record(kw_only=True)
class Request:
    """One API request as the authorizer sees it."""

    verb: str
    group: str
    resource: str  # with its subresource: "resourceclaims/status"
    namespace: str = ""  # "" for cluster-scoped objects, or every namespace
    name: str = ""
    field_selector: str = ""


class Rbac:
    """The RBAC authorizer over ``objects`` (rendered manifests; other kinds are ignored)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        objs = list(objects)
        self._roles = {
            (o["kind"], (o["metadata"].get("namespace") or ""), o["metadata"]["name"]): list(
                o.get("rules") or ()
            )
            for o in objs
            if o.get("kind") in ("ClusterRole", "Role")
        }
        self._bindings = [o for o in objs if o.get("kind") in ("ClusterRoleBinding", "RoleBinding")]

    def allows(self, account: tuple[str, str], request: Request) -> bool:
        """Whether the ServiceAccount ``(namespace, name)`` may make ``request``."""
        for binding in self._bindings:
            if not _binds(binding, account):
                continue
            ref = binding["roleRef"]
            where = binding["metadata"].get("namespace") or ""
            if binding["kind"] == "RoleBinding":
                if request.namespace != where:
                    continue  # a RoleBinding grants only inside its namespace
                role_ns = where if ref["kind"] == "Role" else ""
            else:
                role_ns = ""
            rules = self._roles.get((ref["kind"], role_ns, ref["name"]), [])
            if any(_matches(rule, request) for rule in rules):
                return True
        return False

    def allows_as_node(
        self,
        account: tuple[str, str],
        *,
        token_node: str,
        node: str,
        request: Request,
        pods_on_node: Iterable[str] = (),
    ) -> bool:
        """Whether ``account``, whose token is bound to ``token_node``, may make ``request``
        acting as ``node`` (``Impersonate-User: system:node:<node>``; ``pods_on_node``: the
        ``namespace/name`` of the Pods bound to it)."""
        if node != token_node:
            return False  # associated-node: only the node the token is bound to
        identity = Request(
            verb="impersonate:associated-node",
            group="authentication.k8s.io",
            resource="nodes",
            name="*",  # the server checks for every node name (one cached answer per account)
        )
        action = Request(
            verb=f"impersonate-on:associated-node:{request.verb}",
            group=request.group,
            resource=request.resource,
            namespace=request.namespace,
            name=request.name,
        )
        if not (self.allows(account, identity) and self.allows(account, action)):
            return False
        return node_authorizer_allows(node, request, pods_on_node=pods_on_node)


def node_authorizer_allows(node: str, request: Request, *, pods_on_node: Iterable[str]) -> bool:
    """The Node authorizer's answer for Pods (AuthorizeNodeWithSelectors, GA in 1.34): list and
    watch only with the ``spec.nodeName=<node>`` field selector, get only a Pod bound to the node
    (``pods_on_node``: ``namespace/name``); other resources are outside this model (False)."""
    if request.group != "" or request.resource != "pods":
        return False
    if request.verb in ("list", "watch"):
        terms = [t.strip() for t in request.field_selector.split(",")]
        return f"spec.nodeName={node}" in terms
    if request.verb == "get":
        return f"{request.namespace}/{request.name}" in set(pods_on_node)
    return False


def _binds(binding: Mapping[str, Any], account: tuple[str, str]) -> bool:
    namespace, name = account
    for subject in binding.get("subjects") or ():
        if subject.get("kind") == "ServiceAccount" and (
            subject.get("namespace"),
            subject.get("name"),
        ) == (namespace, name):
            return True
        if subject.get("kind") == "Group" and subject.get("name") in (
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ):
            return True
    return False


def _matches(rule: Mapping[str, Any], request: Request) -> bool:
    def has(key: str, value: str) -> bool:
        listed = rule.get(key) or ()
        return "*" in listed or value in listed

    if not (has("verbs", request.verb) and has("apiGroups", request.group)):
        return False
    if not has("resources", request.resource):
        return False
    names = rule.get("resourceNames") or ()
    return not names or request.name in names
