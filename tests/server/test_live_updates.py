"""A running mount follows a re-ingest: edited pages show their new bytes, removed pages and
pages locked away are gone (ENOENT), new pages and folders appear, unchanged paths keep their
inode, and the kernel's long caches are told what changed. Embedded Chroma, and with Redis."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.tree import tree_version
from infra import (
    BIN,
    SAMPLE_SITE,
    ChromaServer,
    MountServer,
    expected_visible,
    free_port,
    ingest,
    mounted,
    reader_args,
    redis_subscribed,
    try_mount,
    unmount,
    wait_until,
)

SITE = "live"
DEADLINE_S = 10.0


def wait_for(check: Callable[[], object], what: str) -> None:
    """`wait_until` within DEADLINE_S; a read that fails meanwhile counts as "not yet"."""
    wait_until(check, DEADLINE_S, what, ignoring=(OSError,))


def errno_of(path: Path) -> int:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno or 0
    return 0


@pytest.mark.parametrize("with_redis", [False, True], ids=["embedded", "redis"])
def test_a_mount_follows_a_reingest(
    with_redis: bool, tmp_path: Path, mnt: Path, request: pytest.FixtureRequest
) -> None:
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    chroma = tmp_path / "chroma"
    backend = ["--site", SITE, "--chroma-path", str(chroma)]
    if with_redis:
        backend += ["--redis-url", request.getfixturevalue("redis_server").url]
    ingest(site, *backend, "--default-access", "public", "--quiet")
    port = free_port()
    metrics = ["--metrics-addr", f"127.0.0.1:{port}"]
    with mounted(mnt, *backend, "--refresh-interval", "0.5", "--preload", "off", *metrics):
        edited, removed, locked = "guides/troubleshooting.md", "changelog.md", "guides/migration.mdx"
        unchanged = "quickstart.mdx"
        for key in (edited, removed, locked, unchanged):  # everything in the kernel's caches
            assert (mnt / key).read_bytes() == (site / key).read_bytes()
        sorted(os.listdir(mnt))
        sorted(os.listdir(mnt / "guides"))
        assert errno_of(mnt / "brand-new" / "page.md") == errno.ENOENT  # a negative entry, cached
        inode = (mnt / unchanged).stat().st_ino

        with (site / edited).open("a") as f:
            f.write("\nA new paragraph, added by the re-ingest.\n")
        (site / removed).unlink()
        (site / "brand-new").mkdir()
        (site / "brand-new" / "page.md").write_text("# Fresh\n\nWritten after the mount.\n")
        text = (site / locked).read_text()
        lock = "groups: [admin]\n"
        (site / locked).write_text(f"---\n{lock}{text[4:]}" if text.startswith("---\n") else f"---\n{lock}---\n{text}")
        ingest(site, *backend, "--default-access", "public", "--quiet")

        wait_for(lambda: (mnt / edited).read_bytes() == (site / edited).read_bytes(), "the edited page's new bytes")
        wait_for(lambda: errno_of(mnt / removed) == errno.ENOENT, "the removed page gone")
        assert removed not in os.listdir(mnt)
        wait_for(
            lambda: (mnt / "brand-new" / "page.md").read_bytes() == (site / "brand-new" / "page.md").read_bytes(),
            "the new page in a new folder",
        )
        assert "brand-new" in os.listdir(mnt)
        wait_for(lambda: errno_of(mnt / locked) == errno.ENOENT, "the locked page hidden from anonymous")
        assert locked.split("/")[1] not in os.listdir(mnt / "guides")
        assert (mnt / unchanged).stat().st_ino == inode
        assert (mnt / unchanged).read_bytes() == (site / unchanged).read_bytes()

        def status() -> dict:
            argv = [str(BIN / "chromafs"), "status", "--json"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return next(s for s in json.loads(out.stdout) if s["mountpoint"] == str(mnt))

        wait_for(lambda: status()["tree_switches"] == 1, "the status file showing the switch")  # written every 2 s
        assert status()["last_switch_s"] > 0
        assert status()["tree_version"] == tree_version(ingested_tree(chroma))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            exported = response.read().decode()
        assert "chromafs_tree_switches_total 1.0" in exported
        assert f'chromafs_tree_info{{version="{status()["tree_version"]}"}} 1.0' in exported


def ingested_tree(chroma: Path) -> str:
    from chromafs_fuse.backends.chroma_store import ChromaLocation, ChromaPages

    return ChromaPages.open(ChromaLocation(path=str(chroma), collection=SITE)).load_tree_document()[0]


def test_an_ingest_published_to_redis_reaches_mounts_at_once(
    tmp_path: Path, mnt: Path, request: pytest.FixtureRequest
) -> None:
    """The ingest announces the new version on the site's Redis channel: a mount whose poll is a
    minute away switches within two seconds."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma")]
    redis = request.getfixturevalue("redis_server")
    backend += ["--redis-url", redis.url]
    ingest(site, *backend, "--quiet")
    with mounted(mnt, *backend, "--refresh-interval", "60", "--preload", "off"):
        page = "quickstart.mdx"
        assert (mnt / page).read_bytes() == (site / page).read_bytes()
        wait_until(lambda: redis_subscribed(redis), 10, "the mount subscribed", 0.05)
        (site / page).write_bytes((site / page).read_bytes() + b"\nAnnounced.\n")
        ingest(site, *backend, "--quiet")
        wait_until(
            lambda: (mnt / page).read_bytes() == (site / page).read_bytes(), 2.0, "the switch to the new version", 0.05
        )


