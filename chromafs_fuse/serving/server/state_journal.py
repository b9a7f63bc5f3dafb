"""The mount server's session table on disk, as a journal (JSON lines), so that a restarted
server carries on, and a session costs a line, not a rewrite of every session of the host.

The first line is the whole table, `{"classes": [...], "sessions": [...]}` (what a state file
of one object held, which reads the same). Each later line is one change: `{"class": {...}}` (a
class added or changed), `{"class_gone": key}`, `{"session": {...}}`, `{"session_gone":
mountpoint}`. A save appends what differs from what was written before (comparing each record:
for a thousand sessions a fraction of a millisecond, where encoding them all took 7 ms); once
the change lines outnumber the live records, the file is rewritten as one table. Replaying stops
at a line that cannot be read (a save cut short by a crash): what came before stands.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from chromafs_fuse.serving.server.session_table import ClassMount, Session, SessionTable
from chromafs_fuse.serving.status import write_private_json

log = logging.getLogger("chromafs.mountd")
COMPACT_MIN_LINES = 1000  # change lines a journal may hold whatever the table's size


class StateJournal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._classes: dict[str, dict[str, Any]] = {}  # what the file says now
        self._sessions: dict[str, dict[str, Any]] = {}
        self._changes = 0  # change lines since the last whole table
        self._rewrite_next = True  # the file may not say what _classes and _sessions say (yet)
        self._compare_all_next = True  # the table's `changed` may not name every change (yet)

    def load(self) -> SessionTable:
        """The table the file holds; empty when there is none or its first line cannot be read."""
        table = SessionTable()
        self._compare_all_next = True
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return table
        lines = data.splitlines()
        # A last line without its newline (cut short, or a file from before the journal) would
        # swallow the next change appended: the next save writes the file whole.
        self._rewrite_next = not data.endswith(b"\n")
        for number, line in enumerate(lines, 1):
            try:
                self._replay(json.loads(line), first=number == 1)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("%s line %d cannot be read (%s): the state up to it stands", self.path, number, exc)
                if number == 1:
                    self._classes, self._sessions = {}, {}
                self._rewrite_next = True
                break
        try:
            table.classes = {key: ClassMount(**record) for key, record in self._classes.items()}
            table.sessions = {
                mountpoint: Session(**record)
                for mountpoint, record in self._sessions.items()
                if record["class_key"] in table.classes
            }
        except (TypeError, KeyError) as exc:
            log.warning("%s holds a record this version cannot read (%s): starting empty", self.path, exc)
            self._classes, self._sessions = {}, {}
            return SessionTable()
        self._changes = len(lines) - 1
        return table

    def _replay(self, entry: dict[str, Any], first: bool) -> None:
        if first:
            self._classes = {c["key"]: dict(c) for c in entry["classes"]}
            self._sessions = {s["mountpoint"]: dict(s) for s in entry["sessions"]}
        elif "class" in entry:
            self._classes[entry["class"]["key"]] = dict(entry["class"])
        elif "class_gone" in entry:
            self._classes.pop(entry["class_gone"], None)
        elif "session" in entry:
            self._sessions[entry["session"]["mountpoint"]] = dict(entry["session"])
        elif "session_gone" in entry:
            self._sessions.pop(entry["session_gone"], None)
        else:
            raise KeyError(f"no known change in {sorted(entry)}")

    def save(self, table: SessionTable) -> None:
        """Write what changed in `table` since the last save (OSError when it cannot be written)."""
        changes: list[dict[str, Any]] = []
        self._diff(table.classes, self._classes, "class", changes)
        if self._compare_all_next:
            self._diff(table.sessions, self._sessions, "session", changes)
            self._compare_all_next = False
        else:  # only the sessions the table says changed: the others are as written
            self._diff(table.sessions, self._sessions, "session", changes, table.changed)
        table.changed.clear()
        if not changes and not self._rewrite_next:
            return
        limit = max(COMPACT_MIN_LINES, len(self._classes) + len(self._sessions))
        if self._rewrite_next or self._changes + len(changes) > limit:
            self._rewrite()
            return
        text = "".join(json.dumps(change) + "\n" for change in changes)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError:
            self._rewrite_next = True  # the file may hold part of the changes: write it whole next time
            raise
        self._changes += len(changes)

    @staticmethod
    def _diff(
        live: dict[str, Any],
        written: dict[str, dict[str, Any]],
        kind: str,
        out: list[dict[str, Any]],
        keys: set[str] | None = None,
    ) -> None:
        """The changes from `written` to `live` (among `keys` only, when given) into `out`."""
        for key in live if keys is None else [k for k in keys if k in live]:
            fields = vars(live[key])  # flat dataclasses: vars(), not asdict(), which deep-copies
            if written.get(key) != fields:
                written[key] = dict(fields)
                out.append({kind: fields})
        for key in (written.keys() - live.keys()) if keys is None else [k for k in keys if k not in live]:
            if written.pop(key, None) is not None:
                out.append({f"{kind}_gone": key})

    def _rewrite(self) -> None:
        table = {"classes": list(self._classes.values()), "sessions": list(self._sessions.values())}
        self._rewrite_next = True
        write_private_json(self.path, table)  # ends in a newline: change lines follow it
        self._rewrite_next = False
        self._changes = 0
