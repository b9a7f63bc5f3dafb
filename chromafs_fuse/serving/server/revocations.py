"""What the mount server knows of revoked tokens (`chromafs revoke`): the revocations it keeps itself
(made without Redis, saved in its root-only class directory so that a restart keeps them), and
which of its sessions any revocation covers, its own or one in a site's Redis (one MGET per
Redis for all its sessions). Blocking: called in trio's worker threads."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence

from chromafs_fuse.backends.redis_revocations import find_many
from chromafs_fuse.config import RedisSettings
from chromafs_fuse.revocation import Revocation, Revocations
from chromafs_fuse.serving.server.session_keeper import SessionReader
from chromafs_fuse.serving.status import write_private_json

log = logging.getLogger("chromafs.mountd")


class KeptRevocations:
    """The server's own revocations, in `path` (JSON), each forgotten at its end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._kept = Revocations()
        try:
            with open(path, "rb") as f:
                self._kept = Revocations.from_json(json.load(f))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            log.error("%s cannot be read (%s): the revocations it held are forgotten", path, exc)
        if self._kept.prune(time.time()):
            self._save()

    def add(self, revocation: Revocation) -> None:
        """Kept, and saved before the caller is answered (OSError when it cannot be)."""
        with self._lock:
            self._kept.add(revocation)
            self._kept.prune(time.time())
            self._save()

    def find(
        self, site: str, subject: str | None, token_id: str | None, issued_at: float | None, now: float
    ) -> Revocation | None:
        with self._lock:
            return self._kept.find(site, subject, token_id, issued_at, now)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        write_private_json(self.path, self._kept.to_json())


def revoked_sessions(
    readers: Sequence[SessionReader], kept: KeptRevocations | None, now: float | None = None
) -> dict[str, Revocation]:
    """Mountpoint -> the revocation that covers its session's token: the server's own, then each
    site's Redis (one MGET per Redis, whatever the number of sessions)."""
    now = time.time() if now is None else now
    out: dict[str, Revocation] = {}
    by_redis: dict[RedisSettings, list[SessionReader]] = {}
    for reader in readers:
        own = kept.find(reader.site, reader.subject, reader.token_id, reader.issued_at, now) if kept else None
        if own is not None:
            out[reader.mountpoint] = own
        elif reader.redis is not None:
            by_redis.setdefault(RedisSettings(**reader.redis), []).append(reader)
    for settings, group in by_redis.items():
        found = find_many(settings, [(r.site, r.subject, r.token_id, r.issued_at) for r in group], now)
        for reader, revocation in zip(group, found, strict=True):
            if revocation is not None:
                out[reader.mountpoint] = revocation
    return out
