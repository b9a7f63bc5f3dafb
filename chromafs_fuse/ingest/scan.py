"""Reading a docs folder for ingest: walk it, read every file (in parallel), decide
each page's access, and name every file that could not be taken as it is.

One file never stops the scan: an unreadable, vanished or badly named file, a
broken or looping symbolic link, a page whose access keys cannot be read, all
become a `Problem` (path, line where known, reason, what was done) and the
rest of the site goes on.

Symbolic links are followed when they point inside the source folder (a
linked directory is walked under the link's name, a loop is reported); links
that leave the folder are skipped, so a docs repository cannot publish a file
from elsewhere on the ingesting machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chromafs_fuse.ingest.access_rules import (
    MARKDOWN_SUFFIXES,
    NAVIGATION_FILES,
    Access,
    AccessSpecError,
    AclRule,
    access_inputs_digest,
    decide_access,
    decode_config_json,
    default_access,
    public_pages_from_navigation,
)
from chromafs_fuse.pathrules import InvalidPath, normalize_key

log = logging.getLogger("chromafs.ingest")

# What happened to a file with a problem.
NOT_INGESTED = "not ingested"
HIDDEN = "hidden from everyone"
ACCESS_FROM_ACL = "access from --acl rules"
INGESTED = "ingested"


@dataclass(frozen=True, slots=True)
class Problem:
    path: str  # relative to the source folder
    reason: str
    outcome: str
    line: int | None = None

    @property
    def is_error(self) -> bool:
        """Errors: the file is not served as its source says. The rest are warnings."""
        return self.outcome != INGESTED

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.reason} ({self.outcome})"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "severity": "error" if self.is_error else "warning"}


OUTCOME_ORDER = (INGESTED, ACCESS_FROM_ACL, HIDDEN, NOT_INGESTED)  # from served as its source says to not at all


def one_per_file(problems: list[Problem]) -> list[Problem]:
    """Each file's problems as one, in the order the files first had one: its final outcome (the
    furthest from being served as its source says), every reason that still holds then (the same
    one once; what a file that is not ingested at all was going to be served as does not), and
    the line of the first that names one."""
    by_path: dict[str, list[Problem]] = {}
    for problem in problems:
        by_path.setdefault(problem.path, []).append(problem)
    merged = []
    for path, found in by_path.items():
        outcome = max((p.outcome for p in found), key=OUTCOME_ORDER.index)
        kept = [p for p in found if not (outcome == NOT_INGESTED and p.outcome == INGESTED)]
        reasons = list(dict.fromkeys(p.reason for p in kept))
        line = next((p.line for p in kept if p.line), None)
        merged.append(Problem(path, "; ".join(reasons), outcome, line))
    return merged


@dataclass(slots=True)
class SourceFile:
    key: str
    data: bytes
    text: str | None  # None for binary files and text that is not UTF-8
    access: Access
    mtime: float
    sha256: str
    path: str = ""  # where it was read from


@dataclass(frozen=True, slots=True)
class KeptFile:
    """A file the stored tree holds with this very size and mtime: not read again (rsync's
    quick check; the caller decides when it may be trusted)."""

    key: str
    path: str  # to open, should its bytes be wanted after all
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class ScanOptions:
    root: Path
    default_access: str = "public"
    acl_rules: Sequence[AclRule] = ()
    include_hidden: bool = False


@dataclass
class ScanResult:
    files: list[SourceFile]
    problems: list[Problem]
    hidden_skipped: int = 0


def walk(root: Path, include_hidden: bool, problems: list[Problem]) -> Iterator[tuple[str, str, int, float]]:
    """(relative path, path to open, size, mtime) of every regular file, in sorted order."""
    real_root = os.path.realpath(root)
    stack: list[tuple[str, str, tuple[str, ...]]] = [(str(root), "", (real_root,))]
    while stack:
        directory, prefix, ancestors = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            problems.append(Problem(prefix.rstrip("/") or ".", f"cannot list: {exc.strerror}", NOT_INGESTED))
            continue
        subdirs: list[tuple[str, str, tuple[str, ...]]] = []
        for entry in entries:
            if not include_hidden and entry.name.startswith("."):
                continue
            path = entry.path
            relative = prefix + entry.name
            try:
                is_link = entry.is_symlink()
                if is_link:
                    target = os.path.realpath(path, strict=True)
                    if os.path.commonpath([target, real_root]) != real_root:
                        reason = f"symbolic link leaves the source folder ({target})"
                        problems.append(Problem(relative, reason, NOT_INGESTED))
                        continue
                    found = os.stat(target)
                else:
                    found = entry.stat(follow_symlinks=False)
                    target = path
            except OSError as exc:
                reason = (
                    "symbolic link loop"
                    if exc.errno == 40
                    else ("broken symbolic link" if is_link else f"cannot stat: {exc.strerror}")
                )
                problems.append(Problem(relative, reason, NOT_INGESTED))
                continue
            if stat.S_ISDIR(found.st_mode):
                real = os.path.realpath(target)
                if real in ancestors:
                    problems.append(Problem(relative, "symbolic link loop (links to a folder above it)", NOT_INGESTED))
                    continue
                subdirs.append((path, relative + "/", (*ancestors, real)))
            elif stat.S_ISREG(found.st_mode):
                yield relative, path, found.st_size, found.st_mtime
            else:
                problems.append(Problem(relative, "not a regular file", NOT_INGESTED))
        stack.extend(reversed(subdirs))


def _read(path: str) -> tuple[bytes, float, str] | OSError:
    """(bytes, mtime, sha256), in a worker thread: hashing is the reader's, beside the reads."""
    try:
        with open(path, "rb") as handle:
            data, mtime = handle.read(), os.fstat(handle.fileno()).st_mtime
    except OSError as exc:
        return exc
    return data, mtime, hashlib.sha256(data).hexdigest()


