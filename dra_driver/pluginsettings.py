"""What the node agent (``dra-driver kubelet-plugin``) is configured with, and the paths that
follow from it.

Why its own module: the flags and environment twins (:mod:`dra_driver.cli.kubelet_plugin`), the
composition root (:mod:`dra_driver.app`), the fault suite and the tests all build these settings;
keeping them apart from the wiring keeps :mod:`dra_driver.app` about wiring. Socket names follow
contracts.md §8.2 (per pod UID for seamless upgrades, shortened when a unix socket path would be
too long).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from dra_driver import healthcontrol, records
from dra_driver.computedomain.settings import ComputeDomainSettings
from dra_driver.devices import healthpolicy, migprofiles
from dra_driver.devices import passthrough as passthrough_mod
from dra_driver.driver import checkpoint
from dra_driver.kubelet import server
from dra_driver.slices import shares

# How the allocation watch reads this node's Pods (--allocation-source, docs/security.md).
ALLOCATION_SOURCES = ("node", "pods")


@records.record
class PluginSettings:
    """Everything the node agent is configured with (flags / environment)."""

    node_name: str
    driver_name: str = "gpu.nvidia.com"
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/run/cdi")
    # Where new claims' metadata files go (--metadata-dir; None: <plugin-dir>/claim-metadata):
    # a tmpfs suits them (docs/metadata.md), a claim prepared earlier keeps its spec's paths.
    metadata_dir: Path | None = None
    kubeconfig: Path | None = None
    kube_context: str | None = None  # --context: a kubeconfig context, not its current one
    driver_root: Path = Path("/")
    driver_root_mount: Path | None = None  # where this process sees driver_root, if elsewhere
    pod_uid: str = ""  # set: per-instance socket names, state shared with another instance
    fake: bool = False
    dev_root: Path = Path("/")
    boot_id_file: Path = checkpoint.BOOT_ID_FILE
    workers: int = 32  # threads preparing the claims of one call in parallel
    grpc_workers: int = 16  # threads serving the DRA socket: one call (one claim, usually) each
    api_keepalive_s: float = 30.0  # refresh idle API connections this old (server cut-off: 90 s)
    api_warm_connections: int = 1  # opened at start and kept open for good (bursts open more)
    serial: bool = False
    cleanup_interval_s: float = 60.0
    publish: bool = True
    publish_grace_s: float = 60.0  # publishing may fail this long before /readyz says 503
    watch_timeout_s: float = 30.0  # each watch of our slices; silence past it: connection dead
    dynamic_mig: str = migprofiles.NONE  # none | all | product-name regex (--dynamic-mig)
    node_labels: bool = True  # keep this node's GPU labels (docs/labels.md) on its Node
    node_labels_resync_s: float = 60.0
    health: healthpolicy.HealthPolicy = dataclasses.field(default_factory=healthpolicy.HealthPolicy)
    shareable: shares.Shareable = shares.NONE  # GPUs published with consumable capacity
    gpu_sets: bool = True  # set ranks on the GPU devices (--gpu-sets, docs/topology.md)
    # Ranks follow the claims allocated on this node, not only the prepared ones: a watch of
    # the node's Pods (--watch-allocations, docs/topology.md).
    watch_allocations: bool = True
    # ... read as this node ("node": constrained impersonation, only this node's Pods) or with
    # the agent's own identity ("pods": cluster-wide Pod reads); docs/security.md.
    allocation_source: str = "node"
    mps_check_interval_s: float = 10.0  # how often dead MPS daemons are looked for (0 = never)
    mps_daemon_image: str = ""  # set: MPS control daemons run in Pods of this image (sharing.md)
    pod_namespace: str = ""  # the agent's namespace (POD_NAMESPACE): where those Pods are made
    mps_ready_timeout_s: float = 30.0  # a daemon Pod is Ready within this, or the claim fails
    gpu_metrics_interval_s: float = 15.0  # one NVML telemetry pass per interval (0 = off)
    # The second driver, compute-domain.nvidia.com (docs/computedomains.md); None = off.
    compute_domains: ComputeDomainSettings | None = None
    # GPUs offered for VFIO passthrough too (--passthrough, docs/passthrough.md), and the root
    # whose sys/ and dev/ the agent binds them through (--vfio-root; a fake kernel's in tests).
    passthrough: str = "none"
    vfio_root: Path = Path("/")
    # The NVIDIA kernel module's /proc directory, read while NVML is released for a driver
    # upgrade (--nvidia-proc-dir; None: /proc/driver/nvidia, a fake node's own under fake);
    # the release ends by itself after nvml_release_deadline_s (docs/lifecycle.md).
    nvidia_proc_dir: Path | None = None
    nvml_release_deadline_s: float = 900.0

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def api_connections(self) -> int:
        """API connections a burst may use at once: one per thread that may GET a claim while
        the others do (every gRPC worker; a call's claims run on the ``workers`` pool, kept up
        to that). Only ``api_warm_connections`` are opened at start: the others cost every
        agent memory and the API server TLS handshakes at every rollout (docs/fleet.md)."""
        return self.grpc_workers

    @property
    def dra_socket(self) -> Path:
        if not self.pod_uid:
            return self.plugin_dir / "dra.sock"
        return _fit(self.plugin_dir, f"dra-{self.pod_uid}.sock", f"dra-{self._short_id}.sock")

    @property
    def registration_socket(self) -> Path:
        if not self.pod_uid:
            return self.registry_dir / f"{self.driver_name}-reg.sock"
        return _fit(
            self.registry_dir,
            f"{self.driver_name}-{self.pod_uid}-reg.sock",
            f"{self._short_id}-reg.sock",
        )

    @property
    def health_socket(self) -> Path:
        """Where ``discover`` and ``fake-event`` reach this agent (:mod:`.healthcontrol`)."""
        return healthcontrol.dra_socket(self.plugin_dir, self._short_id if self.pod_uid else "")

    @property
    def lock_dir(self) -> Path:
        return self.plugin_dir / "locks"

    @property
    def dynamic(self) -> migprofiles.DynamicMig:
        return migprofiles.DynamicMig.parse(self.dynamic_mig)

    @property
    def vfio(self) -> passthrough_mod.Passthrough:
        return passthrough_mod.Passthrough.parse(self.passthrough)

    @property
    def fake_mig_state(self) -> Path:
        """Fake nodes: where the NVML stand-in keeps MIG instances (they outlive the agent)."""
        return self.plugin_dir / "fake-mig-state.json"

    @property
    def proc_dir(self) -> Path:
        """Where the driver's ``version`` file is read (fake nodes: the stand-in writes it)."""
        if self.nvidia_proc_dir is not None:
            return self.nvidia_proc_dir
        return self.plugin_dir / "fake-proc-nvidia" if self.fake else Path("/proc/driver/nvidia")

    @property
    def _short_id(self) -> str:
        """A short stand-in for driver + pod UID when the full socket path is too long."""
        return hashlib.sha256(f"{self.driver_name}/{self.pod_uid}".encode()).hexdigest()[:16]


def _fit(directory: Path, name: str, short: str) -> Path:
    """``directory/name``, or ``directory/short`` when that would not fit a unix socket path."""
    fits = len(os.fsencode(directory.absolute() / name)) <= server.MAX_SOCKET_PATH
    return directory / (name if fits else short)
