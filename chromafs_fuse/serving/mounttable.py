"""The kernel's mount table (/proc/self/mounts, mountinfo): reading paths as the kernel writes them.

The kernel escapes space, tab, newline and backslash in mount paths as three octal digits
(`\\040`) and writes every other byte as it is (UTF-8 names stay UTF-8), so a path is unescaped
on bytes and then decoded: never with Python's `unicode_escape`, which garbles non-ASCII names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_OCTAL = re.compile(rb"\\([0-7]{3})")
_ESCAPED = {"\\": "\\134", " ": "\\040", "\t": "\\011", "\n": "\\012"}


def unescape(field: bytes) -> str:
    """A path field of the mount table as the path it names."""
    if b"\\" not in field:  # nearly every path: the table is read on every session request
        return os.fsdecode(field)
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field))


def escape(path: str) -> str:
    """A path as the mount table writes it."""
    return "".join(_ESCAPED.get(char, char) for char in path)


@dataclass(frozen=True, slots=True)
class MountEntry:
    source: str
    target: str
    fstype: str


def mounts(table: str = "/proc/self/mounts") -> list[MountEntry]:
    entries = []
    with open(table, "rb") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3:
                entries.append(MountEntry(unescape(fields[0]), unescape(fields[1]), os.fsdecode(fields[2])))
    return entries


def is_mounted(path: str | os.PathLike[str]) -> bool:
    target = os.path.realpath(path)
    return any(entry.target == target for entry in mounts())
