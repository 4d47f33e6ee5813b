"""A node joining and leaving a ComputeDomain: its ``status.nodes`` entry and its node label.

Why it exists: both are shared state that other writers touch at the same time — every node
agent of the domain writes its own entry into the same status, the controller writes the
overall status — so each change is a read-modify-write with the ``resourceVersion`` it read,
retried on conflict. Joining checks the clique in the same write: the entries already there
say which NVLink clique the domain lives in, and a node of another clique is refused, in words,
before it changes anything (two nodes of different cliques joining at once cannot both win:
the second write conflicts, re-reads, and sees the first).

The label ``resource.nvidia.com/computeDomain=<domain UID>`` is what the domain's IMEX daemon
DaemonSet selects; only this node's agent sets or removes it on its Node, and it is removed only
while it still names the domain being left.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS, ObjectApi

ATTEMPTS = 5


class Refused(Exception):
    """This node cannot join the domain; the message says why, in words."""


class Membership:
    """This node's side of its domains' status and of its Node label."""

    def __init__(
        self,
        *,
        kube: api.KubeApi,
        objects: ObjectApi,
        node_name: str,
        node_ip: str,
        clique: str,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._kube = kube
        self._objects = objects
        self.node_name = node_name
        self.node_ip = node_ip
        self.clique = clique
        self._log = log

    # ------------------------------------------------------------------ status.nodes
    def join(self, domain: cdapi.Domain) -> cdapi.Domain:
        """Add (or correct) this node's entry; raises :class:`Refused` across cliques."""

        def change(current: cdapi.Domain) -> list[cdapi.DomainNode] | None:
            others = [n for n in current.nodes if n.name != self.node_name]
            foreign = sorted({n.clique_id for n in others if n.clique_id != self.clique})
            if foreign:
                members = ", ".join(n.name for n in others if n.clique_id != self.clique)
                raise Refused(
                    f"{current} spans NVLink cliques: its node(s) {members} are in clique "
                    f"{', '.join(foreign)}, this node {self.node_name} is in clique "
                    f"{self.clique}; IMEX channels only connect the nodes of one clique (keep "
                    "the domain's pods on one clique, e.g. with a pod affinity on the "
                    "nvidia.com/gpu.clique node label)"
                )
            mine = current.node(self.node_name)
            if mine is not None and (mine.ip_address, mine.clique_id) == (
                self.node_ip,
                self.clique,
            ):
                return None
            taken = {n.index for n in others}
            index = (
                mine.index
                if mine is not None
                else next(i for i in range(len(taken) + 1) if i not in taken)
            )
            entry = cdapi.DomainNode(
                name=self.node_name,
                ip_address=self.node_ip,
                clique_id=self.clique,
                index=index,
                status=cdapi.NOT_READY,
            )
            return [*others, entry]

        return self._update(domain, change)

    def leave(self, domain_uid: str, namespace: str, name: str) -> None:
        """Remove this node's entry (the domain may be gone: nothing to do then)."""

        def change(current: cdapi.Domain) -> list[cdapi.DomainNode] | None:
            if current.node(self.node_name) is None:
                return None
            return [n for n in current.nodes if n.name != self.node_name]

        self._update_by_name(domain_uid, namespace, name, change)

    def set_ready(self, domain_uid: str, namespace: str, name: str, ready: bool) -> bool:
        """Set this node's entry Ready / NotReady (only if it has one); whether it changed."""
        wanted = cdapi.READY if ready else cdapi.NOT_READY
        changed = False

        def change(current: cdapi.Domain) -> list[cdapi.DomainNode] | None:
            nonlocal changed
            mine = current.node(self.node_name)
            if mine is None or mine.status == wanted:
                return None
            changed = True
            entry = cdapi.DomainNode(mine.name, mine.ip_address, mine.clique_id, mine.index, wanted)
            return [entry if n.name == self.node_name else n for n in current.nodes]

        self._update_by_name(domain_uid, namespace, name, change)
        return changed

    def _update_by_name(
        self,
        domain_uid: str,
        namespace: str,
        name: str,
        change: Callable[[cdapi.Domain], list[cdapi.DomainNode] | None],
    ) -> None:
        try:
            obj = self._objects.get(COMPUTE_DOMAINS, name, namespace=namespace)
        except api.NotFound:
            return
        domain = cdapi.Domain.from_obj(obj)
        if domain.uid != domain_uid:
            return  # another domain of that name now: ours is gone
        try:
            self._update(domain, change, first=obj)
        except api.NotFound:
            return  # deleted meanwhile (its finalizer went between our read and our write)

    def _update(
        self,
        domain: cdapi.Domain,
        change: Callable[[cdapi.Domain], list[cdapi.DomainNode] | None],
        *,
        first: api.Obj | None = None,
    ) -> cdapi.Domain:
        obj = first
        for attempt in range(ATTEMPTS):
            if obj is None:
                obj = self._objects.get(COMPUTE_DOMAINS, domain.name, namespace=domain.namespace)
            current = cdapi.Domain.from_obj(obj)
            if current.uid != domain.uid:
                raise api.NotFound(f"{domain} (uid {domain.uid}) was deleted")
            nodes = change(current)
            if nodes is None:
                return current
            try:
                written = self._objects.update_status(COMPUTE_DOMAINS, cdapi.with_nodes(obj, nodes))
            except api.Conflict:
                if attempt == ATTEMPTS - 1:
                    raise
                obj = None
                continue
            return cdapi.Domain.from_obj(written)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ the node label
    def bound_to(self) -> str:
        """The UID of the domain this node is bound to ("" when none)."""
        node = self._kube.get_node(self.node_name)
        return str(((node.get("metadata") or {}).get("labels") or {}).get(cd.NODE_LABEL) or "")

    def bind(self, domain_uid: str) -> None:
        self._kube.patch_node(self.node_name, {"metadata": {"labels": {cd.NODE_LABEL: domain_uid}}})

    def unbind(self, domain_uid: str) -> bool:
        """Remove the label if it names ``domain_uid``; whether it did."""
        if self.bound_to() != domain_uid:
            return False
        self._kube.patch_node(self.node_name, {"metadata": {"labels": {cd.NODE_LABEL: None}}})
        return True
