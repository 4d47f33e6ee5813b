"""What kube-apiserver (1.36) lets the node agent do when it acts as its own node.

Why it exists: by default the agent learns of the claims allocated on its node by listing and
watching that node's Pods *as the node* (constrained impersonation, KEP-5284, beta and on in
1.36: ``Impersonate-User: system:node:<node>``; docs/security.md). The real server then checks
three things, and the in-memory server must refuse what they refuse, or a test of the agent
passes against a server that would answer 403:

* the constrained impersonation itself: only the username may be given (no
  ``Impersonate-Group``/``-Uid``/``-Extra-*``), it must be a node's (``system:node:<name>``), and
  for ``impersonate:associated-node`` the node must be the one the caller's service account
  token is bound to (its ``authentication.kubernetes.io/node-name`` extra);
* the caller's ``impersonate-on:associated-node:<verb>`` permission on the resource: the chart
  grants it for ``list`` and ``watch`` of ``pods`` only (``deployments/helm``, rbac.yaml);
* the Node authorizer, for the node: it lists and watches Pods only with the field selector
  ``spec.nodeName=<itself>`` (AuthorizeNodeWithSelectors, GA in 1.34).

The fake has no RBAC of its own for unimpersonated requests (its one token may do anything);
this models only the impersonated path, as the chart configures it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra_driver.kube import api

NODE_PREFIX = "system:node:"
# What the chart grants as impersonate-on:associated-node:<verb>: (verb, resource).
GRANTED = frozenset({("list", "pods"), ("watch", "pods")})


def check(
    headers: Iterable[tuple[str, str]],
    *,
    method: str,
    path: str,
    query: Mapping[str, str],
    bound_node: str | None,
    pod_namespaces: frozenset[str] | None = None,
) -> None:
    """Raise 403 (Forbidden) unless the request is not impersonated, or is one the real server
    allows an agent acting as its node; ``bound_node``: the node the server's token is bound to
    (None: any node, a token whose binding the test does not care about); ``pod_namespaces``:
    where the token may read Pods with its own identity, as the default chart's RBAC grants
    (the driver's namespace; None: anywhere, a token whose RBAC the test does not model)."""
    sent = [(name.lower(), value) for name, value in headers]
    user = next((value for name, value in sent if name == "impersonate-user"), None)
    others = [n for n, _ in sent if n.startswith("impersonate-") and n != "impersonate-user"]
    if user is None:
        if others:
            raise api.ApiError(400, "impersonation headers without Impersonate-User")
        if pod_namespaces is not None and method == "GET":
            _own_pod_read(path, pod_namespaces)
        return
    if others:
        raise _forbidden(
            f'users "{user}" is forbidden: constrained node impersonation takes the username '
            f"only (got {', '.join(sorted(others))}), and legacy impersonation is not granted"
        )
    if not user.startswith(NODE_PREFIX) or not user[len(NODE_PREFIX) :]:
        raise _forbidden(f'users "{user}" is forbidden: cannot impersonate users')
    node = user[len(NODE_PREFIX) :]
    if bound_node is not None and node != bound_node:
        raise _forbidden(
            f'nodes "{node}" is forbidden: cannot impersonate:associated-node: the caller\'s '
            f'token is bound to node "{bound_node}"'
        )
    verb, resource = _attributes(method, path, query)
    if (verb, resource) not in GRANTED:
        raise _forbidden(
            f"{resource} is forbidden: cannot impersonate-on:associated-node:{verb} {resource}"
        )
    wanted = f"spec.nodeName={node}"
    terms = [t.strip() for t in (query.get("fieldSelector") or "").split(",")]
    if wanted not in terms:
        raise _forbidden(
            f'pods is forbidden: User "{user}" cannot {verb} resource "pods": can only '
            "list/watch pods with spec.nodeName field selector"
        )


def _own_pod_read(path: str, namespaces: frozenset[str]) -> None:
    """Refuse a Pod read outside ``namespaces`` (the RBAC authorizer's answer to the token)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["api", "v1"]:
        return
    if parts[2:3] == ["pods"]:
        raise _forbidden('pods is forbidden: cannot list resource "pods" at the cluster scope')
    in_namespace = len(parts) >= 5 and parts[2] == "namespaces" and parts[4] == "pods"
    if in_namespace and parts[3] not in namespaces:
        raise _forbidden(f'pods is forbidden: cannot read resource "pods" in "{parts[3]}"')


def _attributes(method: str, path: str, query: Mapping[str, str]) -> tuple[str, str]:
    """(verb, resource) as the authorizer sees them; resource "" for what is not a Pod
    collection (only those are granted)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if method != "GET":
        return method.lower(), _resource(parts)
    collection = parts in (["api", "v1", "pods"],) or (
        len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods"
    )
    if not collection:
        return "get", _resource(parts)
    return ("watch" if query.get("watch") in ("1", "true") else "list"), "pods"


def _resource(parts: list[str]) -> str:
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return "/".join(parts)
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:]
    return rest[0] if rest else ""


def _forbidden(message: str) -> api.ApiError:
    return api.ApiError(403, message, reason="Forbidden")
