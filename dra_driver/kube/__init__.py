"""The Kubernetes API as the driver sees it: a narrow port, the real adapter, an in-memory fake."""
