"""Who may read what: the access rule and the pruning of a tree (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from chromafs_fuse.tree import PathEntry


@dataclass(frozen=True, slots=True)
class Principal:
    """The reader a mount is scoped to, as derived from its token."""

    authenticated: bool
    groups: frozenset[str] = frozenset()
    subject: str | None = None
    expires_at: float | None = None  # the token's `exp` (seconds since the epoch): the session ends then
    token_id: str | None = None  # the token's `jti`, and when it was issued (`iat`): what a revocation names
    issued_at: float | None = None

    @classmethod
    def anonymous(cls) -> Principal:
        return cls(authenticated=False)

    @classmethod
    def of(
        cls,
        groups: Iterable[str],
        subject: str | None = None,
        expires_at: float | None = None,
        token_id: str | None = None,
        issued_at: float | None = None,
    ) -> Principal:
        return cls(True, frozenset(groups), subject, expires_at, token_id, issued_at)

    def reader_class(self) -> Principal:
        """The same visibility without a person or an expiry: what a shared class mount serves."""
        authenticated, groups = visibility_key(self)
        return Principal(authenticated, groups)

    def describe(self) -> str:
        if not self.authenticated:
            return "anonymous"
        groups = ",".join(sorted(self.groups)) or "-"
        return f"user={self.subject or '?'} groups={groups}"


def may_read(entry: PathEntry, principal: Principal) -> bool:
    """Public pages are for everyone; others need a valid token and, if the page
    names groups, at least one of them."""
    if entry.is_public:
        return True
    if not principal.authenticated:
        return False
    return not entry.groups or not entry.groups.isdisjoint(principal.groups)


VisibilityKey = tuple[bool, frozenset[str]]


def visibility_key(principal: Principal) -> VisibilityKey:
    """What `may_read` depends on: two readers with equal keys may read exactly the same pages,
    so they may share a pruned tree. Kept next to `may_read` so that the two never disagree."""
    return (principal.authenticated, principal.groups if principal.authenticated else frozenset())


def visible_entries(entries: Mapping[str, PathEntry], principal: Principal) -> dict[str, PathEntry]:
    """The part of the tree this principal may see. Directories are implied by
    the files kept, so a directory holding only hidden pages disappears."""
    return {key: e for key, e in entries.items() if may_read(e, principal)}
