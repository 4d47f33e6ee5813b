"""dra-driver: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""

__version__ = "0.1.0"
