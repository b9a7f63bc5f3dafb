"""The mount server's session bookkeeping (pure): classes, expiry, idle classes, saved state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chromafs_fuse.access import Principal
from chromafs_fuse.serving.server.session_table import ClassMount, Session, SessionTable, class_key
from chromafs_fuse.serving.server.state_journal import COMPACT_MIN_LINES, StateJournal

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
    StateJournal(str(tmp_path / "state.json")).save(table)
    again = StateJournal(str(tmp_path / "state.json")).load()
    assert again.classes == table.classes and again.sessions == table.sessions
    assert [s.mountpoint for s in again.drop_class("b")] == ["/s/3"] and not again.sessions
    (tmp_path / "bad.json").write_text("{not json")
    assert StateJournal(str(tmp_path / "bad.json")).load().classes == {}


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_state_journal_appends_a_line_per_change_and_a_restart_replays_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    journal, table = StateJournal(str(path)), SessionTable()
    table.classes["a"] = _mount("a")
    journal.save(table)  # the first save writes the whole table
    for n in range(5):
        table.add(Session(f"/s/{n}", "a", None, "anonymous", float(n), None, 0))
        journal.save(table)
    table.remove("/s/0", 9.0)
    journal.save(table)
    journal.save(table)  # nothing changed: nothing written
    lines = _lines(path)
    assert lines[0]["sessions"] == [] and lines[1] == {"class": vars(table.classes["a"])}  # no longer idle
    assert [line.get("session", {}).get("mountpoint") for line in lines[2:7]] == [f"/s/{n}" for n in range(5)]
    assert lines[7:] == [{"session_gone": "/s/0"}]
    table.remove("/s/1", 10.0)
    table.classes["b"] = _mount("b")
    table.classes["a"].idle_since = 11.0  # a field changed in place is a change too
    journal.save(table)
    assert _lines(path)[-3:] == [
        {"class": vars(table.classes["a"])},
        {"class": vars(table.classes["b"])},
        {"session_gone": "/s/1"},
    ]
    again = StateJournal(str(path)).load()
    assert again.classes == table.classes and again.sessions == table.sessions


def test_the_state_journal_is_rewritten_whole_once_its_changes_outnumber_the_table(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    journal, table = StateJournal(str(path)), SessionTable()
    table.classes["a"] = _mount("a")
    for n in range(COMPACT_MIN_LINES + 10):  # sessions come and go: a short table, a long history
        table.add(Session("/s/x", "a", None, "anonymous", float(n), None, 0))
        journal.save(table)
        table.remove("/s/x", float(n))
        journal.save(table)
    assert len(_lines(path)) <= COMPACT_MIN_LINES + 1
    assert StateJournal(str(path)).load().classes == table.classes


def test_a_journal_reloaded_between_saves_still_counts_its_change_lines(tmp_path: Path) -> None:
    """A server restarted before its journal reached the rewrite (each restart a new StateJournal
    on the same file) goes on from the change lines the file holds: the file is rewritten once
    they outnumber the table, however often the server restarted on the way."""
    path = tmp_path / "state.json"
    table = SessionTable()
    table.classes["a"] = _mount("a")
    journal = StateJournal(str(path))
    journal.save(table)
    per_run = COMPACT_MIN_LINES // 3  # change lines a run of the server writes before its restart
    for run in range(8):
        journal = StateJournal(str(path))
        table = journal.load()
        assert list(table.classes) == ["a"] and len(table.sessions) == run % 2, run
        for n in range(per_run // 2):  # a session comes and goes: two change lines
            table.add(Session("/s/x", "a", None, "anonymous", float(n), None, 0))
            journal.save(table)
            table.remove("/s/x", float(n))
            journal.save(table)
        if run % 2 == 0:
            table.add(Session("/s/kept", "a", None, "anonymous", float(run), None, 0))
        else:
            table.remove("/s/kept", float(run))
        journal.save(table)
        assert len(_lines(path)) <= COMPACT_MIN_LINES + 1, f"{len(_lines(path))} lines after {run + 1} restarts"
    again = StateJournal(str(path)).load()
    assert again.classes == table.classes and again.sessions == table.sessions


def test_a_cut_short_last_line_loses_only_that_change_and_an_old_single_object_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    table = SessionTable()
    table.classes["a"] = _mount("a")
    table.add(Session("/s/1", "a", None, "anonymous", 1.0, None, 0))
    StateJournal(str(path)).save(table)
    with path.open("a") as f:
        f.write('{"session": {"mountpoint": "/s/2", "class_k')  # a crash in the middle of a save
    again = StateJournal(str(path)).load()
    assert list(again.sessions) == ["/s/1"] and list(again.classes) == ["a"]
    # the format before the journal: one object, no newline
    path.write_text(json.dumps({"classes": [vars(table.classes["a"])], "sessions": [vars(table.sessions["/s/1"])]}))
    journal = StateJournal(str(path))
    assert list(journal.load().sessions) == ["/s/1"]
    table.add(Session("/s/3", "a", None, "anonymous", 3.0, None, 0))
    journal.save(table)  # appended after a line that had no newline: it must still read
    assert list(StateJournal(str(path)).load().sessions) == ["/s/1", "/s/3"]


def test_a_save_that_fails_is_written_whole_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    journal, table = StateJournal(str(path)), SessionTable()
    table.classes["a"] = _mount("a")
    journal.save(table)
    path.unlink()
    path.mkdir()  # neither an append nor a rewrite can go through (root or not)
    table.add(Session("/s/1", "a", None, "anonymous", 1.0, None, 0))
    with pytest.raises(OSError):
        journal.save(table)
    path.rmdir()
    journal.save(table)  # nothing changed since: the whole table is written all the same
    assert list(StateJournal(str(path)).load().sessions) == ["/s/1"]
