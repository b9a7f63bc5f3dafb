"""Docs trees of several ecosystems (tests/data/sites) and the real repositories in shared/corpora:
each ingests in one run and mounts byte-exact for an anonymous reader and an admin."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from infra import CORPORA, INGEST, REPO, expand, mounted, need_corpus, source_files

SITES = REPO / "tests" / "data" / "sites"
EXPECTED = yaml.safe_load((REPO / "tests" / "data" / "sites.yaml").read_text())


def mounted_files(root: Path) -> dict[str, bytes]:
    """Every file on the mount, read with the real `find` and `cat`."""
    listing = subprocess.run(["find", ".", "-type", "f"], cwd=root, capture_output=True, check=True, timeout=300)
    names = sorted(line[2:] for line in listing.stdout.decode("utf-8").splitlines())
    return {name: subprocess.run(["cat", name], cwd=root, capture_output=True, check=True).stdout for name in names}


def ingest_site(source: Path, chroma: Path, report: Path, *args: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [INGEST, str(source), "--site", "acme", "--chroma-path", str(chroma), "--report", str(report), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode in (0, 3), proc.stderr
    return proc.returncode, json.loads(report.read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_docs_tree_ingests_and_mounts_byte_exact(
    name: str, tmp_path: Path, mnt: Path, token_file: Callable[..., Path], secret_file: Path
) -> None:
    expected = EXPECTED[name]
    source = SITES / name
    files = source_files(source)
    status, report = ingest_site(source, tmp_path / "chroma", tmp_path / "report.json", *expected["args"])
    errors = {p["path"] for p in report["problems"] if p["severity"] == "error"}  # type: ignore[union-attr,index]
    assert status == expected["exit"] and errors == set(expected["errors"]), report["problems"]
    everything = set(files)
    anonymous = expand(expected["anonymous"], everything, errors)
    admin = expand(expected["admin"], everything, errors)
    backend = ["--site", "acme", "--chroma-path", str(tmp_path / "chroma")]
    admin_token = ["--token-file", str(token_file(["admin"])), "--jwt-secret-file", str(secret_file)]
    for who, extra, visible in (("anonymous", [], anonymous), ("admin", admin_token, admin)):
        with mounted(mnt, *backend, *extra):
            seen = mounted_files(mnt)
        assert set(seen) == visible, f"{who} sees the wrong pages"
        for key, data in seen.items():
            assert data == files[key].read_bytes(), f"{who}: {key} differs from its source"


@pytest.mark.parametrize("corpus", sorted(p.name for p in CORPORA.iterdir()) if CORPORA.is_dir() else ["(none)"])
def test_real_repository_ingests_in_one_run(
    corpus: str, tmp_path: Path, mnt: Path, token_file: Callable[..., Path], secret_file: Path
) -> None:
    """A whole real docs repository: every file that is not reported is on the admin's mount, byte-exact;
    the anonymous reader sees a subset and no page whose frontmatter names groups."""
    source = need_corpus(CORPORA / corpus)
    files = source_files(source)
    _, report = ingest_site(source, tmp_path / "chroma", tmp_path / "report.json")
    not_served = {p["path"] for p in report["problems"] if p["severity"] == "error"}  # type: ignore[union-attr,index]
    assert report["pages"] == len(files) - len(not_served)
    backend = ["--site", "acme", "--chroma-path", str(tmp_path / "chroma")]
    admin_token = ["--token-file", str(token_file(["admin"])), "--jwt-secret-file", str(secret_file)]
    with mounted(mnt, *backend, *admin_token):
        admin = mounted_files(mnt)
    assert set(admin) == set(files) - not_served
    for key, data in admin.items():
        assert data == files[key].read_bytes(), key
    with mounted(mnt, *backend):
        anonymous = set(mounted_files(mnt))
    assert anonymous <= set(admin)
    grouped = {
        key
        for key, path in files.items()
        if key.endswith((".md", ".mdx"))
        and (text := path.read_text("utf-8", "replace")).startswith("---\n")
        and any(line.startswith("groups:") for line in text.split("\n---", 1)[0].splitlines())
    }
    assert not anonymous & grouped
