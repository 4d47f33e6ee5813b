"""Allocated ResourceClaims put into the fake API server, as the scheduler would leave them, for
the tests that drive the real plugin process over its sockets."""

from __future__ import annotations

import uuid

from dra_driver.driver import claims
from dra_driver.testing.fakeapi import fakeserver


def put_claim(
    server: fakeserver.FakeApiServer,
    name: str,
    devices: list[str],
    request: str = "gpu",
    *,
    namespace: str = "team",
    device_class: str = "gpu.nvidia.com",
) -> claims.ClaimRef:
    """A claim with one request (``request``; ``a/b`` for a firstAvailable alternative)
    allocated ``devices`` of pool ``n1``; its reference for the test kubelet."""
    uid = str(uuid.uuid4())
    server.api.put_resource_claim(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": request.split("/")[0],
                            "exactly": {"deviceClassName": device_class, "count": len(devices)},
                        }
                    ]
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": request,
                                "driver": "gpu.nvidia.com",
                                "pool": "n1",
                                "device": d,
                            }
                            for d in devices
                        ]
                    }
                }
            },
        }
    )
    return claims.ClaimRef(uid=uid, namespace=namespace, name=name)
