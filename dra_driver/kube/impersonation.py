"""Acting as this node: the API connection the allocation watch reads this node's Pods through.

Why it exists: RBAC cannot express the ``spec.nodeName`` field selector, so a ServiceAccount
granted ``list``/``watch`` on ``pods`` may read every Pod of the cluster (issue 48,
docs/security.md). kube-apiserver 1.36 lets a Pod's service account act as the node the Pod runs
on and nothing else (constrained impersonation, KEP-5284, beta and on by default in 1.36;
``impersonate:associated-node``): the request carries ``Impersonate-User: system:node:<node>``
(the username only; the server sets the node's groups), the server checks that the caller's
token is bound to that node (its ``authentication.kubernetes.io/node-name`` extra), that the
caller holds ``impersonate-on:associated-node:<verb>`` on the resource, and then authorizes the
request as the node: the Node authorizer lets a node list and watch only the Pods whose
``spec.nodeName`` is itself. The agent so reads exactly the Pods its kubelet reads.
"""

from __future__ import annotations

from dra_driver.kube.client import KubeClient

NODE_PREFIX = "system:node:"


def node_headers(node_name: str) -> tuple[tuple[str, str], ...]:
    """The headers that make a request act as ``node_name`` (constrained impersonation)."""
    if not node_name:
        raise ValueError("cannot act as a node without a node name")
    return (("Impersonate-User", f"{NODE_PREFIX}{node_name}"),)


def as_node(client: KubeClient, node_name: str) -> KubeClient:
    """A client on ``client``'s configuration whose every request acts as ``node_name``."""
    return client.with_headers(node_headers(node_name))
