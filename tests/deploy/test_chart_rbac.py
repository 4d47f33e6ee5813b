"""The acceptance of the agent's permissions (issue 48, docs/security.md), asked of the chart's
rendered RBAC objects as the RBAC and Node authorizers answer it: with the default chart the
agent's token cannot get, list or watch Pods outside the driver's namespace, and acting as its
node it reads only the Pods bound to that node; ``allocationSource: pods`` is the explicit,
wider grant. Also ties the fake API server's impersonation model to what the chart grants."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from dra_driver.testing import rbac
from dra_driver.testing.fakeapi import impersonation

AGENT = ("dra-driver", "dra-driver")  # the rendered ServiceAccount (namespace, name)
POD_READS = ("get", "list", "watch")


def authorizer(rc: ModuleType, values: dict[str, Any] | None = None) -> rbac.Rbac:
    return rbac.Rbac(m.obj for m in rc.render(values or {}))


def pods(verb: str, namespace: str = "", name: str = "", selector: str = "") -> rbac.Request:
    return rbac.Request(
        verb=verb,
        group="",
        resource="pods",
        namespace=namespace,
        name=name,
        field_selector=selector,
    )


@pytest.mark.parametrize(
    "values", [{}, {"computeDomains": {"enabled": True}}], ids=["default", "cd"]
)
def test_the_agent_s_token_reads_no_pod_outside_the_driver_namespace(
    rc: ModuleType, values: dict[str, Any]
) -> None:
    auth = authorizer(rc, values)
    for verb in POD_READS:
        assert not auth.allows(AGENT, pods(verb)), f"{verb} pods in every namespace"
        assert not auth.allows(AGENT, pods(verb, "team", "job-0")), f"{verb} pods of team"
        assert not auth.allows(AGENT, pods(verb, "kube-system")), f"{verb} pods of kube-system"
    # The MPS daemon Pods it owns, in its own namespace only (a Role; docs/security.md).
    assert auth.allows(AGENT, pods("list", "dra-driver"))


def test_acting_as_its_node_it_reads_only_that_node_s_pods(rc: ModuleType) -> None:
    auth = authorizer(rc)

    def as_node(request: rbac.Request, node: str = "n1") -> bool:
        return auth.allows_as_node(
            AGENT, token_node="n1", node=node, request=request, pods_on_node=["team/job-0"]
        )

    assert as_node(pods("list", selector="spec.nodeName=n1"))
    assert as_node(pods("watch", selector="spec.nodeName=n1"))
    assert not as_node(pods("list"))  # kubectl get pods -A, as the node
    assert not as_node(pods("list", "team"))
    assert not as_node(pods("list", selector="spec.nodeName=n2"))
    assert not as_node(pods("get", "team", "job-0"))  # get is not granted to the impersonation
    assert not as_node(pods("get", "team", "job-9"))
    assert not as_node(pods("list", selector="spec.nodeName=n2"), node="n2")  # not its node
    secrets = rbac.Request(verb="get", group="", resource="secrets", namespace="team", name="s")
    assert not as_node(secrets)  # nothing but Pod list/watch may be done as the node


def test_allocation_source_pods_grants_every_pod_and_no_impersonation(rc: ModuleType) -> None:
    auth = authorizer(rc, {"kubeletPlugin": {"allocationSource": "pods"}})
    assert auth.allows(AGENT, pods("list"))  # the documented, wider grant
    assert auth.allows(AGENT, pods("watch"))
    assert not auth.allows(AGENT, pods("get", "team", "job-0"))
    assert not auth.allows_as_node(
        AGENT, token_node="n1", node="n1", request=pods("list", selector="spec.nodeName=n1")
    )


def test_the_fake_server_grants_the_impersonation_what_the_chart_grants(rc: ModuleType) -> None:
    granted = set()
    for manifest in rc.render({}):
        if manifest.obj["kind"] != "ClusterRole":
            continue
        for rule in manifest.obj["rules"]:
            for verb in rule["verbs"]:
                if verb.startswith("impersonate-on:associated-node:"):
                    for resource in rule["resources"]:
                        granted.add((verb.rsplit(":", 1)[1], resource))
    assert granted == set(impersonation.GRANTED)


def test_the_agent_may_create_events_and_never_read_or_change_them(rc: ModuleType) -> None:
    auth = authorizer(rc)

    def events(verb: str, group: str = "events.k8s.io") -> rbac.Request:
        return rbac.Request(verb=verb, group=group, resource="events", namespace="team")

    assert auth.allows(AGENT, events("create"))  # a claim whose device vanished (docs/lifecycle.md)
    for verb in ("get", "list", "watch", "update", "patch", "delete"):
        assert not auth.allows(AGENT, events(verb)), verb
    assert not auth.allows(AGENT, events("create", group=""))  # not the core API's Events
