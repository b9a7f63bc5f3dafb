"""No byte in a Markdown page's body makes the page more visible than its frontmatter says,
and the page is served as the bytes of its file.

First a property over the scan (no FUSE, many generated bodies), then the same claim end to
end: real ingest into an embedded Chroma, a real mount as an anonymous reader and as an admin.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chromafs_fuse.ingest.access_rules import Access
from chromafs_fuse.ingest.scan import HIDDEN, ScanOptions, SourceFile, scan_site
from infra import INGEST, mounted, run

SUFFIXES = (".md", ".mdx", ".markdown")

LOCKED_FRONTMATTER = "---\ntitle: t\npublic: false\ngroups: [admin]\n---\n"
PUBLIC_FRONTMATTER = "---\ntitle: t\npublic: true\n---\n"

# Bytes that have fooled, or could fool, a reader of the page: NUL, invalid UTF-8, line ends
# of every kind, fences of each frontmatter format, a BOM, control bytes, access keys.
DANGEROUS = (
    b"\x00",
    b"\xff\xfe",
    b"\xff",
    b"\xc3",  # a truncated two-byte sequence
    b"\xed\xa0\x80",  # an encoded surrogate
    b"\r",
    b"\r\n",
    b"\n",
    b"---\n",
    b"\n---\n",
    b"---\r\n",
    b"+++\n",
    b"\n+++\n",
    b"...\n",
    b"\xef\xbb\xbf",
    b"\x1b[31m",
    b"\x7f",
    b"\x0b\x0c\x1c\x1d\x1e\x85",
    b"\xc2\x85\xe2\x80\xa8\xe2\x80\xa9",  # NEL, LINE and PARAGRAPH SEPARATOR
    b"public: true\n",
    b"groups: []\n",
    b'{"public": true}\n',
    b"public = true\n",
    b"\t",
    b" ",
)

bodies = st.lists(st.one_of(st.binary(max_size=48), st.sampled_from(DANGEROUS)), max_size=24).map(b"".join)


def scan_one(suffix: str, data: bytes) -> tuple[str, dict[str, SourceFile], list[tuple[str, str, str]]]:
    """Scan a fresh site holding one page; (its key, files by key, problems)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key = f"page{suffix}"
        (root / key).write_bytes(data)
        result = scan_site(ScanOptions(root, default_access="public"), workers=1)
    files = {f.key: f for f in result.files}
    problems = [(p.path, p.reason, p.outcome) for p in result.problems]
    return key, files, problems


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(suffix=st.sampled_from(SUFFIXES), newline=st.sampled_from(["\n", "\r\n"]), body=bodies)
def test_no_body_makes_a_locked_page_visible(suffix: str, newline: str, body: bytes) -> None:
    data = LOCKED_FRONTMATTER.replace("\n", newline).encode() + body
    key, files, problems = scan_one(suffix, data)
    assert set(files) <= {key}
    if key in files:  # absent is fine: hidden from everyone
        page = files[key]
        assert page.access == Access(False, ("admin",)), (page.access, problems)
        assert page.data == data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(suffix=st.sampled_from(SUFFIXES), newline=st.sampled_from(["\n", "\r\n"]), body=bodies)
def test_no_body_changes_a_public_page(suffix: str, newline: str, body: bytes) -> None:
    data = PUBLIC_FRONTMATTER.replace("\n", newline).encode() + body
    key, files, problems = scan_one(suffix, data)
    assert set(files) <= {key}
    if key in files:
        page = files[key]
        assert page.access == Access(True), (page.access, problems)
        assert page.data == data
    else:
        assert any(path == key and outcome == HIDDEN for path, _, outcome in problems), problems


# -- end to end ----------------------------------------------------------------------------

NASTY_BODIES = {
    "nul": b"by Jane\x00Doe\n",
    "not-utf8": b"\xff\xfe body\n",
    "lone-cr": b"one\rtwo\rthree",
    "crlf": b"first\r\nsecond\r\n",
    "yaml-fence": b"---\npublic: true\ngroups: []\n---\nopen?\n",
    "toml-fence": b"+++\npublic = true\n+++\n",
    "bom": b"\xef\xbb\xbf---\npublic: true\n---\n",
    "controls": bytes(range(32)) + b"\x7f\x1b[0m\n",
    "mixture": b"\x00\xff\r\n---\r\n+++\r\xef\xbb\xbf\x1b[31m\x00public: true\n",
    "empty": b"",
}


def nasty_site(root: Path) -> dict[str, bytes]:
    """The locked pages (relative path -> bytes); a public page beside them keeps the folder listed."""
    (root / "locked").mkdir(parents=True)
    (root / "locked" / "open.md").write_text("---\npublic: true\n---\nanyone\n")
    (root / "index.md").write_text("home\n")
    pages = {}
    for i, (name, body) in enumerate(NASTY_BODIES.items()):
        rel = f"locked/{name}{SUFFIXES[i % len(SUFFIXES)]}"
        data = LOCKED_FRONTMATTER.encode() + body
        (root / rel).write_bytes(data)
        pages[rel] = data
    return pages


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60)


def test_nasty_pages_mounted_for_anonymous_and_admin(
    tmp_path: Path, mnt: Path, token_file: Callable[..., Path], secret_file: Path
) -> None:
    site = tmp_path / "site"
    pages = nasty_site(site)
    chroma = tmp_path / "chroma"
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [INGEST, str(site), "--site", "acme", "--chroma-path", str(chroma), "--quiet", "--report", str(report_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 3), proc.stderr
    report = json.loads(report_path.read_text())
    errors = {p["path"] for p in report["problems"] if p["severity"] == "error"}
    served = set(pages) - errors
    assert {"locked/nul.md", "locked/not-utf8.mdx"} <= served, report["problems"]
    args = ["--site", "acme", "--chroma-path", str(chroma)]

    with mounted(mnt, *args):
        listing = run(["ls", "-A", str(mnt / "locked")])
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.split() == ["open.md"]
        assert cat(mnt / "locked" / "open.md").stdout == b"---\npublic: true\n---\nanyone\n"
        for rel in pages:
            read = cat(mnt / rel)
            assert read.returncode != 0 and b"No such file or directory" in read.stderr, (rel, read)
            assert read.stdout == b""

    admin = ["--token-file", str(token_file(["admin"])), "--jwt-secret-file", str(secret_file)]
    with mounted(mnt, *args, *admin):
        names = run(["ls", str(mnt / "locked")]).stdout.split()
        for rel, data in pages.items():
            if rel not in served:
                continue
            assert rel.split("/")[1] in names
            read = cat(mnt / rel)
            assert read.returncode == 0, (rel, read.stderr)
            assert read.stdout == data, rel
