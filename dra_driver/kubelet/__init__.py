"""The kubelet-facing edge of the plugin: gRPC over unix sockets, protobuf ⇄ plain data.

Only this package (and the composition root) imports grpc and the generated protobuf code; the
driver core sees plain dataclasses.
"""
