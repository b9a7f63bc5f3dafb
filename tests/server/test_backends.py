"""Both backends, foreign collections, corrupt pages, re-ingest and a real docs site."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from infra import (
    CORPORA,
    SAMPLE_SITE,
    Backend,
    copy_subset,
    expected_visible,
    ingest,
    kernel_open_mode,
    mounted,
    need_corpus,
    reader_args,
    run,
)

MINTLIFY = CORPORA / "mintlify-docs"


def test_chroma_server_backend(chroma_server, mnt: Path, tmp_path: Path, token_file, secret_file: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(
        SAMPLE_SITE,
        "--site",
        "acme",
        "--chroma-url",
        chroma_server.url,
        "--blob-store",
        (tmp_path / "blobs").as_uri(),
        "--quiet",
    )
    for groups in (None, ["billing"]):
        visible = expected_visible(SAMPLE_SITE, "public", None if groups is None else set(groups))
        copy = copy_subset(SAMPLE_SITE, visible, tmp_path / f"expected-{groups}")
        token_args = [] if groups is None else reader_args(token_file(groups), secret_file)
        with mounted(mnt, "--site", "acme", "--chroma-url", chroma_server.url, *token_args):
            diff = run(["diff", "-r", str(copy), str(mnt)])
            assert diff.returncode == 0, diff.stdout + diff.stderr


def _minimal_collection(
    path: Path,
    name: str,
    tree_document: str,
    records: list[tuple[str, int, str]],
    page_field: str = "page_slug",
    index_field: str = "chunk_index",
) -> None:
    """Write a collection the way the reference design and other tools do, with plain chromadb calls."""
    client = chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))
    collection = client.create_collection(name, embedding_function=None)
    ids = [f"{slug}-{i}-{n}" for n, (slug, i, _) in enumerate(records)]
    collection.add(
        ids=ids,
        documents=[r[2] for r in records],
        metadatas=[{page_field: r[0], index_field: r[1]} for r in records],
        embeddings=[[float(n % 7), 1.0, 0.5] for n in range(len(records))],
    )
    collection.add(ids=["__path_tree__"], documents=[tree_document], embeddings=[[0.0, 0.0, 0.0]])


PAGES = {
    "intro.md": ["# Intro", "Welcome to the minimal site.", ""],
    "guide/setup.mdx": ["---\ntitle: Setup\n---", "## Install\n\nRun the installer.", "## Verify\nDone."],
    "guide/deep/nested.txt": ["only one chunk, no newline at end"],
    "secret/plan.md": ["# Plan", "the hidden plan"],
}


@pytest.mark.parametrize("variant", ["plain-json-leading-slash", "gzip-base64-custom-fields"])
@pytest.mark.expect_log(r"(ERROR|WARNING) .*page broken\.md (is corrupt|failed its checks)")
def test_minimal_reference_format_mounts_and_reads(variant: str, mnt: Path, tmp_path: Path) -> None:
    tree = {
        ("/" + k if variant.startswith("plain") else k): {"isPublic": not k.startswith("secret"), "groups": []}
        for k in PAGES
    }
    tree["broken.md"] = {"isPublic": True, "groups": []}
    if variant.startswith("plain"):
        document, fields = json.dumps(tree), ("page_slug", "chunk_index")
    else:
        document = base64.b64encode(gzip.compress(json.dumps(tree).encode())).decode()
        fields = ("page", "idx")
    records = [(k, i, text) for k, chunks in PAGES.items() for i, text in enumerate(chunks)]
    records += [("broken.md", 0, "first"), ("broken.md", 2, "third")]  # chunk 1 is missing
    _minimal_collection(tmp_path / "chroma", "minimal", document, records, *fields)
    args = [
        "--site",
        "minimal",
        "--chroma-path",
        str(tmp_path / "chroma"),
        "--page-field",
        fields[0],
        "--chunk-index-field",
        fields[1],
    ]
    with mounted(mnt, *args):
        assert kernel_open_mode(mnt) == "per open"  # unknown sizes: the kernel must not cache pages
        assert sorted(run(["find", ".", "-type", "f"], cwd=mnt).stdout.split()) == sorted(
            ["./broken.md", "./intro.md", "./guide/setup.mdx", "./guide/deep/nested.txt"]
        )
        # no sizes in the tree: grep must still see every byte of a never-read page
        grep = run(["grep", "-rn", "Verify", "."], cwd=mnt)
        assert "./guide/setup.mdx:7:## Verify" in grep.stdout
        for key, chunks in PAGES.items():
            if key.startswith("secret"):
                assert not (mnt / key).exists()
                continue
            expected = "\n".join(chunks).encode()
            assert (mnt / key).read_bytes() == expected
            assert os.stat(mnt / key).st_size == len(expected)  # learned on first read
        with pytest.raises(OSError) as info:
            (mnt / "broken.md").read_bytes()
        assert info.value.errno == 5  # EIO, not wrong bytes
        assert (mnt / "intro.md").read_bytes().startswith(b"# Intro")  # the daemon is still fine
    log = (mnt.parent / "mnt.log").read_text()
    assert "broken.md" in log and "gaps" in log


def test_custom_joiner(mnt: Path, tmp_path: Path) -> None:
    tree = json.dumps({"a.md": {"isPublic": True, "groups": []}})
    _minimal_collection(tmp_path / "chroma", "joined", tree, [("a.md", 0, "one"), ("a.md", 1, "two")])
    with mounted(mnt, "--site", "joined", "--chroma-path", str(tmp_path / "chroma"), "--chunk-joiner", ""):
        assert (mnt / "a.md").read_bytes() == b"onetwo"


def test_reingest_updates_in_place_and_never_mixes_versions(mnt: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(SAMPLE_SITE, site)
    chroma = tmp_path / "chroma"
    backend = Backend("acme", chroma).args
    ingest(site, *backend, "--quiet")
    old_mnt = tmp_path / "old"
    old_mnt.mkdir()
    changed = site / "quickstart.mdx"
    old_bytes = changed.read_bytes()
    with mounted(old_mnt, *backend, "--refresh-interval", "0"):
        changed.write_bytes(old_bytes.replace(b"Quickstart", b"Quick start v2") + b"\nA new closing line.\n")
        (site / "changelog.md").unlink()
        (site / "guides" / "brand-new.md").write_text("---\npublic: true\n---\n# New page\n")
        second = ingest(site, *backend)
        assert "1 removed" in second.stdout and "unchanged" in second.stdout
        assert "old page versions: 2 kept for running mounts, 0 deleted" in second.stdout
        # a mount still on the old tree reads the replaced versions within the grace period
        assert (old_mnt / "quickstart.mdx").read_bytes() == old_bytes
        assert (old_mnt / "changelog.md").read_bytes() == (SAMPLE_SITE / "changelog.md").read_bytes()
        with mounted(mnt, *backend):
            visible = expected_visible(site, "public", None)
            copy = copy_subset(site, visible, tmp_path / "expected")
            diff = run(["diff", "-r", str(copy), str(mnt)])
            assert diff.returncode == 0, diff.stdout
            assert not (mnt / "changelog.md").exists()
    # the next ingest after the grace period deletes the retired versions
    third = ingest(site, *backend, "--grace-period", "0")
    assert "pages: " in third.stdout and "old page versions: 0 kept for running mounts, 2 deleted" in third.stdout
    client = chromadb.PersistentClient(path=str(chroma), settings=Settings(anonymized_telemetry=False))
    records = client.get_collection("acme", embedding_function=None).get(include=["metadatas"])
    pages = {m.get("page_slug") for m in records["metadatas"] if m.get("page_slug")}
    assert "changelog.md" not in pages
    shas = {(m["page_slug"], m["page_sha256"]) for m in records["metadatas"] if m.get("page_slug")}
    assert len(shas) == len(pages), "stale chunks of an old page version were left behind"


def test_a_mount_on_the_old_tree_reads_replaced_pages_from_chroma_during_the_grace_period(
    mnt: Path, tmp_path: Path
) -> None:
    """A mount that does not follow re-ingests (--refresh-interval 0) keeps its tree. Two pages it
    never read are replaced by a re-ingest, then another page by a second one, both well within
    the grace period (--grace-period, 600 s by default): the first read of each replaced page,
    one after each ingest, is its old version exactly, reassembled from the chunks kept in Chroma
    (no preload, no read-ahead: nothing of them was in memory before)."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", "acme", "--chroma-path", str(tmp_path / "chroma")]
    ingest(site, *backend, "--quiet")
    first, second, third = "quickstart.mdx", "guides/troubleshooting.md", "concepts/glossary.md"
    old = {key: (site / key).read_bytes() for key in (first, second)}

    def read(key: str) -> bytes | str:
        try:
            return (mnt / key).read_bytes()
        except OSError as exc:
            return f"{key}: {exc.strerror}"

    with mounted(mnt, *backend, "--refresh-interval", "0", "--preload", "off", "--readahead-pages", "0"):
        for key in (first, second):
            (site / key).write_bytes(old[key].replace(b"the", b"THE") + b"\nRewritten by a re-ingest.\n")
        ingest(site, *backend, "--quiet")
        assert read(first) == old[first], "the replaced version, read after the ingest"
        (site / third).write_bytes((site / third).read_bytes() + b"\nAnother change.\n")
        ingest(site, *backend, "--quiet")
        assert read(second) == old[second], "the replaced version, read after a second ingest"
    with mounted(mnt, *backend, "--preload", "off"):
        for key in (first, second, third):
            assert read(key) == (site / key).read_bytes(), f"a new mount: {key}"


