"""``make gpu-check``: the real-GPU path, on a node with NVIDIA GPUs (docs/gpu-check.md)."""
