"""The floor of a prepare: a minimal kubelet plugin doing only what any prepare must (issue 46).

Why it exists: a figure of ours means little against a number remembered from another day and
another load (issue 37 compared with one). Upstream's Go kubelet-plugin helper, per prepare,
GETs the claim, writes its CDI spec and records the claim in a checkpoint; this does the same in
Python with nothing else, so ``benchmarks/prepare.py`` runs it beside the agent in the same run,
against the same API server, on the same sockets, and gives every figure against it. It needs no
Go and no network beyond the API server.

What it does per claim (``NodePrepareResources``, the kubelet's v1 DRA service on
``<plugins-dir>/<driver>/dra.sock``; gRPC's thread pool of 16, one claim per call or many):

* ``GET .../resourceclaims/NAME`` over the kubeconfig's TLS (client certificate), one kept-alive
  ``http.client`` connection per gRPC thread, ``json.loads`` of the body; the UID must match;
* the CDI spec of the claim's devices of this driver: a JSON file written under a temporary name
  and renamed (runtimes watch for the rename), not fsynced;
* the checkpoint: every prepared claim in one JSON file, written under a temporary name,
  fsynced, renamed (the kubelet's checkpoint manager's way), under one lock.

Unprepare removes the CDI spec and writes the checkpoint again. No claim status, no metrics, no
logs, no validation beyond the UID, no device state, no recovery: the Go helper does no more on
this path. Run by ``benchkit.Plugin(floor=True)``; alone:
``python benchmarks/floorplugin.py --kubeconfig K --plugins-dir D --cdi-root C``.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import ssl
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from dra_driver.pb.dra.v1 import dra_pb2, dra_pb2_grpc

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}"


class Floor(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, kubeconfig: Path, cdi_root: Path, checkpoint: Path, driver: str) -> None:
        config = json.loads(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context: ssl.SSLContext | None = None
        if url.scheme == "https":
            self.context = ssl.create_default_context(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp, "c"), Path(tmp, "k")
                cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                self.context.load_cert_chain(cert, key)
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.cdi_root, self.checkpoint, self.driver = cdi_root, checkpoint, driver
        self.local = threading.local()
        self.lock = threading.Lock()
        self.prepared: dict[str, Any] = {}
        cdi_root.mkdir(parents=True, exist_ok=True)

    def get(self, namespace: str, name: str) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = (
                http.client.HTTPSConnection(self.host, self.port, context=self.context)
                if self.context
                else http.client.HTTPConnection(self.host, self.port)
            )
            self.local.conn = conn
        try:
            conn.request("GET", CLAIMS.format(namespace, name), headers=self.headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise
        if response.status != 200:
            raise RuntimeError(f"GET claim {namespace}/{name}: HTTP {response.status}")
        return json.loads(body)

    def prepare_one(self, claim: Any) -> tuple[list[Any], str]:
        try:
            obj = self.get(claim.namespace, claim.name)
            if obj["metadata"]["uid"] != claim.uid:
                return [], f"claim {claim.namespace}/{claim.name}: UID {claim.uid} is gone"
            results = [
                r
                for r in obj["status"]["allocation"]["devices"]["results"]
                if r["driver"] == self.driver
            ]
            kind = "k8s.gpu.nvidia.com/claim"
            spec = {
                "cdiVersion": "0.8.0",
                "kind": kind,
                "devices": [
                    {
                        "name": f"{claim.uid}-{r['device']}",
                        "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={r['device']}"]},
                    }
                    for r in results
                ],
            }
            path = self.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(spec))
            tmp.replace(path)
            devices = [
                dra_pb2.Device(
                    request_names=[r["request"].split("/")[0]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[f"{kind}={claim.uid}-{r['device']}"],
                )
                for r in results
            ]
            with self.lock:
                self.prepared[claim.uid] = {"name": claim.name, "results": results}
                self.commit()
            return devices, ""
        except Exception as exc:  # one claim's error, never the call's
            return [], f"{type(exc).__name__}: {exc}"

    def commit(self) -> None:
        tmp = self.checkpoint.with_suffix(".tmp")
        with tmp.open("w") as out:
            out.write(json.dumps({"claims": self.prepared}))
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.checkpoint)

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            devices, error = self.prepare_one(claim)
            entry = response.claims[claim.uid]
            if error:
                entry.error = error
            else:
                entry.devices.extend(devices)
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            path = self.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"
            path.unlink(missing_ok=True)
            with self.lock:
                self.prepared.pop(claim.uid, None)
                self.commit()
            response.claims[claim.uid].SetInParent()
        return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "floor plugin").splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--plugins-dir", type=Path, required=True)
    parser.add_argument("--cdi-root", type=Path, required=True)
    parser.add_argument("--driver-name", default="gpu.nvidia.com")
    args = parser.parse_args(argv)
    home = args.plugins_dir / args.driver_name
    home.mkdir(parents=True, exist_ok=True)
    floor = Floor(args.kubeconfig, args.cdi_root, home / "checkpoint.json", args.driver_name)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(floor, server)
    server.add_insecure_port(f"unix://{home / 'dra.sock'}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
