"""Structured-parameters allocation on one node: CEL selectors, claim allocation, topology scoring.

This package answers "which of this node's devices can satisfy this ResourceClaim, and which
choice is best?" without a cluster: it evaluates DeviceClass and request CEL selectors the way
the Kubernetes scheduler does, so the simulator and the demo reach the scheduler's verdicts.
"""