def test_real_docs_site_ingests_and_mounts_byte_for_byte(mnt: Path, tmp_path: Path) -> None:
    need_corpus(MINTLIFY)
    chroma = tmp_path / "chroma"
    ingest(MINTLIFY, "--site", "mintlify", "--chroma-path", str(chroma), "--quiet")
    with mounted(mnt, "--site", "mintlify", "--chroma-path", str(chroma)):
        diff = run(["diff", "-r", str(MINTLIFY), str(mnt)])
        assert diff.returncode == 0, diff.stdout[:2000] + diff.stderr[:2000]
        for cmd in (["grep", "-rlc", "openapi", "."], ["rg", "-l", "--sort", "path", "(?i)mcp server", "."]):
            on_mount, on_source = run(cmd, cwd=mnt).stdout, run(cmd, cwd=MINTLIFY).stdout
            assert on_mount and sorted(on_mount.splitlines()) == sorted(on_source.splitlines())


def test_token_never_reaches_the_daemon_command_line_environment_or_log(
    sample_backend: Callable[..., Backend], make_token: Callable[..., str], secret_file: Path, mnt: Path
) -> None:
    token = make_token(["admin"])
    with mounted(mnt, *sample_backend().args, "--token", token, "--jwt-secret-file", str(secret_file)):
        assert (mnt / "internal" / "billing.mdx").exists()
        pid = int((mnt.parent / "mnt.pid").read_text())
        assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert token.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert token not in ps
    assert token not in (mnt.parent / "mnt.log").read_text()


def test_reingest_moves_a_file_between_blob_store_and_chunks(mnt: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "specs").mkdir(parents=True)
    spec = site / "specs" / "big.json"
    spec.write_text('{"a": "' + "x" * 5000 + '"}\n')
    backend = Backend("acme", tmp_path / "chroma").args
    for threshold in ("1000", "100000", "1000"):  # blob, then chunks, then blob again
        ingest(site, *backend, "--large-file-threshold", threshold, "--quiet")
        with mounted(mnt, *backend):
            assert (mnt / "specs" / "big.json").read_bytes() == spec.read_bytes(), threshold