_ACCESS_LINE = re.compile(r"""^\s*["']?(?:public|groups)["']?\s*[:=]""", re.MULTILINE)


def _access_line(text: str) -> int | None:
    match = _ACCESS_LINE.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def read_navigation(root: Path, problems: list[Problem]) -> set[str]:
    """Page references that navigation files at the site root mark public."""
    found: set[str] = set()
    for name in NAVIGATION_FILES:
        path = root / name
        if not path.is_file():
            continue
        try:
            value, warnings = decode_config_json(path.read_bytes(), name)
        except (OSError, AccessSpecError) as exc:
            reason = str(exc).removeprefix(f"{name}: ")
            problems.append(Problem(name, f"{reason}; its public groups are not applied", INGESTED))
            continue
        problems.extend(Problem(name, warning, INGESTED) for warning in warnings)
        found |= public_pages_from_navigation(value)
    return found


# what the scan holds read ahead of the ingest: a site's size never sets the ingest's memory
READ_AHEAD_BYTES = 32 * 1024 * 1024
READ_AHEAD_FILES = 64


class SiteScan:
    """The files of a source folder, read in order a bounded window ahead (READ_AHEAD_BYTES, at
    least one file), each with its access decided; `problems` grows as they are read. The
    folder is walked when this is made: `total` is how many files it names."""

    def __init__(self, options: ScanOptions, workers: int = 8) -> None:
        self.options = options
        self.workers = workers
        self.problems: list[Problem] = []
        # (key, sha256) -> the access decided when these bytes were last ingested, under the same
        # access inputs (access_inputs_digest), or None: those pages' frontmatter is not read again
        self.known: Callable[[str, str], Access | None] | None = None
        self.reused = 0
        # (key, size, mtime) -> whether the stored tree holds this file as it is: not read
        self.unchanged: Callable[[str, int, float], bool] | None = None
        self.navigation_public = read_navigation(options.root, self.problems)
        self.fallback = default_access(options.default_access)
        self.paths: list[tuple[str, str, int, float]] = []  # (key, path, size and mtime when walked)
        for relative, path, size, mtime in walk(options.root, options.include_hidden, self.problems):
            try:
                self.paths.append((normalize_key(relative), path, size, mtime))
            except InvalidPath as exc:
                self.problems.append(Problem(relative, f"name cannot be served: {exc}", NOT_INGESTED))

    @property
    def total(self) -> int:
        return len(self.paths)

    def access_inputs(self) -> str:
        """The digest of what access is decided from beside a page's own bytes and key."""
        return access_inputs_digest(self.options.default_access, self.options.acl_rules, self.navigation_public)

    def __iter__(self) -> Iterator[SourceFile | KeptFile]:
        waiting: deque[tuple[str, str, int, Future[tuple[bytes, float, str] | OSError] | KeptFile]] = deque()
        ahead = 0
        paths = iter(self.paths)
        unchanged = self.unchanged
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while True:
                while not waiting or (ahead < READ_AHEAD_BYTES and len(waiting) < READ_AHEAD_FILES):
                    following = next(paths, None)
                    if following is None:
                        break
                    key, path, size, mtime = following
                    if unchanged is not None and unchanged(key, size, mtime):
                        waiting.append((key, path, 0, KeptFile(key, path, size, mtime)))
                        continue
                    waiting.append((key, path, size, pool.submit(_read, path)))
                    ahead += size
                if not waiting:
                    return
                key, path, size, pending = waiting.popleft()
                if isinstance(pending, KeptFile):
                    yield pending
                    continue
                read = pending.result()
                ahead -= size
                if isinstance(read, OSError):
                    reason = "vanished before it was read" if isinstance(read, FileNotFoundError) else read.strerror
                    self.problems.append(Problem(key, f"cannot read: {reason}", NOT_INGESTED))
                    continue
                data, mtime, sha = read
                known = self.known(key, sha) if self.known is not None else None
                if known is not None:
                    self.reused += 1
                    text, _ = _page_text(key, data, self.problems)
                    yield SourceFile(key, data, text, known, mtime, sha, path)
                    continue
                source = _decide(
                    key, data, mtime, sha, self.options, self.navigation_public, self.fallback, self.problems
                )
                if source is not None:
                    source.path = path
                    yield source


