"""The gRPC server on the CSI endpoint (a unix socket kubelet and the registrar reach)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from concurrent import futures

import grpc

from chromafs_fuse.csi.pod_identity import PodSignIn
from chromafs_fuse.csi.servicer import Identity, Node
from chromafs_fuse.csi.stubs import rpc
from chromafs_fuse.csi.volume import Keys
from chromafs_fuse.errors import UsageError

log = logging.getLogger("chromafs.csi")
WORKERS = 16


def socket_path(endpoint: str) -> str:
    """unix:///csi/csi.sock (or unix:/csi/csi.sock, or a plain path) -> /csi/csi.sock."""
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint.removeprefix("unix:")
    if not path.startswith("/"):
        raise UsageError(f"--endpoint {endpoint}: give a unix socket, e.g. unix:///csi/csi.sock")
    return path


def serve(endpoint: str, mountd: str, node_id: str, keys: Keys, pods: PodSignIn | None = None) -> int:
    """Answer CSI calls until SIGTERM or SIGINT; 0."""
    path = socket_path(endpoint)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous plugin's socket
    except OSError as exc:
        raise UsageError(f"cannot listen on {path}: {exc.strerror}") from exc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="csi"))
    rpc.add_IdentityServicer_to_server(Identity(mountd), server)
    rpc.add_NodeServicer_to_server(Node(mountd, node_id, keys, pods), server)
    try:
        bound = server.add_insecure_port(f"unix://{path}")
    except RuntimeError:  # newer grpcio raises where older ones answer 0
        bound = 0
    if bound == 0:
        raise UsageError(f"cannot listen on {path}: check that its directory is writable")
    os.chmod(path, 0o600)
    stopping = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.start()
    log.info("listening on %s; node %s; mount server %s", path, node_id, mountd)
    if pods is not None:
        log.info("pods sign in with service-account tokens for audience %s of %s (readers: %s)",
                 pods.keys.audience, pods.keys.issuer, pods.keys.readers)  # fmt: skip
    stopping.wait()
    server.stop(grace=5).wait(10)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("stopped")
    return 0
