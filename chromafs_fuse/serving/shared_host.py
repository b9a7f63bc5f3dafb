"""The mount server's side of the shared mount (`--class-mode shared`, issue 30): `SharedHost`
serves each class as a view of the one shared mount (serving/shared_mount.py), asked over its
control socket, and starts that process when none answers.

A class is alive while the shared process that added its view runs and its mount stands. The
process outlives the mount server: a restarted server finds it through the socket and carries on
with the views its state names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig
from chromafs_fuse.serving.binds import detach, mounted_devices
from chromafs_fuse.serving.class_mounts import HostSnapshot, SessionError
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.sessions import ClassMount
from chromafs_fuse.serving.shared_mount import shared_paths

log = logging.getLogger("chromafs.mountd")
CONTROL_TIMEOUT_S = 5.0  # a request that does not load a site answers in milliseconds

# starts the shared mount's process and waits until it serves; its pid (SessionError if it cannot)
StartShared = Callable[[], int]


class SharedControl:
    """The shared process's control socket, one connection per request (a few microseconds)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def ask(self, request: dict[str, Any], timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """The answer; OSError when nobody answers, ValueError when the answer is not one."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(self.path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the shared mount closed the connection")
                answer += chunk
        reply = json.loads(answer)
        if not isinstance(reply, dict):
            raise ValueError("malformed answer")
        return reply


class SharedHost:
    """Every class a view of the shared mount at `<root>/shared`."""

    def __init__(self, root: str, start_shared: StartShared) -> None:
        self.mountpoint, socket_path = shared_paths(root)
        self.control = SharedControl(socket_path)
        self.start_shared = start_shared
        self.pid: int | None = None
        self.pid_start: int | None = None

    def _serving(self, devices: dict[str, str]) -> bool:
        return self.pid is not None and process_start(self.pid) == self.pid_start and self.mountpoint in devices

    def _ensure_running(self) -> str:
        """The shared process's mount device, the process started first if none answers."""
        devices = mounted_devices()
        if not self._serving(devices):
            self.pid = None
            with contextlib.suppress(OSError, ValueError):
                pid = int(self.control.ask({"op": "describe"})["pid"])
                if self.mountpoint in devices:
                    self.pid, self.pid_start = pid, process_start(pid)
            if self.pid is None:
                if self.mountpoint in devices:
                    detach(self.mountpoint)  # left by a process that is gone
                started = time.perf_counter()
                self.pid = self.start_shared()
                self.pid_start = process_start(self.pid)
                took = time.perf_counter() - started
                log.info("shared mount %s (pid %d) ready in %.3fs", self.mountpoint, self.pid, took)
                devices = mounted_devices()
        device = devices.get(self.mountpoint)
        if device is None:
            raise SessionError("the shared mount is not mounted")
        return device

    def start(self, key: str, config: MountConfig, reader: Principal) -> ClassMount:
        device = self._ensure_running()
        request = {
            "op": "add",
            # as a class daemon: its pages read into the kernel once, in the background
            "config": dataclasses.replace(config, warm_kernel=True).to_dict(),
            "class": {"authenticated": reader.authenticated, "groups": sorted(reader.groups)},
        }
        try:
            reply = self.control.ask(request, config.session.backend_timeout_s * 3 + 60)
        except (OSError, ValueError) as exc:
            raise SessionError(f"the shared mount did not answer: {exc}") from exc
        if not reply.get("ok"):
            raise SessionError(str(reply.get("error") or "the shared mount refused the class"))
        assert self.pid is not None
        path = os.path.join(self.mountpoint, str(reply["path"]))
        return ClassMount(key, path, self.pid, self.pid_start, config.site, reader.describe(), device, time.time())

    def stop(self, mount: ClassMount) -> None:
        if process_start(mount.pid) != mount.pid_start:
            return  # that process is gone, and its views with it
        try:
            self.control.ask({"op": "remove", "path": os.path.relpath(mount.path, self.mountpoint)})
        except (OSError, ValueError) as exc:
            log.warning("removing the view %s: %s", mount.path, exc)

    def alive(self, mount: ClassMount, host: HostSnapshot) -> bool:
        return host.runs(mount.pid, mount.pid_start) and host.devices.get(self.mountpoint) == mount.device

    def drop(self, mount: ClassMount) -> None:
        """Nothing of a view outlives its process (its sessions' binds are detached already)."""

    def owns(self, path: str) -> bool:
        return path == self.mountpoint