def scan_site(options: ScanOptions, workers: int = 8) -> ScanResult:
    """Read every file of the source folder and decide its access (the whole site in memory:
    the ingest reads it through `SiteScan`, a window at a time)."""
    scan = SiteScan(options, workers)
    files = [file for file in scan if isinstance(file, SourceFile)]
    return ScanResult(files, scan.problems)


def _page_text(key: str, data: bytes, problems: list[Problem]) -> tuple[str | None, str | None]:
    """(text stored as chunks, or None for a binary file; text the access keys are read from).

    A Markdown page's access keys are read whatever its body holds (NUL, control bytes,
    invalid UTF-8), so no byte can make a page more visible than its frontmatter says; its
    bytes are served as they are. Other files with a NUL byte or invalid UTF-8 are binary."""
    markdown = key.lower().endswith(MARKDOWN_SUFFIXES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not markdown:
            return None, None
        line = data.count(b"\n", 0, exc.start) + 1
        reason = f"not UTF-8 (byte {exc.start}): kept as a binary file, served byte for byte"
        problems.append(Problem(key, reason, INGESTED, line))
        return None, data.decode("utf-8", "replace")
    nul = text.find("\x00")
    if nul < 0:
        return text, text
    if not markdown:
        return None, None
    line = text.count("\n", 0, nul) + 1
    problems.append(Problem(key, "has a NUL byte: served as it is", INGESTED, line))
    return text, text


def _decide(
    key: str,
    data: bytes,
    mtime: float,
    sha: str,
    options: ScanOptions,
    navigation_public: set[str],
    fallback: Access,
    problems: list[Problem],
) -> SourceFile | None:
    text, frontmatter_text = _page_text(key, data, problems)
    access, frontmatter, error = decide_access(key, frontmatter_text, options.acl_rules, navigation_public, fallback)
    if frontmatter is not None:
        first_issue = frontmatter.issues[0] if frontmatter.issues else None
        if error is None and first_issue is not None:
            unread = ", ".join(sorted(frontmatter.unreadable)) or "none"
            problems.append(
                Problem(key, f"frontmatter {first_issue.message} (keys not read: {unread})", INGESTED, first_issue.line)
            )
        elif error is not None:
            line = first_issue.line if first_issue else _access_line(frontmatter_text or "")
            detail = f"frontmatter {first_issue.message}; {error}" if first_issue else str(error)
            outcome = ACCESS_FROM_ACL if access is not None else HIDDEN
            problems.append(Problem(key, detail, outcome, line))
    if access is None:
        log.debug("%s: access cannot be read; served to nobody", key)  # its problem line says so
        return None
    return SourceFile(key, data, text, access, mtime, sha)
