"""The ingest's spooled lexicon rows give back what was put, text and pages alike."""

from __future__ import annotations

from chromafs_fuse.ingest.spooled_rows import SpooledRows
from chromafs_fuse.lexical import LexiconPage, encode_row


def test_rows_come_back_as_they_were_put() -> None:
    rows = SpooledRows()
    waiting = LexiconPage("sha-b", {"beta": 1}, None, {})
    rows["a.md"] = encode_row(LexiconPage("sha-a", {"été": 2}, "AAEC", {"guide": 1}))
    rows["b.md"] = waiting
    rows["c/d.md"] = "x" * 70_000
    assert rows["a.md"] == '["sha-a",{"été":2},"AAEC",{"guide":1}]' and rows["b.md"] is waiting
    rows["a.md"] = encode_row(LexiconPage("sha-a2", {}, None, {}))  # replaced: the new text
    assert rows["a.md"] == '["sha-a2",{},null,{}]' and rows["c/d.md"] == "x" * 70_000
    assert list(rows) == ["a.md", "b.md", "c/d.md"] and rows.pop("b.md") is waiting and len(rows) == 2
    rows.close()