def test_a_file_open_across_a_switch_reads_one_version_and_a_hidden_one_stops(tmp_path: Path, mnt: Path) -> None:
    """A re-ingest replaces a changed file as `rename` would: a descriptor opened before the
    switch reads the old version whole (even a file the kernel reads in many requests), a new
    open reads the new one, and a descriptor on a page locked away by the re-ingest reads no more."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    big, locked = "guides/big.md", "guides/migration.mdx"
    (site / big).write_text("".join(f"line {i:06d} of a long page that takes many reads\n" for i in range(12000)))
    backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma")]
    ingest(site, *backend, "--quiet")
    old = (site / big).read_bytes()
    assert len(old) > 4 * 128 * 1024
    with mounted(mnt, *backend, "--refresh-interval", "0.3", "--preload", "off", "--push-pages"):
        held = os.open(mnt / big, os.O_RDONLY)
        held_locked = os.open(mnt / locked, os.O_RDONLY)
        try:
            first = os.pread(held, 100_000, 0)
            assert os.pread(held_locked, 4096, 0)  # its bytes are in the kernel's page cache now
            (site / big).write_bytes(old.replace(b"line", b"LINE"))
            text = (site / locked).read_text()
            (site / locked).write_text("---\ngroups: [admin]\n" + text[4:] if text.startswith("---\n") else text)
            ingest(site, *backend, "--quiet")
            wait_for(
                lambda: (mnt / big).read_bytes() == (site / big).read_bytes(), "a new open reading the new version"
            )
            assert errno_of(mnt / locked) == errno.ENOENT
            rest = b"".join(os.pread(held, 65536, offset) for offset in range(100_000, len(old), 65536))
            assert first + rest == old, "a descriptor opened before the switch must read the old version whole"
            assert os.fstat(held).st_size == len(old)
            with pytest.raises(OSError) as info:
                os.pread(held_locked, 4096, 0)
            assert info.value.errno == errno.ENOENT
        finally:
            os.close(held)
            os.close(held_locked)
        assert (mnt / big).read_bytes() == (site / big).read_bytes()


def test_a_reingest_under_four_grep_loops_reaches_a_mountd_mount_on_a_chroma_server(
    tmp_path: Path,
    chroma_server: ChromaServer,
    token_file: Callable[..., Path],
    secret_file: Path,
) -> None:
    """Production shape: a `chroma run` server, a session of chromafs-mountd (a bind of its shared
    class mount) for an anonymous reader and a direct mount for an admin, four `grep -r` loops over the
    anonymous mount while the site is re-ingested. Every grep finishes cleanly; the edit reaches
    both mounts; the page locked away disappears for the anonymous reader only."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", "acme", "--collection", "live-grep", "--chroma-url", chroma_server.url]
    ingest(site, *backend, "--quiet")
    anonymous, admin = tmp_path / "anonymous", tmp_path / "admin"
    anonymous.mkdir()
    admin.mkdir()
    edited, locked = "guides/troubleshooting.md", "guides/migration.mdx"
    refresh = ["--refresh-interval", "0.5"]
    admin_token = reader_args(token_file(["admin"]), secret_file)
    server = MountServer(tmp_path)
    try:
        server.start()
        done = try_mount(anonymous, *backend, *refresh, "--mountd", str(server.socket))
        assert done.returncode == 0, done.stderr
        try:
            with mounted(admin, *backend, *refresh, *admin_token):
                stop = threading.Event()
                outcomes: list[tuple[int, str]] = []

                def grep_loop() -> None:
                    while not stop.is_set():
                        run = subprocess.run(
                            ["grep", "-r", "-c", "-e", "the", str(anonymous)], capture_output=True, text=True
                        )
                        outcomes.append((run.returncode, run.stderr))

                loops = [threading.Thread(target=grep_loop) for _ in range(4)]
                for loop in loops:
                    loop.start()

                def more_greps() -> None:  # every grep loop goes round once more
                    done = len(outcomes)
                    wait_until(lambda: len(outcomes) >= done + len(loops), 60, "four more greps", 0.05)

                try:
                    more_greps()
                    with (site / edited).open("a") as f:
                        f.write("\nEdited while four greps ran.\n")
                    text = (site / locked).read_text()
                    (site / locked).write_text("---\ngroups: [admin]\n" + text[4:])
                    ingest(site, *backend, "--quiet")
                    for mount in (anonymous, admin):
                        wait_for(lambda m=mount: (m / edited).read_bytes() == (site / edited).read_bytes(), "the edit")
                    wait_for(lambda: errno_of(anonymous / locked) == errno.ENOENT, "the locked page gone")
                    assert (admin / locked).read_bytes() == (site / locked).read_bytes()
                    more_greps()
                finally:
                    stop.set()
                    for loop in loops:
                        loop.join(120)
                # the locked page may vanish under a grep walking its folder: ENOENT, as on a local disk
                gone = f"grep: {anonymous / locked}: No such file or directory\n"
                assert outcomes and all((code == 0 and not err) or err == gone for code, err in outcomes), outcomes[:3]
        finally:
            unmount(anonymous)
    finally:  # the server first: a class mount gone under a running server is a crash it heals
        server.stop()
        server.unmount_classes()


