#!/usr/bin/env python3
"""Build and install pyfuse3 with the inode passed to read/readdir in no-open mode, and a
batched notify_store.

pyfuse3 hands `read` and `readdir` only the file handle. When a filesystem
answers `open`/`opendir` with ENOSYS, the kernel (Linux >= 4.19 / 5.1) stops
sending open, flush and release altogether, keeps each file's pages cached
across opens and caches directory listings (FOPEN_KEEP_CACHE, FOPEN_CACHE_DIR)
- but every later read then carries file handle 0, and the filesystem cannot
tell which file it is for. This script downloads the pyfuse3 source release
(pinned by sha256), applies scripts/pyfuse3/chromafs-pyfuse3-3.5.0.patch (two
lines of `handlers.pxi` so that a zero file handle is replaced by the request's
inode; `store_pages`, which stores many whole files in the kernel's page cache
with the GIL released once for all of them; the marker module
`pyfuse3.chromafs_inode_fallback`, with `BUILD`, by which chromafs detects the
build) and installs the result into the running Python.

Without it chromafs still works, in open mode (one daemon round trip per open
and per release). Usage: .venv/bin/python scripts/build_pyfuse3.py [--check]
(--check: exit 0 if this build is already installed, 1 if not, without building).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

PYFUSE3_VERSION = "3.5.0"
PYFUSE3_SDIST_SHA256 = "88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24"
PATCH = Path(__file__).resolve().parent / "pyfuse3" / f"chromafs-pyfuse3-{PYFUSE3_VERSION}.patch"
LOCAL_LABEL = "chromafs3"
# scripts/setup rebuilds when the installed marker has an older BUILD; the patch's marker must say the same.
BUILD = 3
MARKER_MODULE = "chromafs_inode_fallback"
HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    header: str
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    path: str  # relative to the tree the patch applies to (-p1)
    creates: bool
    hunks: list[Hunk] = field(default_factory=list)


def split_lines(text: str) -> list[str]:
    """Lines with their "\n" (the last one may lack it); only "\n" ends a line, as in diff."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def patch_path(header: str, name: str) -> str | None:
    """The path of a ---/+++ line with its first component (a/, b/) stripped; None for /dev/null."""
    raw = header[4:].split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    parts = PurePosixPath(raw).parts[1:]
    if not parts or raw.startswith("/") or ".." in parts:
        raise SystemExit(f"build_pyfuse3: {name}: bad path in {header.strip()!r}")
    return "/".join(parts)


def parse_patch(text: str, name: str) -> list[FilePatch]:
    """A unified diff (diff -ruN or git diff, -p1 paths); text before the first file header is ignored.
    Creates and modifies files; renames and deletions are refused."""
    lines = [*split_lines(text), ""]  # the "" ends a truncated hunk
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = patch_path(line, name), patch_path(lines[i + 1], name)
            if new is None or (old is not None and old != new):
                raise SystemExit(f"build_pyfuse3: {name}: only creating and changing files is supported: {line!r}")
            files.append(FilePatch(new, creates=old is None))
            i += 2
        elif line.startswith("@@ "):
            match = HUNK_HEADER.match(line)
            if match is None or not files:
                raise SystemExit(f"build_pyfuse3: {name}: line {i + 1}: hunk header without a file: {line!r}")
            old_count = int(match[2] or 1)
            new_count = int(match[4] or 1)
            hunk = Hunk(line.strip(), int(match[1]))
            files[-1].hunks.append(hunk)
            i += 1
            last = ""
            while len(hunk.old) < old_count or len(hunk.new) < new_count or lines[i].startswith("\\"):
                body = lines[i]
                # "\n" alone: a context line whose single space an editor stripped
                kind, content = (" ", "\n") if body == "\n" else (body[:1], body[1:])
                if kind == "\\":
                    for side, mark in ((hunk.old, "-"), (hunk.new, "+")):
                        if last in (mark, " "):
                            side[-1] = side[-1].removesuffix("\n")
                elif kind in (" ", "-", "+"):
                    if kind != "+":
                        hunk.old.append(content)
                    if kind != "-":
                        hunk.new.append(content)
                    last = kind
                else:
                    raise SystemExit(
                        f"build_pyfuse3: {name}: {files[-1].path}: {hunk.header} ends early or is malformed"
                        f" at patch line {i + 1}: {body!r}"
                    )
                i += 1
                if len(hunk.old) > old_count or len(hunk.new) > new_count:
                    raise SystemExit(f"build_pyfuse3: {name}: {files[-1].path}: {hunk.header} has too many lines")
        else:
            i += 1  # the leading comment, "diff ..." lines
    if not files or not all(f.hunks for f in files):
        raise SystemExit(f"build_pyfuse3: {name}: no file changes in the patch, or a file without hunks")
    return files


def apply_patch(patch: Path, root: Path) -> None:
    """Apply `patch` to the tree at `root` exactly: every hunk at its own line, no offset, no fuzz
    (the sdist is pinned), or exit naming the file and the hunk. Nothing is written unless all apply."""
    results: dict[Path, str] = {}
    for file in parse_patch(patch.read_text(encoding="utf-8"), patch.name):
        target = root / file.path
        if target in results:
            raise SystemExit(f"build_pyfuse3: {patch.name}: {file.path} is in the patch twice")
        if file.creates == target.exists():
            state = "already exists" if file.creates else "is missing"
            raise SystemExit(f"build_pyfuse3: {patch.name}: {file.path} {state}")
        lines = [] if file.creates else split_lines(target.read_bytes().decode("utf-8"))
        shift = 0  # lines added minus lines removed by the hunks before
        for number, hunk in enumerate(file.hunks, 1):
            # "-N,0" inserts after line N; otherwise the hunk's old lines start at line N
            start = hunk.old_start - (1 if hunk.old else 0) + shift
            if start < 0 or lines[start : start + len(hunk.old)] != hunk.old:
                raise SystemExit(
                    f"build_pyfuse3: {patch.name}: hunk {number} ({hunk.header}) does not apply to {file.path}"
                )
            lines[start : start + len(hunk.old)] = hunk.new
            shift += len(hunk.new) - len(hunk.old)
        results[target] = "".join(lines)
    for target, text in results.items():
        target.write_bytes(text.encode("utf-8"))


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
    if sys.argv[1:]:
        raise SystemExit("usage: build_pyfuse3.py [--check]")
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
        apply_patch(PATCH, source)
        marker = source / "src" / "pyfuse3" / f"{MARKER_MODULE}.py"
        if f"\nBUILD = {BUILD}\n" not in marker.read_text(encoding="utf-8"):
            raise SystemExit(f"build_pyfuse3: {PATCH.name} makes a marker whose BUILD is not {BUILD}; bump both")
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
