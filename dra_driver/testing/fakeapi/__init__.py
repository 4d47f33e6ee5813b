"""The in-memory Kubernetes API server that tests, benchmarks and the demo run against.

It stands in for kube-apiserver (which no package registry ships) behind the port in
:mod:`dra_driver.kube.api`: resourceVersion conflicts, 404s, watches with 410, strict decoding and
the resource.k8s.io validation rules, served in-process or over real HTTP (``fakeserver``).
"""