def test_a_mount_whose_kernel_caches_for_an_hour_shows_the_new_listing_and_bytes(tmp_path: Path, mnt: Path) -> None:
    """With --cache-timeout 3600 the kernel keeps what it listed and read for an hour. A re-ingest
    adds a page to a listed folder (a name never looked up on the mount, in a folder where no other
    name changed, so only the folder's own cached listing is wrong) and edits a page already read:
    after the switch both show as the source does."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma")]
    ingest(site, *backend, "--quiet")
    folder, edited, added = "concepts", "guides/troubleshooting.md", "concepts/zz-added-later.md"

    def listing() -> list[str]:
        """What `ls concepts` should show the anonymous reader."""
        visible = expected_visible(site, "public", None)
        return sorted({p.split("/")[1] for p in visible if p.startswith(f"{folder}/")})

    with mounted(mnt, *backend, "--refresh-interval", "0.3", "--preload", "off", "--cache-timeout", "3600"):
        for _ in range(2):  # the second pass comes from the kernel's caches
            assert sorted(os.listdir(mnt / folder)) == listing()
            assert (mnt / edited).read_bytes() == (site / edited).read_bytes()
        with (site / edited).open("a") as f:
            f.write("\nA paragraph added by the re-ingest.\n")
        (site / added).write_text("# Added later\n\nA page the mount never looked up.\n")
        ingest(site, *backend, "--quiet")
        wait_for(lambda: (mnt / edited).read_bytes() == (site / edited).read_bytes(), "the edited page's new bytes")
        wait_for(
            lambda: sorted(os.listdir(mnt / folder)) == listing(),
            f"the new listing of {folder} (with {added.split('/')[1]})",
        )
        assert (mnt / added).read_bytes() == (site / added).read_bytes()
