"""How ingest derives access from frontmatter, --acl rules, docs.json and the default."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.ingest.access_rules import (
    Access,
    AccessSpecError,
    access_from_fields,
    match_acl,
    parse_acl,
    public_pages_from_navigation,
)
from infra import INGEST, SAMPLE_SITE, Backend, ingest, mounted, reader_args, tree_listing


def test_access_fields() -> None:
    assert access_from_fields({"title": "x"}, "p") is None
    assert access_from_fields({"groups": ["a", "b"]}, "p") == Access(False, ("a", "b"))
    assert access_from_fields({"groups": "a, b"}, "p") == Access(False, ("a", "b"))
    with pytest.raises(AccessSpecError):
        access_from_fields({"public": "yes"}, "p")


def test_navigation_and_acl_rules() -> None:
    nav = {
        "navigation": {
            "tabs": [
                {
                    "tab": "Docs",
                    "groups": [
                        {"group": "Open", "public": True, "pages": ["index", {"group": "Nested", "pages": ["a/b"]}]},
                        {"group": "Closed", "pages": ["secret"]},
                    ],
                }
            ]
        }
    }
    assert public_pages_from_navigation(json.dumps(nav)) == {"index", "a/b"}
    rules = parse_acl("- glob: 'openapi/*'\n  public: true\n- glob: internal/\n  groups: [admin]\n", "acl.yaml")
    assert match_acl(rules, "openapi/spec.json") == Access(True)
    assert match_acl(rules, "internal/deep/x.json") == Access(False, ("admin",))
    assert match_acl(rules, "other.json") is None
    with pytest.raises(AccessSpecError):
        parse_acl("- glob: x\n", "acl.yaml")


def test_acl_file_and_unreadable_frontmatter_end_to_end(
    tmp_path: Path, mnt: Path, token_file: Callable[..., Path], secret_file: Path
) -> None:
    site = tmp_path / "site"
    (site / "specs").mkdir(parents=True)
    (site / "specs" / "public.json").write_text('{"a": 1}\n')
    (site / "specs" / "admin.yaml").write_text("a: 1\n")
    (site / "open.md").write_text("plain page\n")
    (site / "broken.md").write_text("---\ngroups: [admin\n---\nsecret\n")
    (site / ".hidden.md").write_text("dot file\n")
    acl = tmp_path / "acl.json"
    acl.write_text(
        json.dumps([{"glob": "specs/public.json", "public": True}, {"glob": "specs/*", "groups": ["admin"]}])
    )
    backend = Backend("acme", tmp_path / "chroma").args
    proc = ingest(site, *backend, "--acl", str(acl), "--default-access", "authenticated", status=3)
    assert "error: broken.md:3: frontmatter not valid YAML" in proc.stderr
    assert "(hidden from everyone)" in proc.stderr
    with mounted(mnt, *backend):
        assert tree_listing(mnt) == {"specs", "specs/public.json"}
    admin = reader_args(token_file(["admin"]), secret_file)
    with mounted(mnt, *backend, *admin):
        assert tree_listing(mnt) == {"specs", "specs/public.json", "specs/admin.yaml", "open.md"}


@pytest.mark.parametrize("name", ["ra", "-docs", "docs-", "my docs", "x" * 513])
def test_a_site_name_chroma_cannot_store_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    chroma = tmp_path / "chroma"
    proc = subprocess.run(
        [INGEST, str(SAMPLE_SITE), f"--site={name}", "--chroma-path", str(chroma), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "collection name" in proc.stderr and "3-512" in proc.stderr
    assert not chroma.exists(), "nothing may be written for a refused name"
