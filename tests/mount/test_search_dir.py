"""`--search-dir`: reading MOUNT/.search/<query> gives `chromafs search`'s answer for the
mount's reader; the directory is never listed, so find and grep -r never enter it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import BIN, SAMPLE_SITE, expected_visible, ingest, mounted, wait_until


def site_args(chroma: Path, secret_file: Path) -> list[str]:
    return ["--site", "acme", "--chroma-path", str(chroma), "--jwt-secret-file", str(secret_file)]


def chromafs_search(args: list[str], query: str) -> str:
    done = subprocess.run(
        [str(BIN / "chromafs"), "search", query, "-n", "20", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_reading_a_query_in_the_search_directory_searches_the_mounts_view(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    args = site_args(sample_chroma("public"), secret_file)
    admin_token = ["--token-file", str(token_file(["admin"]))]
    hidden = expected_visible(SAMPLE_SITE, "public", {"admin"}) - expected_visible(SAMPLE_SITE, "public", None)
    admin_page = sorted(p for p in hidden if p.startswith("admin/"))[0]
    query = (SAMPLE_SITE / admin_page).read_text().split("\n", 3)[1].removeprefix("title:").strip() or "audit log"
    anon, admin = tmp_path / "anon", tmp_path / "admin"
    with (
        mounted(anon, *args, "--search-dir", ".search"),
        mounted(admin, *args, *admin_token, "--search-dir", ".search"),
    ):
        for root, token in ((anon, []), (admin, admin_token)):
            answer = (root / ".search" / query).read_text()
            assert answer == chromafs_search([*args, *token], query)
            paths = {line.split(":", 1)[0] for line in answer.splitlines()}
            assert paths and paths <= expected_visible(SAMPLE_SITE, "public", {"admin"} if token else None)
        assert admin_page in (admin / ".search" / query).read_text()
        assert not hidden & {line.split(":", 1)[0] for line in (anon / ".search" / query).read_text().splitlines()}
        # never listed: ls -a, find and grep -r do not see it
        assert ".search" not in os.listdir(anon)
        listing = subprocess.run(["find", str(anon)], capture_output=True, text=True, check=True).stdout
        assert "/.search" not in listing
        grep = subprocess.run(["grep", "-rl", "api", str(anon)], capture_output=True, text=True).stdout
        assert grep and "/.search" not in grep
        assert (anon / ".search").is_dir() and os.listdir(anon / ".search") == []
        with pytest.raises(OSError) as written:
            (anon / ".search" / "new query").write_text("x")
        assert written.value.errno == errno.EROFS
    # without the flag there is no such directory
    with mounted(tmp_path / "plain", *args):
        assert not (tmp_path / "plain" / ".search").exists()
        with pytest.raises(FileNotFoundError):
            (tmp_path / "plain" / ".search" / query).read_text()


def test_the_search_directory_searches_the_tree_the_mount_shows_after_a_reingest(tmp_path: Path) -> None:
    """A re-ingest locks a page away from the anonymous reader: once the mount has switched (the
    page is gone from `ls`), the search directory's answer no longer names it."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", "acme", "--chroma-path", str(tmp_path / "chroma")]
    ingest(site, *backend, "--quiet")
    page = "guides/troubleshooting.md"
    query = "Troubleshooting common problems and how to fix them"
    mnt = tmp_path / "mnt"

    def found() -> set[str]:
        return {line.split(":", 1)[0] for line in (mnt / ".search" / query).read_text().splitlines()}

    with mounted(mnt, *backend, "--search-dir", ".search", "--refresh-interval", "0.3", "--preload", "off"):
        assert page in found()
        (site / page).write_text("---\ngroups: [admin]\n---\n" + (site / page).read_text())
        ingest(site, *backend, "--quiet")
        wait_until(lambda: page.split("/")[1] not in os.listdir(mnt / "guides"), 20, "the switch to the new tree")
        after = found()
        assert page not in after, "the search directory names a page the mount no longer shows"
        assert after and after <= expected_visible(site, "public", None)


def test_a_view_ranks_its_pages_by_the_words_of_the_version_it_shows(tmp_path: Path) -> None:
    """Two mounts that stay on their tree (no refresh) while a re-ingest adds a word to a page and
    locks it away: searched for that word, the mount that first searches after the re-ingest
    ranks the page no higher than the one that searched before it (the lexicon's entry for
    another version of a page is not that page's: the new words rank nothing in the old view)."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", "acme", "--chroma-path", str(tmp_path / "chroma")]
    ingest(site, *backend, "--quiet")
    page = "guides/troubleshooting.md"
    word = "quokkavortle"
    early, late = tmp_path / "early", tmp_path / "late"
    options = ["--search-dir", ".search", "--refresh-interval", "0", "--preload", "off"]
    with mounted(early, *backend, *options), mounted(late, *backend, *options):
        before = (early / ".search" / word).read_text()
        text = (site / page).read_text()
        (site / page).write_text(f"---\ngroups: [admin]\n---\n{text}\n{word} {word} {word}\n")
        ingest(site, *backend, "--quiet")
        assert (late / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()  # still the old tree
        after = (late / ".search" / word).read_text()
    assert word not in after
    ranks = [[line.split(":", 1)[0] for line in answer.splitlines()] for answer in (before, after)]
    assert page in ranks[0]
    assert page not in ranks[1][: ranks[0].index(page) + 1], (ranks[0], ranks[1])
