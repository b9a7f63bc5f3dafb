"""Aborts a mount's FUSE connection when its daemon dies without unmounting (SIGKILL, a crash).

Normally the kernel ends a connection when the daemon's last file descriptor to it closes.
A thread that stores pages in the kernel's cache (kernel_push) can wait inside the kernel, for
a read that only the daemon's main thread answers; if the process is killed at that moment,
the waiting thread can never finish, the descriptor never closes, and the process and the
mount hang for good. The watchdog is a small shell (started through util-linux `setpriv
--pdeathsig`) that holds no descriptor of the FUSE device and waits: the kernel signals it
when the daemon's main thread exits (PR_SET_PDEATHSIG follows the thread that started it, not
the process), and if the mount is still there it aborts the connection through fusectl (as
`echo 1 > /sys/fs/fuse/connections/N/abort` would), which fails the pending read and lets the
process die. A daemon that unmounts normally stops its watchdog first. The shell's own `sleep`
dies with the shell whatever ends it (a TERM before the shell knows the sleep's pid, a SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from chromafs_fuse.serving.mounttable import escape

log = logging.getLogger(__name__)
FUSECTL = "/sys/fs/fuse/connections"  # mounted by the watchdog if needed (root only)

# The watchdog itself, a POSIX shell script (linted by shellcheck in scripts/test).
WATCHDOG_SCRIPT = (Path(__file__).parent / "watchdog.sh").read_text()


def connection_of(mountpoint: str, mountinfo: str = "/proc/self/mountinfo") -> int | None:
    """The fusectl connection number of the FUSE mount at `mountpoint` (its device minor), read
    from mountinfo: asking the mount itself could hang on a daemon that no longer answers."""
    wanted = escape(os.path.abspath(mountpoint))
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


def start_watchdog(mountpoint: str, without: str) -> subprocess.Popen[bytes] | None:
    """Start the watchdog for the mount at `mountpoint`; None if it could not abort the
    connection (no setpriv, or fusectl neither mounted nor mountable by this user). Call it
    from the thread that runs the FUSE loop: the watchdog is signalled when that thread exits.
    `without` says in the log what the mount does when there is none."""
    connection = connection_of(mountpoint)
    setpriv = shutil.which("setpriv")
    fusectl_usable = os.path.isdir(os.path.join(FUSECTL, str(connection))) or os.geteuid() == 0
    if connection is None or setpriv is None or not fusectl_usable:
        why = "mount not found" if connection is None else "no setpriv" if setpriv is None else "no fusectl"
        log.warning("no watchdog for %s (%s): %s", mountpoint, why, without)
        return None
    argv = [setpriv, "--pdeathsig", "USR2", "sh", "-c", WATCHDOG_SCRIPT, "chromafs-watchdog"]
    argv += [str(os.getpid()), str(connection), escape(os.path.abspath(mountpoint)), FUSECTL]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_watchdog(watchdog: subprocess.Popen[bytes] | None) -> None:
    if watchdog is None:
        return
    watchdog.terminate()
    try:
        watchdog.wait(timeout=2)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            watchdog.kill()
            watchdog.wait(timeout=2)
