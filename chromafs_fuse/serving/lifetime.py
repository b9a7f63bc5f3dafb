"""A FUSE mount's life in its process, for a standalone mount and a serving process alike:
`fuse_mounted` (mounted, its watchdog, unmounted), and what ends it besides `fusermount -u`: a
signal, its token's expiry or revocation, or (with --idle-exit) no session binding it any more, each a task of
the mount's loop."""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pyfuse3
import trio

from chromafs_fuse.serving.binds import binds_of
from chromafs_fuse.serving.process import sd_notify
from chromafs_fuse.serving.status import utc_text
from chromafs_fuse.serving.watchdog import start_watchdog, stop_watchdog

log = logging.getLogger("chromafs.mount")
IDLE_CHECK_S = 5.0  # how often a mount with --idle-exit looks for binds of it
REVOCATION_POLL_S = 0.5  # how often a mount with Redis looks for a revocation of its token (chromafs revoke)


@contextlib.contextmanager
def fuse_mounted(
    adapter: Any, mountpoint: str, options: set[str], without_watchdog: str | None
) -> Iterator[subprocess.Popen[bytes] | None]:
    """Mount `adapter` at `mountpoint` (pyfuse3.init raises RuntimeError if it cannot), with a
    watchdog unless `without_watchdog` is None (else it says what the mount does without one,
    should it fail to start); the body serves (trio.run of pyfuse3.main). Unmounted at its end."""
    pyfuse3.init(adapter, mountpoint, options)
    watchdog = start_watchdog(mountpoint, without_watchdog) if without_watchdog is not None else None
    # Everything built so far (imported modules, the trees, the inode tables) lives as long as the
    # mount: out of the collector's sight, so that collections triggered by per-request garbage
    # do not walk the whole heap on the request path.
    gc.collect()
    gc.freeze()
    try:
        yield watchdog
    finally:
        stop_watchdog(watchdog)
        pyfuse3.close(unmount=True)
        log.info("unmounted %s; requests served: %s", mountpoint, dict(adapter.requests))


def unmount_now() -> None:
    sd_notify("STOPPING=1")
    pyfuse3.terminate()


async def end_when_unused(mountpoint: str, idle_s: float) -> None:
    """A class mount: unmount once no session's bind of it has stood for `idle_s`, whether or
    not a mount server is there to stop it."""
    idle_since = time.monotonic()
    while True:
        await trio.sleep(min(idle_s / 4, IDLE_CHECK_S))
        binds = await trio.to_thread.run_sync(binds_of, mountpoint)
        if binds:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_s:
            log.info("no session for %.0fs: unmounting", time.monotonic() - idle_since)
            unmount_now()
            return


async def end_at_expiry(expires_at: float, refuse: Callable[[], Awaitable[None]] | None = None) -> None:
    """At the token's expiry: `refuse` (the mount stops answering and the kernel forgets what it
    cached, so that a process inside is refused too), then unmount."""
    await trio.sleep(max(0.0, expires_at - time.time()))
    log.warning("the token expired (exp %s): unmounting", utc_text(expires_at))
    if refuse is not None:
        await refuse()
    unmount_now()


async def end_at_revocation(
    revoked: Callable[[], str | None], refuse: Callable[[], Awaitable[None]], every_s: float = REVOCATION_POLL_S
) -> None:
    """Once `revoked` (blocking: a read of the site's Redis, run in a worker thread) says what
    revoked the token: as at its expiry, `refuse`, then unmount."""
    while True:
        why = await trio.to_thread.run_sync(revoked)
        if why is not None:
            log.warning("the token was revoked (%s): unmounting", why)
            await refuse()
            unmount_now()
            return
        await trio.sleep(every_s)


async def watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal %s: unmounting", signal.Signals(signum).name)
            unmount_now()
            return
