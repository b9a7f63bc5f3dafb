"""Read-only bind mounts of a class mount onto a session's mountpoint, through mount(2).

A bind shares the class mount's FUSE connection, inodes and kernel page cache: a session
costs one entry in the mount table, nothing in any process. Calls go straight to libc
(a bind is two syscalls; the `mount` program would cost a process per session).
"""

from __future__ import annotations

import ctypes
import errno
import os

from chromafs_fuse.serving.mounttable import unescape

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source and os.fsencode(source), os.fsencode(target), None, flags, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {target}: {os.strerror(code)}")


def bind_read_only(source: str, target: str) -> None:
    """Bind `source` on `target`, then make the bind read-only, nosuid and nodev (a bind takes
    its flags only from a remount)."""
    _mount(source, target, MS_BIND)
    try:
        _mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError:
        detach(target)
        raise


def detach(target: str) -> bool:
    """Unmount `target`; when it is busy (an open file, a working directory inside), detach it
    lazily: it leaves every path at once, and is gone when the last user lets go. False when
    nothing was mounted there."""
    for flags in (0, MNT_DETACH):
        if _libc.umount2(os.fsencode(target), flags) == 0:
            return True
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return False
        if code != errno.EBUSY:
            raise OSError(code, f"unmount {target}: {os.strerror(code)}")
    return True


def binds_of(mountpoint: str, table: str = "/proc/self/mountinfo") -> int | None:
    """How many other mounts share the device mounted at `mountpoint` (the binds of a class
    mount: its sessions); None when nothing is mounted there."""
    devices = mounted_devices(table)
    device = devices.get(mountpoint)
    if device is None:
        return None
    return sum(1 for path, other in devices.items() if other == device and path != mountpoint)


def mounted_devices(table: str = "/proc/self/mountinfo") -> dict[str, str]:
    """Mountpoint -> the device (`major:minor`) mounted there, topmost mount last wins. A bind
    of a class mount shows the class mount's device, which is how a session's bind is told
    from anything else mounted at its path."""
    devices: dict[str, str] = {}
    with open(table, "rb") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5:
                devices[unescape(fields[4])] = os.fsdecode(fields[2])
    return devices
