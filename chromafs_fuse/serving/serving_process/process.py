"""A serving process (issue 30): ONE FUSE mount at `<class root>/serving` serving every
reader class of every site the mount server hands it, each a directory `<site>/<view>`, and each
session of a class a directory `.sessions/<slot>` of its own (its owner, its expiry: sessions.py)
that the session binds read-only. With `--serving-processes N` the sites are spread over N such
processes, the i-th (from 0) at `serving-<i>` for i > 0.

It is told what to serve over `<class root>/serving.sock` (mode 0600; root or its own user only),
in serving/protocol.py's lines (CONTROL_REQUESTS): AddView (answered with the view's path in the
mount), RemoveView (`site_gone`: its site's last view), OpenViewSession (the directory
`.sessions/<slot>` a session binds), RenewViewSession (a later expiry), EndViewSession, Describe;
a refusal keeps its kind.
A session is refused from its expiry on by this process itself (sessions.py), whatever the mount
server does.
It outlives the mount server that started it (a restarted one reconnects through the socket) and
ends by itself once no session's bind of it has stood for its idle time. No page is pushed into
the kernel here: the kernel keeps what it read once (no-open mode, or keep_cache with a stock
pyfuse3) for every view of the site, and a new view is warmed by reading it (serving/warm_up.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import time
from typing import Any

import pyfuse3
import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import ChromafsError, unexpected
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.serving.failures import report_failure
from chromafs_fuse.serving.fuse_adapter import FuseAdapter, entry_attributes, pyfuse3_passes_inode
from chromafs_fuse.serving.handshake import tell_ready
from chromafs_fuse.serving.lifetime import end_when_unused, fuse_mounted, watch_signals
from chromafs_fuse.serving.process import limit_malloc_arenas
from chromafs_fuse.serving.protocol import (
    CONTROL_REQUESTS,
    AddView,
    BadRequest,
    Describe,
    EndViewSession,
    OpenViewSession,
    RemoveView,
    RenewViewSession,
    decode,
    error_answer,
)
from chromafs_fuse.serving.serving_process.sites import ServedSites
from chromafs_fuse.serving.status import StatusFile, keep_written, uptime_since
from chromafs_fuse.serving_filesystem import ServingFilesystem

log = logging.getLogger("chromafs.serving")
MOUNT_NAME = "serving"
SOCKET_NAME = "serving.sock"
MAX_LINE_BYTES = 256 * 1024
MOUNT_OPTIONS = {"fsname=chromafs:serving", "subtype=chromafs", "ro", "noatime", "allow_other"}


def member_paths(class_root: str, index: int = 0) -> tuple[str, str]:
    """(the `index`-th serving mount's mountpoint, its control socket) in the mount server's class root."""
    name = MOUNT_NAME if index == 0 else f"{MOUNT_NAME}-{index}"
    return os.path.join(class_root, name), os.path.join(class_root, f"{name}.sock")


def peer_uid(sock: Any) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class ServingProcess:
    def __init__(self, class_root: str, cache_bytes: int, idle_exit_s: float, index: int = 0) -> None:
        self.mountpoint, self.socket_path = member_paths(class_root, index)
        self.idle_exit_s = idle_exit_s
        self.fs = ServingFilesystem(entry_attributes, time.time_ns(), no_open=pyfuse3_passes_inode())
        self.adapter = FuseAdapter(self.fs)
        self.cache = PageCache(cache_bytes)
        self.sites = ServedSites(self.fs, self.cache, self.mountpoint)
        self.started = time.time()
        self.status = StatusFile(self.describe)

    def run(self, ready_fd: int | None) -> None:
        """Mount, serve until unmounted, signalled or unused, unmount."""
        os.makedirs(self.mountpoint, mode=0o755, exist_ok=True)
        # this process reads its own mount (warm-ups, sessions listed ahead): killed while such a
        # read waits in the kernel, it could never close its FUSE descriptor without the watchdog
        options = set(pyfuse3.default_options) | MOUNT_OPTIONS
        try:
            with fuse_mounted(
                self.adapter, self.mountpoint, options, "a kill while it reads its own mount can hang it"
            ):
                trio.run(self._serve, ready_fd)
        finally:
            self.status.remove()
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)

    async def _serve(self, ready_fd: int | None) -> None:
        listener = await self._listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.sites.run)
            nursery.start_soon(trio.serve_listeners, self._answer_connection, [listener])
            nursery.start_soon(watch_signals)
            if self.idle_exit_s > 0:
                nursery.start_soon(end_when_unused, self.mountpoint, self.idle_exit_s)
            nursery.start_soon(self._announce_ready, ready_fd)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    async def _listen(self) -> trio.SocketListener:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)  # 0600 from the start: no moment where others may connect
        try:
            await sock.bind(self.socket_path)
        finally:
            os.umask(old_mask)
        sock.listen(64)
        return trio.SocketListener(sock)

    async def _announce_ready(self, ready_fd: int | None) -> None:
        await trio.to_thread.run_sync(os.listdir, self.mountpoint)
        log.info("mounted on %s, told on %s", self.mountpoint, self.socket_path)
        tell_ready(ready_fd)
        await trio.to_thread.run_sync(self.status.write_described, self.status.described())
        await keep_written(self.status)

    # -- the control socket ----------------------------------------------------------------

    async def _answer_connection(self, stream: trio.SocketStream) -> None:
        """A connection's requests, a line each. A client that hangs up before its answer (a
        mount server's request timed out, a probe) ends its connection, never the process: an
        error out of this task would end the nursery and every session this process serves."""
        try:
            async with stream:
                await self._answer_lines(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("a control connection ended before its answer: %s", exc)
        except Exception:  # a bug in one connection: logged with its traceback; the process serves on
            log.exception("a control connection failed")

    async def _answer_lines(self, stream: trio.SocketStream) -> None:
        uid = peer_uid(stream.socket)
        if uid not in (0, os.getuid()):
            log.warning("refused a control connection from uid %d", uid)
            return
        buffer = b""
        while len(buffer) <= MAX_LINE_BYTES:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                reply = await self._answer(line)
                await stream.send_all(json.dumps(reply).encode() + b"\n")

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = decode(line, CONTROL_REQUESTS)
            if isinstance(request, AddView):
                reader = Principal(request.authenticated, frozenset(request.groups))
                path = await self.sites.add(MountConfig.from_dict(request.config), reader.reader_class())
                return {"ok": True, "path": path}
            if isinstance(request, RemoveView):
                removed = self.sites.remove(request.path)
                site_gone = not self.sites.serves(request.path.split("/", 1)[0])
                return {"ok": True, "removed": removed, "site_gone": site_gone}
            if isinstance(request, OpenViewSession):
                path = await self.sites.open_session(
                    request.path, request.uid, request.gid, request.expires_at, request.allow_other
                )
                return {"ok": True, "path": path}
            if isinstance(request, RenewViewSession):
                return {"ok": True, "renewed": self.sites.renew_session(request.path, request.expires_at)}
            if isinstance(request, EndViewSession):
                return {"ok": True, "ended": await self.sites.end_session(request.path)}
            assert isinstance(request, Describe)
            return {"ok": True, **self.describe()}
        except ChromafsError as exc:  # the answer (a backend down, a bad token, a corrupt tree): no traceback
            log.log(exc.level, "control request refused: %s", exc.message)
            return error_answer(exc)
        except (KeyError, TypeError, ValueError) as exc:
            return error_answer(BadRequest(f"bad request: {exc}"))
        except Exception as exc:  # a bug: logged with its traceback, worded for the mount server
            log.exception("control request failed")
            return error_answer(exc)

    def describe(self) -> dict[str, Any]:
        cache = self.cache
        return {
            "pid": os.getpid(),
            "site": "(serving)",
            "mountpoint": self.mountpoint,
            "reader": f"{len(self.fs.namespace.views())} views",
            "started": self.started,
            "uptime_s": uptime_since(self.started),
            "sites": len(self.sites.sites),
            "views_warmed": self.sites.warmer.warmed_views,
            "kernel_open": "skipped" if self.fs.no_open else "per open",
            "requests": dict(self.adapter.requests),
            "pages_cached": len(cache),
            "cached_bytes": cache.current_bytes,
            "views": self.sites.describe(self.mountpoint),
        }


def run_serving_process(
    class_root: str,
    cache_bytes: int,
    idle_exit_s: float,
    ready_fd: int | None,
    log_file: str | None = None,
    log_level: str = "info",
    index: int = 0,
) -> int:
    """Serve the `index`-th serving mount of `class_root`; the exit status."""
    limit_malloc_arenas()
    setup_logging(log_level, log_file, background=ready_fd is not None)
    try:
        ServingProcess(class_root, cache_bytes, idle_exit_s, index).run(ready_fd)
    except RuntimeError as exc:  # pyfuse3.init: permissions, no /dev/fuse
        return report_failure(ready_fd, f"mounting the serving mount in {class_root} failed: {exc}")
    except Exception as exc:  # a bug: its traceback in the log, one line to whoever waits
        log.exception("the serving mount failed")
        return report_failure(ready_fd, f"the serving process failed: {unexpected(exc)}")
    return 0
