"""The CSI Identity and Node services: each call checked (csi/volume.py), then one question to the
node's mount server (csi/mountd.py) or one unmount. No state of its own: what is published is
read from the mount table and the mount server's session status, so a restarted plugin carries on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from chromafs_fuse import __version__
from chromafs_fuse.csi.mountd import MountdUnreachable, answers, open_session
from chromafs_fuse.csi.stubs import pb, rpc
from chromafs_fuse.csi.volume import (
    Keys,
    Publish,
    PublishRequest,
    VolumeError,
    check_target,
    prepare,
    session_class,
)
from chromafs_fuse.errors import ChromafsError, unexpected, user_message
from chromafs_fuse.serving.binds import detach, mounted_devices
from chromafs_fuse.serving.mounttable import mounts
from chromafs_fuse.serving.protocol import OpenPodSession, OpenSession, RenewSession, reader_fields

if TYPE_CHECKING:
    from chromafs_fuse.csi.pod_identity import PodSignIn

DRIVER_NAME = "csi.chromafs.dev"
MAX_STACKED = 16  # unmounts tried on one target before giving up
TARGET_LOCKS = 64
log = logging.getLogger("chromafs.csi")


# The error hierarchy's kinds as gRPC status codes (a VolumeError names its own).
STATUS_OF_KIND = {
    "usage": grpc.StatusCode.INVALID_ARGUMENT,
    "denied": grpc.StatusCode.UNAUTHENTICATED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "corrupt": grpc.StatusCode.INTERNAL,
    "refused": grpc.StatusCode.FAILED_PRECONDITION,
}


def abort_with(context: grpc.ServicerContext, exc: Exception, what: str) -> None:
    """Answer kubelet for `exc`, the one place a failure becomes a gRPC status: a ChromafsError
    by its kind (logged at its level), anything else INTERNAL (a bug: its traceback logged)."""
    if isinstance(exc, VolumeError):
        status = getattr(grpc.StatusCode, exc.code)
    elif isinstance(exc, ChromafsError):
        status = STATUS_OF_KIND.get(exc.kind, grpc.StatusCode.INTERNAL)
    else:
        log.exception("%s failed", what)
        context.abort(grpc.StatusCode.INTERNAL, unexpected(exc))
    log.log(exc.level if isinstance(exc, ChromafsError) else logging.ERROR, "%s refused: %s", what, exc)
    context.abort(status, user_message(exc))


class Identity(rpc.IdentityServicer):  # type: ignore[name-defined]  # generated at build time: mypy sees a module object
    def __init__(self, mountd: str) -> None:
        self.mountd = mountd

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.GetPluginCapabilitiesResponse()  # a node plugin only: no controller service

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ProbeResponse(ready={"value": answers(self.mountd)})


class Node(rpc.NodeServicer):  # type: ignore[name-defined]  # generated at build time: mypy sees a module object
    def __init__(self, mountd: str, node_id: str, keys: Keys, pods: PodSignIn | None = None) -> None:
        self.mountd = mountd
        self.node_id = node_id
        self.keys = keys
        self.pods = pods
        self._locks = [threading.Lock() for _ in range(TARGET_LOCKS)]

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.NodeGetInfoResponse(node_id=self.node_id)

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.NodeGetCapabilitiesResponse()  # no staging, no stats: a publish is the whole volume

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        capability = request.volume_capability if request.HasField("volume_capability") else None
        asked = PublishRequest(
            volume_id=request.volume_id,
            target_path=os.path.normpath(request.target_path) if request.target_path else "",
            readonly=request.readonly,
            access_mode=capability.access_mode.mode if capability is not None else None,
            block=capability is not None and capability.HasField("block"),
            attributes=dict(request.volume_context),
            token=request.secrets.get("token"),
        )
        try:
            with self._target(asked.target_path):
                self._publish(asked, context.time_remaining())
        except Exception as exc:  # every failure answers kubelet: mapped by abort_with
            abort_with(context, exc, f"publish {asked.volume_id} on {asked.target_path}")
        log.info(
            "published %s on %s (%.1f ms)", asked.volume_id, asked.target_path, (time.perf_counter() - started) * 1000
        )
        return pb.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        target = os.path.normpath(request.target_path) if request.target_path else ""
        try:
            check_target(request.volume_id, target)
            with self._target(target):
                _unmount_and_remove(target)
        except Exception as exc:  # every failure answers kubelet: mapped by abort_with
            abort_with(context, exc, f"unpublish {request.volume_id} from {target}")
        log.info("unpublished %s from %s", request.volume_id, target)
        return pb.NodeUnpublishVolumeResponse()

    # -- helpers ---------------------------------------------------------------------------

    def _publish(self, asked: PublishRequest, remaining_s: float | None) -> None:
        publish = prepare(asked, self.keys, self.pods)
        target = asked.target_path
        wait_s = publish.backend_timeout_s * 3 + 60
        if remaining_s is not None:
            wait_s = max(0.1, min(wait_s, remaining_s - 0.5))
        if _mounted(target):
            held = session_class(target)
            if held == publish.class_key and publish.principal.expires_at is not None:
                # the same volume again (kubelet's republish, requiresRepublish): the session lasts
                # until this token's expiry, nothing stacked, the pod's mount untouched
                self._renew(target, publish, wait_s)
                return
            if held == publish.class_key or (held is None and _fstype(target) == "fuse.chromafs"):
                return  # the same volume again: nothing to do, nothing stacked
            raise VolumeError("ALREADY_EXISTS", f"{target} already holds another volume: unpublish it first")
        created = not os.path.isdir(target)
        try:
            os.makedirs(target, mode=0o755, exist_ok=True)
        except OSError as exc:
            raise VolumeError("INTERNAL", f"cannot make the target {target}: {exc.strerror}") from exc
        request: OpenSession | OpenPodSession = (
            OpenPodSession(target, publish.options, reader_fields(publish.principal))
            if publish.pod
            else OpenSession(target, publish.options, publish.token)
        )
        try:  # the server's refusal keeps its kind (abort_with): only what may pass is UNAVAILABLE
            open_session(self.mountd, request, wait_s)
        except MountdUnreachable as exc:
            _undo(target, created)
            raise VolumeError("UNAVAILABLE", str(exc)) from exc
        except BaseException:
            _undo(target, created)
            raise

    def _renew(self, target: str, publish: Publish, wait_s: float) -> None:
        try:
            open_session(self.mountd, RenewSession(target, publish.options, reader_fields(publish.principal)), wait_s)
        except MountdUnreachable as exc:
            raise VolumeError("UNAVAILABLE", str(exc)) from exc

    @contextlib.contextmanager
    def _target(self, target: str) -> Iterator[None]:
        """One call at a time per target path (kubelet may retry while a call runs); a fixed set
        of locks, so that the plugin holds nothing per pod it ever served."""
        with self._locks[hash(target) % TARGET_LOCKS]:
            yield


def _mounted(target: str) -> bool:
    return target in mounted_devices()


def _fstype(target: str) -> str:
    return next((entry.fstype for entry in reversed(mounts()) if entry.target == target), "")


def _undo(target: str, created: bool) -> None:
    """After a refused publish: nothing mounted at the target, and no directory this call made."""
    with contextlib.suppress(OSError):
        while _mounted(target) and detach(target):
            pass
        if created:
            os.rmdir(target)


def _unmount_and_remove(target: str) -> None:
    for _ in range(MAX_STACKED):
        if not _mounted(target):
            break
        try:
            detach(target)
        except OSError as exc:
            raise VolumeError("INTERNAL", f"cannot unmount {target}: {exc.strerror}") from exc
    else:
        raise VolumeError("INTERNAL", f"{target} still has mounts after {MAX_STACKED} unmounts")
    try:
        os.rmdir(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise VolumeError("INTERNAL", f"cannot remove the target {target}: {exc.strerror}") from exc
