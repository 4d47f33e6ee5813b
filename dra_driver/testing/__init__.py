"""The test kit: stand-ins for what cannot run on a laptop or in CI, kept apart from the product.

Nothing here runs in a node agent. It serves the tests, the benchmarks, the fault suite and the
``demo``: an in-memory Kubernetes API server with its admission rules and feature gates
(:mod:`.fakeapi`), a kubelet stand-in for the DRA gRPC API (:mod:`.kubeletsim`) and one for the
device-plugin API (:mod:`.dpkubeletsim`), file-system fault injection (:mod:`.faultinject`) and
the fault suite (:mod:`.faultsuite`). The fake *GPU* backend that ``--fake`` serves to users is a
product feature and lives in :mod:`dra_driver.devices.fake`. ``tests/test_layering.py`` keeps
product modules from importing this package.
"""
