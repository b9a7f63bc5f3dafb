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


# the new mount API (Linux 5.2; MOVE_MOUNT_BENEATH 6.5): one syscall table on x86_64 and arm64 for these
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_BENEATH = 0x200
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def replace_bind(source: str, target: str) -> None:
    """Put a read-only bind of `source` in place of the mount at `target` with no moment where
    `target` is a plain directory: the new bind goes beneath the old one (MOVE_MOUNT_BENEATH),
    then the old one is detached. A reader sees the old mount or the new one, never the empty
    directory under them. ENOENT when nothing is mounted at `target` any more (its user
    unmounted it): nothing is bound then. Kernels before 6.5: detach, then bind."""
    if device_at(target) is None:
        raise OSError(errno.ENOENT, f"{target}: nothing is mounted there any more")
    fd = _check(_libc.syscall(_SYS_OPEN_TREE, -100, os.fsencode(source), OPEN_TREE_CLONE | os.O_CLOEXEC), "open_tree")
    try:
        attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
        _check(
            _libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
            "mount_setattr",
        )
        flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_BENEATH
        if _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", -100, os.fsencode(target), flags) < 0:
            code = ctypes.get_errno()
            if code not in (errno.ENOSYS, errno.EINVAL) or device_at(target) is None:
                raise OSError(code, f"move_mount {target}: {os.strerror(code)}")
            if not detach(target):  # no MOVE_MOUNT_BENEATH here: a short gap
                raise OSError(errno.ENOENT, f"{target}: nothing is mounted there any more")
            bind_read_only(source, target)
            return
    finally:
        os.close(fd)
    detach(target)  # the old mount, on top: the new one is revealed


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
    from anything else mounted at its path. The whole table: tens of milliseconds at ten
    thousand mounts (`device_at` asks about one path)."""
    devices: dict[str, str] = {}
    with open(table, "rb") as f:
        data = f.read()
    for line in data.split(b"\n"):
        fields = line.split(b" ", 5)
        if len(fields) >= 5:
            point = fields[4]
            devices[unescape(point) if b"\\" in point else os.fsdecode(point)] = os.fsdecode(fields[2])
    return devices


# statx(2): whether a path is the root of a mount, and that mount's device, from the kernel's own
# records: no mount table read, and no question to a FUSE daemon (AT_STATX_DONT_SYNC: a dead
# or hung one never blocks it)
_SYS_STATX = {"x86_64": 332, "aarch64": 291}.get(os.uname().machine)
AT_SYMLINK_NOFOLLOW, AT_NO_AUTOMOUNT, AT_STATX_DONT_SYNC = 0x100, 0x800, 0x4000
STATX_TYPE = 0x1
STATX_ATTR_MOUNT_ROOT = 0x2000


class _Statx(ctypes.Structure):
    _fields_ = [
        ("mask", ctypes.c_uint32),
        ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64),
        ("head", ctypes.c_uint8 * 40),  # nlink .. blocks
        ("attributes_mask", ctypes.c_uint64),
        ("times", ctypes.c_uint8 * 64),
        ("rdev_major", ctypes.c_uint32),
        ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32),
        ("dev_minor", ctypes.c_uint32),
        ("tail", ctypes.c_uint8 * 112),
    ]


def device_at(path: str) -> str | None:
    """The device (`major:minor`) of the mount whose root `path` is (the topmost, as
    `mounted_devices` has it), None when `path` is not a mount's root or does not exist. Read
    from the kernel for this one path; the mount table when statx cannot tell."""
    if _SYS_STATX is not None:
        found = _Statx()
        flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC
        if _libc.syscall(_SYS_STATX, -100, os.fsencode(path), flags, STATX_TYPE, ctypes.byref(found)) == 0:
            if found.attributes_mask & STATX_ATTR_MOUNT_ROOT:
                if not found.attributes & STATX_ATTR_MOUNT_ROOT:
                    return None
                return f"{found.dev_major}:{found.dev_minor}"
        elif ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR):
            return None
    return mounted_devices().get(path)
