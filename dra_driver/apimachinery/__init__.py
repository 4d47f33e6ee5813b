"""Kubernetes API machinery both sides share: quantities, semver, names, errors, decoding.

The driver validates what it sends and the in-memory API server validates what it receives with
the same rules, so neither side owns them: this package sits below both and imports neither.
"""
