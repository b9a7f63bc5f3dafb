"""What `SessionKeeper` does to the host, for real: the mount table and binds through mount(2)
(serving/binds.py), process start times from /proc, the session status files `chromafs status`
reads, and heals on threads of their own. The keeper (session_keeper.py) only calls these
through its `Kernel`, `StatusBoard` and `RunHeal` interfaces: tests/unit's simulation gives it
a simulated host instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Container
from typing import Any

from chromafs_fuse.serving import binds
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.status import runtime_dir, session_status_path, write_private_json

log = logging.getLogger("chromafs.mountd")


class HostKernel:
    """This host's kernel: its mount table, binds and processes."""

    def private_directory(self, path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # class views are reached through session binds only

    def mounted_devices(self) -> dict[str, str]:
        return binds.mounted_devices()

    def device_at(self, path: str) -> str | None:
        return binds.device_at(path)

    def process_start(self, pid: int) -> int | None:
        return process_start(pid)

    def bind_read_only(self, source: str, target: str) -> None:
        binds.bind_read_only(source, target)

    def replace_bind(self, source: str, target: str) -> None:
        binds.replace_bind(source, target)

    def detach(self, target: str) -> bool:
        return binds.detach(target)


HOST_KERNEL = HostKernel()


class StatusFiles:
    """A status file per session in the runtime directory (serving/status.py), for `chromafs status`."""

    def write(self, mountpoint: str, status: dict[str, Any]) -> None:
        path = session_status_path(mountpoint)
        if path:
            with contextlib.suppress(OSError):
                write_private_json(path, status)

    def remove(self, mountpoint: str) -> None:
        path = session_status_path(mountpoint)
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def remove_stale(self, root: str, live: Container[str]) -> None:
        """Status files of sessions of the class root `root` not in `live` (left by a server that
        stopped or crashed before their sessions ended): `chromafs status` must not list them.
        Other servers' files are theirs."""
        directory = runtime_dir()
        if not directory:
            return
        ours = os.path.join(root, "")
        for name in os.listdir(directory):
            if not (name.startswith("session-") and name.endswith(".json")):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path) as f:
                    status = json.load(f)
                class_path = str(status["session"]["class_mount"])
                mountpoint = str(status["mountpoint"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if class_path.startswith(ours) and mountpoint not in live:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    log.info("removed the status of a session that ended while no server ran: %s", mountpoint)


def heal_in_thread(name: str, heal: Callable[[], None]) -> None:
    """A heal on a thread of its own: it may wait seconds for a serving process."""
    threading.Thread(target=heal, name=name, daemon=True).start()
