"""The mount server's session bookkeeping (pure): classes, expiry, idle classes, saved state."""

from __future__ import annotations

from pathlib import Path

from chromafs_fuse.access import Principal
from chromafs_fuse.serving.sessions import ClassMount, Session, SessionTable, class_key

SETTINGS = {"site": "acme", "backend": "embedded:/data"}


def test_readers_share_a_class_only_when_they_may_see_the_same_pages_through_the_same_settings() -> None:
    alice = Principal.of(["billing"], "alice", expires_at=100.0)
    bob = Principal.of(["billing"], "bob", expires_at=999.0)
    assert class_key(SETTINGS, alice) == class_key(SETTINGS, bob) == class_key(SETTINGS, alice.reader_class())
    assert class_key(SETTINGS, alice) != class_key(SETTINGS, Principal.of(["billing", "admin"]))
    assert class_key(SETTINGS, Principal.of([])) != class_key(SETTINGS, Principal.anonymous())
    assert class_key(SETTINGS, alice) != class_key({**SETTINGS, "backend": "embedded:/other"}, alice)


def _mount(key: str) -> ClassMount:
    return ClassMount(key, f"/classes/{key}", 10, 1, "acme", "anonymous", "0:50", 0.0, idle_since=0.0)


def test_expiry_idle_classes_and_the_state_a_restarted_server_reads(tmp_path: Path) -> None:
    table = SessionTable()
    table.classes["a"], table.classes["b"] = _mount("a"), _mount("b")
    table.add(Session("/s/1", "a", "alice", "user=alice", 0.0, 50.0, 0))
    table.add(Session("/s/2", "a", "bob", "user=bob", 0.0, None, 0))
    assert [s.mountpoint for s in table.expired(49.9)] == [] and [s.mountpoint for s in table.expired(50.0)] == ["/s/1"]
    assert [c.key for c in table.idle(10.0, 5.0)] == ["b"]  # "a" has sessions
    table.remove("/s/1", 60.0)
    assert table.classes["a"].idle_since is None  # bob is still on it
    table.remove("/s/2", 70.0)
    assert [c.key for c in table.idle(74.0, 5.0)] == ["b"] and {c.key for c in table.idle(75.0, 5.0)} == {"a", "b"}
    table.add(Session("/s/3", "b", None, "anonymous", 80.0, None, 0))
    table.save(str(tmp_path / "state.json"))
    again = SessionTable.load(str(tmp_path / "state.json"))
    assert again.classes == table.classes and again.sessions == table.sessions
    assert [s.mountpoint for s in again.drop_class("b")] == ["/s/3"] and not again.sessions
    (tmp_path / "bad.json").write_text("{not json")
    assert SessionTable.load(str(tmp_path / "bad.json")).classes == {}
