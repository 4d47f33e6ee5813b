"""Legacy device-plugin mode: ``nvidia.com/gpu`` limits served over the kubelet device plugin API.

Why a second mode: many workloads still ask for ``resources.limits: nvidia.com/gpu: N``. This
package serves them from the same discovery, health and topology knowledge as the DRA path:
:mod:`inventory` maps the device model to plugin devices (replicas, MIG strategies),
:mod:`preferred` picks topology-optimal sets, :mod:`allocate` computes container edits,
:mod:`cdi` keeps the static CDI spec, :mod:`health` carries health changes, :mod:`service` is the
thin gRPC servicer, :mod:`registrar` owns sockets and kubelet registration and :mod:`app` wires
it all together. Only ``service``, ``registrar`` and ``app`` import gRPC.
"""
