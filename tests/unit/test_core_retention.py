"""Which replaced page versions a re-ingest keeps for mounts still on the previous tree."""

from __future__ import annotations

from chromafs_fuse.ingest.retention import (
    RetiredRecord,
    RetiredVersion,
    decode_record,
    decode_retired,
    encode_retired,
    plan_retention,
)


def test_replaced_versions_are_kept_for_the_grace_period_then_expire() -> None:
    plan = plan_retention([], {"a.md": "old-a", "gone.md": "old-g"}, {"a.md": "new-a"}, now=1000.0, grace_s=600)
    assert plan.expired == [] and plan.kept_pairs() == {("a.md", "old-a"), ("gone.md", "old-g")}
    later = plan_retention(plan.keep, {}, {"a.md": "new-a"}, now=1599.0, grace_s=600)
    assert later.expired == [] and len(later.keep) == 2
    expired = plan_retention(later.keep, {}, {"a.md": "new-a"}, now=1600.0, grace_s=600)
    assert {(r.key, r.sha256) for r in expired.expired} == {("a.md", "old-a"), ("gone.md", "old-g")}
    assert expired.keep == []


def test_a_version_that_is_live_again_is_never_deleted_and_retiring_twice_keeps_the_first_time() -> None:
    previous = [RetiredVersion("a.md", "v1", 100.0), RetiredVersion("b.md", "v1", 100.0)]
    # a.md was reverted to v1; b.md's v1 is retired once more by a later ingest
    plan = plan_retention(previous, {"a.md": "v2", "b.md": "v1"}, {"a.md": "v1", "b.md": "v3"}, 500.0, 300)
    assert ("a.md", "v1") not in plan.kept_pairs() | {(r.key, r.sha256) for r in plan.expired}
    assert plan.expired == [RetiredVersion("b.md", "v1", 100.0)]
    assert plan.keep == [RetiredVersion("a.md", "v2", 500.0)]


def test_zero_grace_expires_at_once_and_the_record_round_trips() -> None:
    plan = plan_retention([], {"é/x.md": "s"}, {}, 10.0, 0)
    assert plan.keep == [] and plan.expired == [RetiredVersion("é/x.md", "s", 10.0)]
    assert decode_retired(encode_retired(plan.expired)) == plan.expired
    for unreadable in ("", "{", '{"retired": [[1]]}', "[]"):
        assert decode_retired(unreadable) == []


def test_binary_files_kept_in_chroma_are_retired_by_sha256_in_the_same_record() -> None:
    pages = [RetiredVersion("a.md", "v1", 1.0)]
    blobs = [RetiredVersion("ab" * 32, "ab" * 32, 2.0)]
    document = encode_retired(pages, blobs)
    assert decode_record(document) == RetiredRecord(pages, blobs)
    assert decode_retired(document) == pages
    assert encode_retired(pages) == '{"retired":[["a.md","v1",1.0]]}'  # no blobs: the record of before
    assert decode_record(None) == RetiredRecord([], []) and decode_record('{"retired": [], "blobs": [1]}') is None
    # a file whose bytes are live again (restored, or under another name) is never deleted
    plan = plan_retention(blobs, {}, {"ab" * 32: "ab" * 32}, 1000.0, 0)
    assert plan.keep == [] and plan.expired == []
