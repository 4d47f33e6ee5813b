"""The driver core of the kubelet plugin: claims → devices → CDI specs and a crash-safe checkpoint.

Nothing in this package imports gRPC, protobuf or the Kubernetes client; the kubelet adapter
(:mod:`dra_driver.kubelet`) and the composition root (:mod:`dra_driver.app`) do.
"""
