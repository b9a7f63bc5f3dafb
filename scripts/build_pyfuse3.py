#!/usr/bin/env python3
"""Build and install pyfuse3 with the inode passed to read/readdir in no-open mode, and a
batched notify_store.

pyfuse3 hands `read` and `readdir` only the file handle. When a filesystem
answers `open`/`opendir` with ENOSYS, the kernel (Linux >= 4.19 / 5.1) stops
sending open, flush and release altogether, keeps each file's pages cached
across opens and caches directory listings (FOPEN_KEEP_CACHE, FOPEN_CACHE_DIR)
- but every later read then carries file handle 0, and the filesystem cannot
tell which file it is for. This script downloads the pyfuse3 source release,
changes two lines of `handlers.pxi` so that a zero file handle is replaced by
the request's inode, adds `store_pages`, which stores many whole files in the
kernel's page cache with the GIL released once for all of them (pyfuse3's
`notify_store` takes and drops the GIL per page, and a thread that drops it
often waits behind the others to take it back), adds a marker module
(`pyfuse3.chromafs_inode_fallback`, with `BUILD`) by which chromafs detects the
build, and installs it into the running Python.

Without it chromafs still works, in open mode (one daemon round trip per open
and per release). Usage: .venv/bin/python scripts/build_pyfuse3.py [--check]
(--check: exit 0 if this build is already installed, 1 if not, without building).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PYFUSE3_VERSION = "3.5.0"
PYFUSE3_SDIST_SHA256 = "88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24"
LOCAL_LABEL = "chromafs2"
BUILD = 2  # scripts/setup rebuilds when the installed marker has an older BUILD
MARKER_MODULE = "chromafs_inode_fallback"
# (function, the line in it, what it becomes): a zero fh means the kernel skipped open.
EDITS = [
    ("cdef void fuse_read (", "    c.fh = fi.fh\n", "    c.fh = fi.fh if fi.fh else ino\n"),
    ("cdef void fuse_readdirplus (", "    c.fh = fi.fh\n", "    c.fh = fi.fh if fi.fh else ino\n"),
]

# Appended to pyfuse3's __init__.pyx.
STORE_PAGES = '''

def store_pages(list pages):
    """Store each (inode, data) in the kernel's page cache at offset 0 (data: the whole
    file), with the GIL released once for all. Returns 0 or -errno for each page."""
    cdef Py_ssize_t count = len(pages)
    cdef Py_ssize_t i
    cdef Py_ssize_t taken = 0
    cdef fuse_bufvec bufvec
    cdef Py_buffer *views = <Py_buffer *> stdlib.calloc(count + 1, sizeof(Py_buffer))
    cdef fuse_ino_t *inodes = <fuse_ino_t *> stdlib.calloc(count + 1, sizeof(fuse_ino_t))
    cdef int *results = <int *> stdlib.calloc(count + 1, sizeof(int))
    try:
        if views == NULL or inodes == NULL or results == NULL:
            raise MemoryError()
        for i in range(count):
            inode, data = pages[i]
            inodes[i] = inode
            PyObject_GetBuffer(data, &views[i], PyBUF_CONTIG_RO)
            taken += 1
        with nogil:
            for i in range(count):
                bufvec.count = 1
                bufvec.idx = 0
                bufvec.off = 0
                bufvec.buf[0].flags = 0
                bufvec.buf[0].mem = views[i].buf
                bufvec.buf[0].size = <size_t> views[i].len
                results[i] = fuse_lowlevel_notify_store(session, inodes[i], 0, &bufvec, 0)
        return [results[i] for i in range(count)]
    finally:
        for i in range(taken):
            PyBuffer_Release(&views[i])
        stdlib.free(views)
        stdlib.free(inodes)
        stdlib.free(results)
'''


def patch_handlers(handlers: Path) -> None:
    text = handlers.read_text()
    for function, old, new in EDITS:
        start = text.index(function)
        end = text.index("\nasync def", start)
        body = text[start:end]
        if body.count(old) != 1:
            raise SystemExit(f"build_pyfuse3: {function!r} in {handlers} is not as expected; refusing to patch")
        text = text[:start] + body.replace(old, new) + text[end:]
    handlers.write_text(text)


def extract(archive: Path, dest: Path) -> None:
    """Unpack the sdist, refusing members that would land outside dest or are not plain files and
    folders (tarfile's "data" filter does this, but Debian 12's Python 3.11.2 predates it)."""
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not (member.isfile() or member.isdir()) or root not in (target, *target.parents):
                raise SystemExit(f"build_pyfuse3: refusing archive member {member.name!r}")
        tar.extractall(dest)


def installed_build() -> int:
    """The BUILD of the installed patched pyfuse3; 0 for none (stock or missing)."""
    try:
        marker = importlib.import_module(f"pyfuse3.{MARKER_MODULE}")
    except ImportError:
        return 0
    return int(getattr(marker, "BUILD", 1))


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        return 0 if installed_build() >= BUILD else 1
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="pyfuse3-build-") as tmp:
        work = Path(tmp)
        # Only pyfuse3 comes as source; its build dependencies (Cython, setuptools) as wheels.
        subprocess.run(
            [python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", "pyfuse3", "-d", str(work), f"pyfuse3=={PYFUSE3_VERSION}"],
            check=True,
        )  # fmt: skip
        (archive,) = work.glob("pyfuse3-*.tar.gz")
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != PYFUSE3_SDIST_SHA256:
            raise SystemExit(f"build_pyfuse3: {archive.name} has sha256 {digest}, expected {PYFUSE3_SDIST_SHA256}")
        extract(archive, work)
        source = work / f"pyfuse3-{PYFUSE3_VERSION}"
        patch_handlers(source / "src" / "pyfuse3" / "handlers.pxi")
        init = source / "src" / "pyfuse3" / "__init__.pyx"
        init.write_text(init.read_text() + STORE_PAGES)
        (source / "src" / "pyfuse3" / f"{MARKER_MODULE}.py").write_text(
            '"""Marker: this pyfuse3 passes the inode as fh to read/readdir when the kernel skipped open,\n'
            'and has store_pages."""\n\n'
            f"BUILD = {BUILD}\n"
        )
        env = dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=f"{PYFUSE3_VERSION}+{LOCAL_LABEL}")
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall",
             "--no-deps", str(source)],
            check=True, env=env,
        )  # fmt: skip
    print(f"build_pyfuse3: installed pyfuse3 {PYFUSE3_VERSION}+{LOCAL_LABEL} (inode fallback for no-open mode)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
