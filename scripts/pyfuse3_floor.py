#!/usr/bin/env python3
"""The floor of a pyfuse3 filesystem's open/close cost, next to chromafs and tmpfs.

    .venv/bin/python scripts/pyfuse3_floor.py MOUNTED_CHROMAFS_DIR

Mounts a minimal pyfuse3 filesystem (the smallest correct read-only one: a flat
directory of files held in memory, keep_cache on) with the same file count and
sizes as the given chromafs mount, copies the same files to /dev/shm, and times
open+read+close of every file (best of 5) on all three. Shows how much of the
per-file cost on chromafs is pyfuse3's own request path (every open and release
is a round trip to the Python daemon; pyfuse3's read gets no inode, so FUSE's
no-open mode cannot be used).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # re-run with the repository's .venv Python before importing from it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from repo_venv import use_repo_venv

    use_repo_venv()

import pyfuse3
import trio


class FlatFS(pyfuse3.Operations):
    def __init__(self, contents: list[bytes]) -> None:
        super().__init__()
        self.contents = contents
        self.names = {f"f{i}".encode(): i + 2 for i in range(len(contents))}

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = a.attr_timeout = 3600
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_size = stat.S_IFDIR | 0o555, 0
        else:
            a.st_mode, a.st_size = stat.S_IFREG | 0o444, len(self.contents[inode - 2])
        return a

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def lookup(self, parent: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        inode = self.names.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start: int, token: pyfuse3.ReaddirToken) -> None:
        items = sorted(self.names.items())
        for i in range(start, len(items)):
            if not pyfuse3.readdir_reply(token, items[i][0], self._attr(items[i][1]), i + 1):
                return

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self.contents[fh - 2][off : off + size]

    async def release(self, fh: int) -> None:
        return None


def time_open_read_close(paths: list[str]) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            while os.read(fd, 1 << 20):
                pass
            os.close(fd)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / len(paths)


def serve(source_dir: str, mountpoint: str) -> int:
    """Child process: serve copies of the files in source_dir until unmounted."""
    names = sorted(os.listdir(source_dir), key=lambda n: int(n[1:]))
    contents = [Path(source_dir, n).read_bytes() for n in names]
    pyfuse3.init(FlatFS(contents), mountpoint, {"fsname=floor", "ro", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        asked = sys.argv[1:] in (["-h"], ["--help"])
        print(f"usage: {sys.argv[0]} MOUNTED_CHROMAFS_DIR\n\n{__doc__}", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    chromafs_root = Path(sys.argv[1])
    files = [str(p) for p in chromafs_root.rglob("*") if p.is_file()]
    work = Path(tempfile.mkdtemp(prefix="pyfuse3-floor-"))
    shm = Path(tempfile.mkdtemp(prefix="pyfuse3-floor-", dir="/dev/shm"))
    mnt = work / "mnt"
    mnt.mkdir()
    for i, path in enumerate(files):
        (shm / f"f{i}").write_bytes(Path(path).read_bytes())
    # A separate process, like a real daemon: in-process it would fight the timing loop for the GIL.
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(shm), str(mnt)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the minimal filesystem did not mount")
            time.sleep(0.05)
        floor_paths = [str(mnt / f"f{i}") for i in range(len(files))]
        shm_paths = [str(shm / f"f{i}") for i in range(len(files))]
        results = {
            "tmpfs": time_open_read_close(shm_paths),
            "minimal pyfuse3": time_open_read_close(floor_paths),
            "chromafs": time_open_read_close(files),
        }
        print(f"{len(files)} files, open+read+close per file (best of 5, warm):")
        for name, micros in results.items():
            print(f"  {name:16} {micros:8.1f} us   {micros / results['tmpfs']:5.1f}x tmpfs")
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        server.wait(10)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
