"""Which old page versions a re-ingest keeps, and for how long (pure: no I/O).

A re-ingest writes the new version of a changed page under new chunk ids and switches the
tree; mounts move to the new tree within their refresh interval. Until they have, a mount
still serving the old tree may need the old chunks, so they are *retired*, not deleted:
their (page, sha256) and the time the new tree was published are kept in a record of the
collection, and a later ingest deletes them once the grace period has passed.

Binary files kept in Chroma itself (blob_pieces.py) are retired the same way, by their sha256
alone (files with the same bytes share their pieces): a version is the pair (sha256, sha256).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetiredVersion:
    key: str
    sha256: str
    retired_at: float  # seconds since the epoch, by the clock of the ingest that retired it


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    keep: list[RetiredVersion]  # still within the grace period
    expired: list[RetiredVersion]  # their chunks may be deleted now

    def kept_pairs(self) -> set[tuple[str, str]]:
        return {(r.key, r.sha256) for r in self.keep}


def plan_retention(
    previous: Iterable[RetiredVersion],
    replaced: Mapping[str, str],
    live: Mapping[str, str],
    now: float,
    grace_s: float,
) -> RetentionPlan:
    """`previous`: versions retired by earlier ingests; `replaced`: key -> sha256 of the page
    versions this ingest replaced or removed; `live`: key -> sha256 of the pages stored as
    chunks in the new tree. A version that is live again (a page reverted) is not retired; a
    version retired twice keeps its first retirement time."""
    first: dict[tuple[str, str], float] = {}
    candidates = [*previous, *(RetiredVersion(k, sha, now) for k, sha in replaced.items())]
    for version in candidates:
        pair = (version.key, version.sha256)
        if live.get(version.key) == version.sha256:
            continue
        first[pair] = min(first.get(pair, version.retired_at), version.retired_at)
    keep: list[RetiredVersion] = []
    expired: list[RetiredVersion] = []
    for (key, sha), at in sorted(first.items()):
        (expired if now - at >= grace_s else keep).append(RetiredVersion(key, sha, at))
    return RetentionPlan(keep, expired)


@dataclass(frozen=True, slots=True)
class RetiredRecord:
    pages: list[RetiredVersion]
    blobs: list[RetiredVersion]  # binary files kept in Chroma: key and sha256 both the file's sha256


def encode_retired(versions: Iterable[RetiredVersion], blobs: Iterable[RetiredVersion] = ()) -> str:
    record: dict[str, object] = {"retired": [[v.key, v.sha256, round(v.retired_at, 3)] for v in versions]}
    retired_blobs = [[v.sha256, round(v.retired_at, 3)] for v in blobs]
    if retired_blobs:
        record["blobs"] = retired_blobs
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def decode_record(document: str | None) -> RetiredRecord | None:
    """The retired page versions and binary files in the record; None when it is unreadable
    (what it named is then left in place: the safe side). No record is an empty one."""
    if not document:
        return RetiredRecord([], [])
    try:
        record = json.loads(document)
        pages = [RetiredVersion(str(key), str(sha), float(at)) for key, sha, at in record["retired"]]
        blobs = [RetiredVersion(str(sha), str(sha), float(at)) for sha, at in record.get("blobs", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return RetiredRecord(pages, blobs)


def decode_retired(document: str | None) -> list[RetiredVersion]:
    """The retired page versions in the record; an unreadable record counts as empty."""
    record = decode_record(document)
    return record.pages if record is not None else []
