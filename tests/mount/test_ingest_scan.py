"""Reading a docs folder: one bad file never stops a site, every problem is named (no FUSE)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from chromafs_fuse.ingest.access_rules import Access
from chromafs_fuse.ingest.scan import HIDDEN, INGESTED, NOT_INGESTED, ScanOptions, scan_site
from infra import INGEST


def scan(root: Path, **kwargs: object) -> tuple[dict[str, Access], dict[str, tuple[str, str, int | None]]]:
    result = scan_site(ScanOptions(root, **kwargs))  # type: ignore[arg-type]
    files = {f.key: f.access for f in result.files}
    problems = {p.path: (p.reason, p.outcome, p.line) for p in result.problems}
    return files, problems


def test_symbolic_links(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "real").mkdir(parents=True)
    (site / "real" / "page.md").write_text("page\n")
    outside = tmp_path / "outside.md"
    outside.write_text("a file that is not part of the site\n")
    os.symlink("real", site / "linked")  # a folder inside the site: walked under the link's name
    os.symlink("page.md", site / "real" / "alias.md")
    os.symlink(str(outside), site / "escape.md")  # leaves the site: never read
    os.symlink("missing.md", site / "broken.md")
    os.symlink("..", site / "real" / "up")  # a loop
    os.symlink("self", site / "self")  # a link to itself
    files, problems = scan(site)
    assert set(files) == {"real/page.md", "real/alias.md", "linked/page.md", "linked/alias.md"}
    assert problems["escape.md"][0].startswith("symbolic link leaves the source folder")
    assert problems["broken.md"][0] == "broken symbolic link"
    assert "loop" in problems["real/up"][0] and "loop" in problems["self"][0]
    assert all(outcome == NOT_INGESTED for _, outcome, _ in problems.values())


def test_bad_bytes_and_bad_frontmatter_do_not_stop_the_site(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "good.md").write_text("---\ntitle: fine\n---\ntext\n")
    (site / "latin1.md").write_bytes(b"---\ngroups: [admin]\n---\ncaf\xe9\n")
    (site / "broken.md").write_text("---\ntitle: x\ngroups: [admin\n---\nsecret\n")
    (site / "title.md").write_text("---\ntitle: `code`\n---\nbody\n")
    files, problems = scan(site)
    assert files["good.md"] == Access(True)
    assert files["latin1.md"] == Access(False, ("admin",)), "access read even when the bytes are not UTF-8"
    assert problems["latin1.md"] == ("not UTF-8 (byte 27): kept as a binary file, served byte for byte", INGESTED, 4)
    assert "broken.md" not in files and problems["broken.md"][1] == HIDDEN and problems["broken.md"][2] == 4
    assert files["title.md"] == Access(True) and problems["title.md"][1] == INGESTED


def test_a_nul_byte_never_makes_a_page_more_visible(tmp_path: Path) -> None:
    """LangChain's pymupdf.md has a NUL in a pasted author line: its frontmatter still decides."""
    site = tmp_path / "site"
    site.mkdir()
    locked = b"---\ntitle: PyMuPDF\npublic: false\ngroups: [admin]\n---\nby Jane\x00Doe\n"
    (site / "locked.md").write_bytes(locked)
    (site / "private.mdx").write_bytes(b"---\npublic: false\n---\n\x00\xff\xfe body\n")
    (site / "nul-in-keys.md").write_bytes(b"---\ngroups: [ad\x00min]\n---\nbody\n")
    (site / "data.bin").write_bytes(b"\x00\x01 not a page")
    result = scan_site(ScanOptions(site, default_access="public"))
    files = {f.key: f for f in result.files}
    problems = {p.path: (p.reason, p.outcome, p.line) for p in result.problems}
    assert files["locked.md"].access == Access(False, ("admin",))
    assert files["locked.md"].text == locked.decode(), "served as it is, from chunks"
    assert problems["locked.md"] == ("has a NUL byte: served as it is", INGESTED, 6)
    assert files["private.mdx"].access == Access(False) and files["private.mdx"].text is None
    assert "nul-in-keys.md" not in files and problems["nul-in-keys.md"][1:] == (HIDDEN, 2)
    assert "U+0000 is not allowed" in problems["nul-in-keys.md"][0]
    assert files["data.bin"].text is None and "data.bin" not in problems


def test_unreadable_and_vanished_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "stays.md").write_text("stays\n")
    (site / "goes.md").write_text("goes\n")
    (site / "fifo").mkdir()
    os.mkfifo(site / "fifo" / "pipe.md")
    real_open = open

    def vanishing_open(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("goes.md"):
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", vanishing_open)
    files, problems = scan(site)
    assert set(files) == {"stays.md"}
    assert problems["goes.md"][0] == "cannot read: vanished before it was read"
    assert problems["fifo/pipe.md"][0] == "not a regular file"


def run_ingest(source: Path, chroma: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INGEST, str(source), "--site", "acme", "--chroma-path", str(chroma), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_exit_status_and_report(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "ok.md").write_text("fine\n")
    chroma = tmp_path / "chroma"
    clean = run_ingest(site, chroma, "--report", str(tmp_path / "clean.json"))
    assert clean.returncode == 0, clean.stderr
    assert json.loads((tmp_path / "clean.json").read_text())["status"] == "clean"

    (site / "broken.md").write_text("---\npublic: maybe\n---\n")
    (site / "docs.json").write_text('{"navigation": {"pages": ["ok",]}}')
    report_path = tmp_path / "report.json"
    errors = run_ingest(site, chroma, "--report", str(report_path))
    assert errors.returncode == 3, errors.stderr
    assert "error: broken.md:2: frontmatter: 'public' must be true or false, not \"maybe\" (hidden from everyone)" in (
        errors.stderr
    )
    report = json.loads(report_path.read_text())
    assert report["status"] == "finished with errors" and report["exit_status"] == 3 and report["pages"] == 2
    by_path = {p["path"]: p for p in report["problems"]}
    assert by_path["broken.md"] == {
        "path": "broken.md",
        "reason": "frontmatter: 'public' must be true or false, not \"maybe\"",
        "outcome": HIDDEN,
        "line": 2,
        "severity": "error",
    }
    assert by_path["docs.json"]["severity"] == "warning"

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = run_ingest(empty, chroma, "--report", str(tmp_path / "empty.json"))
    assert nothing.returncode == 4 and "nothing ingested" in nothing.stderr
    assert json.loads((tmp_path / "empty.json").read_text())["status"] == "nothing ingested"
    # the site was left as it was
    again = run_ingest(site, chroma, "--quiet")
    assert again.returncode == 3 and "unchanged" not in again.stdout
    summary = run_ingest(site, chroma)
    assert "pages: 2 (0 written, 2 unchanged, 0 removed)" in summary.stdout
