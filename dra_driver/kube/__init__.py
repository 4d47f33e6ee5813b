"""The Kubernetes API as the driver sees it: the narrow port and the real adapter behind it.

The in-memory server is in :mod:`dra_driver.testing.fakeapi`; the shared API machinery in
:mod:`dra_driver.apimachinery`.
"""
