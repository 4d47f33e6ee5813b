"""The objects the controller keeps for each ComputeDomain, built as plain dicts.

Why it exists apart from the controller: what a domain needs is a pure function of the domain
and the controller's settings, and tests (and the demo's stand-in DaemonSet controller) read the
same builders. Per domain:

- the workload ResourceClaimTemplate, in the domain's namespace under the name the domain's
  ``spec.channel.resourceClaimTemplate.name`` gives, owned by the domain (garbage collected with
  it): one IMEX channel of class ``compute-domain-default-channel.nvidia.com``, with the opaque
  ``ComputeDomainChannelConfig`` naming the domain (``domainID``: its UID) and the allocation mode;
- the daemon ResourceClaimTemplate and the IMEX daemon DaemonSet, in the driver's namespace
  (so not owned by the domain: owner references cannot cross namespaces; the controller's
  finalizer removes them), labelled with the domain's UID. The DaemonSet runs one daemon pod on
  every node labelled ``resource.nvidia.com/computeDomain=<uid>`` (the node agents label a node
  when a workload's channel is prepared there), each with a daemon claim whose prepare writes the
  IMEX configuration.

The daemon pods run the driver's own image. On fake nodes their program is the stand-in IMEX
daemon; on real nodes it is ``dra-driver imex-daemon``, which runs NVIDIA's ``nvidia-imex`` and
reports its readiness (:mod:`.imexdaemon`). NVIDIA's IMEX binaries are not in the image: the
real daemon pod mounts the host's driver root (``Settings.driver_root``) read-only at
``/driver-root``, where the wrapper finds them after PATH, and runs privileged as root — the
daemon claim's CDI spec adds no ``/dev/nvidia*`` nodes, and ``nvidia-imex`` needs the driver's
control and IMEX capability devices and writes root-owned ``/imexd`` and ``/var/run``.
"""

from __future__ import annotations

from typing import Any

from dra_driver import computedomain as cd
from dra_driver import records
from dra_driver.computedomain import imexdaemon
from dra_driver.computedomain.api import Domain
from dra_driver.kube.objects import owner_reference

MANAGED_BY = "dra-driver-controller"
# The IMEX daemon in fake mode: the stand-in that reads the same files (no GPU, no IMEX).
FAKE_IMEX_COMMAND = (
    "python",
    "-m",
    "dra_driver.computedomain.fakeimex",
    "--config-dir",
    cd.DAEMON_DIR,
)
# With real GPUs: NVIDIA's IMEX daemon on the config the agent wrote, run and watched by our
# wrapper, which writes the status.json the agent reads (nvidia-imex writes none).
IMEX_COMMAND = ("dra-driver", "imex-daemon", "--config-dir", cd.DAEMON_DIR)
# Where the real daemon pods see the host's NVIDIA driver root (imex-daemon's --driver-root).
DRIVER_ROOT_MOUNT = imexdaemon.DRIVER_ROOT_MOUNT


@records.record
class Settings:
    """What the daemon workload looks like (``dra-driver controller`` flags)."""

    namespace: str  # the driver's namespace: DaemonSets and daemon claim templates live here
    image: str = "dra-driver:latest"
    command: tuple[str, ...] = IMEX_COMMAND
    service_account: str = ""  # empty: the namespace's default (the daemon needs no API access)
    priority_class: str = ""
    # Real daemons: the host's NVIDIA driver root (/ for a host-installed driver,
    # /run/nvidia/driver for a driver container), mounted at DRIVER_ROOT_MOUNT.
    driver_root: str = "/"

    @property
    def fake(self) -> bool:
        """The stand-in daemon: no driver files, no privileges."""
        return self.command == FAKE_IMEX_COMMAND


def labels(domain: Domain) -> dict[str, str]:
    return {cd.NODE_LABEL: domain.uid, "app.kubernetes.io/managed-by": MANAGED_BY}


def daemon_name(domain: Domain) -> str:
    """The DaemonSet's and daemon claim template's name: unique per domain (its UID)."""
    return f"imex-{domain.uid}"


def workload_template(domain: Domain, owner: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate workload pods reference (``owner``: the domain object)."""
    return _template(
        name=domain.template_name,
        namespace=domain.namespace,
        labels=labels(domain),
        owner_refs=[owner_reference(owner)],
        request="channel",
        device_class=cd.CHANNEL_CLASS,
        parameters={
            "apiVersion": cd.API_VERSION,
            "kind": cd.CHANNEL_CONFIG_KIND,
            "domainID": domain.uid,
            "allocationMode": domain.allocation_mode,
        },
    )


def daemon_template(domain: Domain, settings: Settings) -> dict[str, Any]:
    """The ResourceClaimTemplate of the domain's daemon pods (in the driver's namespace)."""
    return _template(
        name=daemon_name(domain),
        namespace=settings.namespace,
        labels=labels(domain),
        owner_refs=[],
        request="daemon",
        device_class=cd.DAEMON_CLASS,
        parameters={
            "apiVersion": cd.API_VERSION,
            "kind": cd.DAEMON_CONFIG_KIND,
            "domainID": domain.uid,
        },
    )


def daemon_set(domain: Domain, settings: Settings) -> dict[str, Any]:
    """One IMEX daemon pod on each node bound to ``domain``. Host network: the daemons reach
    each other at the node addresses the agents report in ``status.nodes``."""
    name = daemon_name(domain)
    pod_labels = {**labels(domain), "app.kubernetes.io/name": "imex-daemon"}
    container: dict[str, Any] = {
        "name": "imex",
        "image": settings.image,
        "command": list(settings.command),
        "resources": {"claims": [{"name": "daemon"}]},
    }
    pod_spec: dict[str, Any] = {
        "nodeSelector": {cd.NODE_LABEL: domain.uid},
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "automountServiceAccountToken": False,  # the daemon needs no API access
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resourceClaims": [{"name": "daemon", "resourceClaimTemplateName": name}],
        "containers": [container],
    }
    if settings.fake:
        # The stand-in writes status.json into /imexd (root-owned on the host): root, no more.
        container["securityContext"] = {
            "runAsUser": 0,
            "runAsGroup": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    else:
        # nvidia-imex needs the driver's device nodes (the daemon claim's CDI spec adds none)
        # and root; its binaries come from the host's driver root.
        container["securityContext"] = {"privileged": True, "runAsUser": 0, "runAsGroup": 0}
        container["volumeMounts"] = [
            {"name": "driver-root", "mountPath": DRIVER_ROOT_MOUNT, "readOnly": True}
        ]
        pod_spec["volumes"] = [
            {"name": "driver-root", "hostPath": {"path": settings.driver_root, "type": "Directory"}}
        ]
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.priority_class:
        pod_spec["priorityClassName"] = settings.priority_class
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels(domain),
            "annotations": {
                "resource.nvidia.com/computeDomainName": f"{domain.namespace}/{domain.name}"
            },
        },
        "spec": {
            "selector": {"matchLabels": {cd.NODE_LABEL: domain.uid}},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def _template(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner_refs: list[dict[str, Any]],
    request: str,
    device_class: str,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if owner_refs:
        meta["ownerReferences"] = owner_refs
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {"driver": cd.DRIVER_NAME, "parameters": parameters},
                        }
                    ],
                }
            }
        },
    }
