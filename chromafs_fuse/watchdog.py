"""Aborts a mount's FUSE connection when its daemon dies without unmounting (SIGKILL, a crash).

Normally the kernel ends a connection when the daemon's last file descriptor to it closes.
A thread that stores pages in the kernel's cache (kernel_push) can wait inside the kernel, for
a read that only the daemon's main thread answers; if the process is killed at that moment,
the waiting thread can never finish, the descriptor never closes, and the process and the
mount hang for good. This watchdog is a forked copy of the daemon that does nothing but wait:
the kernel signals it when the daemon's main thread exits (PR_SET_PDEATHSIG, which follows
the thread, not the process), and it then aborts the connection through fusectl (as
`echo 1 > /sys/fs/fuse/connections/N/abort` would), which fails the pending read and lets
the process die. A daemon that unmounts normally kills its watchdog first.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal

FUSECTL = "/sys/fs/fuse/connections"
PR_SET_PDEATHSIG = 1
DEATH_SIGNAL = signal.SIGUSR2
# Sent to the whole group by a service manager: the daemon unmounts and then kills the watchdog.
_IGNORED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _escaped(path: str) -> str:
    """A path as /proc/self/mountinfo writes it."""
    for char, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        path = path.replace(char, code)
    return path


def connection_of(mountpoint: str, mountinfo: str = "/proc/self/mountinfo") -> int | None:
    """The fusectl connection number of the FUSE mount at `mountpoint` (its device minor), read
    from mountinfo: asking the mount itself could hang on a daemon that no longer answers."""
    wanted = _escaped(os.path.abspath(mountpoint))
    found = None
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == wanted and fields[2].startswith("0:"):
                    found = int(fields[2].partition(":")[2])  # the last mount there is the visible one
    except (OSError, ValueError):
        return None
    return found


def abort_connection(connection: int) -> bool:
    """Abort a FUSE connection; mounts fusectl first if it is not mounted (needs root)."""
    if not os.path.exists(os.path.join(FUSECTL, str(connection))):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(b"fusectl", FUSECTL.encode(), b"fusectl", 0, None)
    try:
        with open(os.path.join(FUSECTL, str(connection), "abort"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def start_watchdog(mountpoint: str) -> int | None:
    """Fork the watchdog for the mount at `mountpoint`; returns its pid (None if the mount's
    connection cannot be found). Call from the thread that runs the FUSE loop."""
    connection = connection_of(mountpoint)
    if connection is None:
        return None
    daemon = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: touch as little as possible, never return into the daemon's code
        gc.disable()
        # Above all the FUSE descriptor: holding it would keep the connection alive.
        os.closerange(3, max(int(os.sysconf("SC_OPEN_MAX")), 3))
        signal.pthread_sigmask(signal.SIG_BLOCK, {DEATH_SIGNAL, *_IGNORED_SIGNALS})
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL)
        if os.getppid() == daemon:
            signal.sigwait({DEATH_SIGNAL})
        if connection_of(mountpoint) == connection:  # still mounted: the daemon died without unmounting
            abort_connection(connection)
    finally:
        os._exit(0)


def stop_watchdog(pid: int | None) -> None:
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
