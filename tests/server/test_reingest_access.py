"""A re-ingest keeps an unchanged page's access without reading its frontmatter again, only while
everything else its access is decided from stays the same (the site default, the --acl rules, a
navigation file's public groups): change any of these and every page is decided anew, so a page
whose bytes did not change is hidden or shown as the new inputs say."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from infra import INGEST, SAMPLE_SITE, child_env, mounted

PAGE = "guides/migration.mdx"  # no access keys of its own: public through docs.json's "Migration" group


def ingest(source: Path, chroma: Path, report: Path, *more: str) -> dict[str, Any]:
    argv = [INGEST, str(source), "--site", "acme", "--chroma-path", str(chroma), "--report", str(report), "--quiet"]
    done = subprocess.run([*argv, *more], capture_output=True, text=True, timeout=600, env=child_env())
    assert done.returncode in (0, 1), done.stderr  # 1: the sample site's own problems
    return json.loads(report.read_text())


def anonymous_sees(chroma: Path, mountpoint: Path) -> bool:
    with mounted(mountpoint, "--site", "acme", "--chroma-path", str(chroma), "--no-mountd", "--refresh-interval", "0"):
        return (mountpoint / PAGE).exists()


def navigation_public(source: Path, public: bool) -> None:
    docs = json.loads((source / "docs.json").read_text())
    [group] = [g for g in docs["navigation"]["groups"] if g["group"] == "Migration"]
    group["public"] = public
    (source / "docs.json").write_text(json.dumps(docs))


def test_an_unchanged_page_keeps_its_access_until_what_decides_it_changes(tmp_path: Path) -> None:
    source = Path(shutil.copytree(SAMPLE_SITE, tmp_path / "site"))
    chroma, report = tmp_path / "chroma", tmp_path / "report.json"
    first = ingest(source, chroma, report, "--default-access", "authenticated")
    assert first["access_kept"] == 0
    assert anonymous_sees(chroma, tmp_path / "m1")

    again = ingest(source, chroma, report, "--default-access", "authenticated")
    assert (again["written"], again["not_read"], again["access_kept"]) == (0, first["pages"], 0), again
    again = ingest(source, chroma, report, "--default-access", "authenticated", "--checksum")  # every file read
    assert (again["written"], again["not_read"], again["access_kept"]) == (0, 0, first["pages"]), again

    navigation_public(source, False)  # the page's bytes stay; the group that made it public does not
    hidden = ingest(source, chroma, report, "--default-access", "authenticated")
    assert hidden["access_kept"] == 0
    assert not anonymous_sees(chroma, tmp_path / "m2")

    navigation_public(source, True)
    ingest(source, chroma, report, "--default-access", "authenticated")
    shown = ingest(source, chroma, report, "--default-access", "public")  # the default changed: decided anew
    assert shown["access_kept"] == 0
    assert anonymous_sees(chroma, tmp_path / "m3")
