"""The sessions of one serving process (pure): each session's own directories, owner and expiry.

A session is a reader's view of its class, served at `.sessions/<slot>` of the serving process's
mount and bound on the reader's mountpoint. Its directories are its own inodes, so that what the
kernel caches of them (dentries, attributes, listings) belongs to that session alone and can be
refused and forgotten when the session ends; its files are the class's inodes, shared by every
session and class of the site, so the kernel keeps each page once.

A session directory's inode is computed, never stored: the top bit (table inodes are 63-bit
hashes, so they never have it), the session's slot, and the directory's *ordinal* in its class
(`DirOrdinals`: a class directory's inode -> a small number, given on first use and kept across
re-ingests, so a path keeps its inode). A session costs a few hundred bytes whatever the site's
size. Slots are never reused within a serving process: an inode of an ended session stays
refused for as long as the kernel holds it.
"""

from __future__ import annotations

import errno
import heapq
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from chromafs_fuse.errors import FsError

SESSION_BIT = 1 << 63
ORDINAL_BITS = 24
MAX_ORDINAL = (1 << ORDINAL_BITS) - 1
MAX_SLOT = (1 << (63 - ORDINAL_BITS)) - 1
SESSIONS_DIR = b".sessions"  # no site directory starts with a dot (serving_views.site_dir_name)
OWNER_ONLY = stat.S_IFDIR | 0o500
EVERYONE = stat.S_IFDIR | 0o555


def is_session_inode(inode: int) -> bool:
    return inode >= SESSION_BIT


def session_inode(slot: int, ordinal: int) -> int:
    return SESSION_BIT | slot << ORDINAL_BITS | ordinal


def split_inode(inode: int) -> tuple[int, int]:
    """(slot, ordinal) of a session directory's inode."""
    return (inode & ~SESSION_BIT) >> ORDINAL_BITS, inode & MAX_ORDINAL


class DirOrdinals:
    """A class's directories numbered by first use (the root is 0): the same path keeps its
    number across re-ingests (its class inode is its path's), a number is never given twice."""

    __slots__ = ("_inodes", "_ordinal")

    def __init__(self, root_inode: int) -> None:
        self._inodes: list[int] = [root_inode]
        self._ordinal: dict[int, int] = {root_inode: 0}

    def ordinal(self, class_inode: int) -> int:
        ordinal = self._ordinal.get(class_inode)
        if ordinal is None:
            ordinal = len(self._inodes)
            if ordinal > MAX_ORDINAL:
                raise FsError(errno.ENOSPC)
            self._inodes.append(class_inode)
            self._ordinal[class_inode] = ordinal
        return ordinal

    def known(self, class_inode: int) -> int | None:
        """The ordinal of a directory some session was shown, or None."""
        return self._ordinal.get(class_inode)

    def class_inode(self, ordinal: int) -> int | None:
        return self._inodes[ordinal] if ordinal < len(self._inodes) else None

    def __len__(self) -> int:
        return len(self._inodes)


@dataclass(slots=True)
class ServedSession:
    """One session as its serving process knows it."""

    slot: int
    site: str  # the site directory and view name of its class
    view: str
    uid: int  # its owner: its directories are the owner's, mode 0500 unless `allow_other`
    gid: int
    expires_at: float | None  # the token's exp (None: no token, no expiry)
    allow_other: bool = False
    ended: bool = False

    @property
    def mode(self) -> int:
        return EVERYONE if self.allow_other else OWNER_ONLY

    @property
    def path(self) -> str:
        return f"{SESSIONS_DIR.decode()}/{self.slot}"

    def alive(self, now: float) -> bool:
        return not self.ended and (self.expires_at is None or now < self.expires_at)


@dataclass
class SessionSpace:
    """Every session of a serving process, by slot; which one is next to expire."""

    sessions: dict[int, ServedSession] = field(default_factory=dict)
    next_slot: int = 1
    _deadlines: list[tuple[float, int]] = field(default_factory=list)  # heap of (expires_at, slot)
    _of_view: dict[tuple[str, str], dict[int, ServedSession]] = field(default_factory=dict)  # by class

    def open(
        self, site: str, view: str, uid: int, gid: int, expires_at: float | None, allow_other: bool = False
    ) -> ServedSession:
        if self.next_slot > MAX_SLOT:
            raise FsError(errno.ENOSPC)
        session = ServedSession(self.next_slot, site, view, uid, gid, expires_at, allow_other)
        self.next_slot += 1
        self.sessions[session.slot] = session
        self._of_view.setdefault((site, view), {})[session.slot] = session
        if expires_at is not None:
            heapq.heappush(self._deadlines, (expires_at, session.slot))
        return session

    def set_expiry(self, session: ServedSession, expires_at: float | None) -> None:
        """It expires at `expires_at` from now on: a spare handed out (it had none), a session
        renewed (a later token); a deadline left in the heap from before is passed over."""
        session.expires_at = expires_at
        if expires_at is not None:
            heapq.heappush(self._deadlines, (expires_at, session.slot))

    def end(self, slot: int) -> ServedSession | None:
        """End a session (its user unmounted it, its class went, the server ended it)."""
        session = self.sessions.pop(slot, None)
        if session is not None:
            session.ended = True
            of_view = self._of_view.get((session.site, session.view))
            if of_view is not None:
                of_view.pop(slot, None)
                if not of_view:
                    del self._of_view[(session.site, session.view)]
        return session

    def expire(self, now: float) -> list[ServedSession]:
        """End every session whose expiry has passed; the sessions ended."""
        ended: list[ServedSession] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, slot = heapq.heappop(self._deadlines)
            current = self.sessions.get(slot)
            if current is None or current.expires_at is None or current.expires_at > now:
                continue  # ended already, or renewed: a later deadline of its own is in the heap
            session = self.end(slot)
            if session is not None:
                ended.append(session)
        return ended

    def next_expiry(self) -> float | None:
        while self._deadlines and self._stale(*self._deadlines[0]):
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def _stale(self, deadline: float, slot: int) -> bool:
        session = self.sessions.get(slot)
        return session is None or session.expires_at != deadline

    def of_view(self, site: str, view: str) -> Iterator[ServedSession]:
        """The sessions of one class (however many others the process serves)."""
        return iter(list(self._of_view.get((site, view), {}).values()))

    def get(self, slot: int) -> ServedSession | None:
        return self.sessions.get(slot)

    def slot_of(self, name: bytes) -> int | None:
        """The slot a name in `.sessions` names, or None."""
        if not name.isdigit() or len(name) > 15:
            return None
        return int(name)

    def live(self, slot: int, now: float) -> ServedSession:
        """The session of `slot` while it is alive; EACCES once it ended (or never existed
        below the next slot: an ended one), ENOENT for a slot never given."""
        session = self.sessions.get(slot)
        if session is not None and session.alive(now):
            return session
        raise FsError(errno.EACCES if 0 < slot < self.next_slot else errno.ENOENT)
