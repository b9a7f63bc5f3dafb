"""`chromafs mcp` through the official SDK's own client, over stdio and streamable HTTP: every
answer equals what ls, cat, sed, find and grep give on a real mount with the same token, for two
tokens, and a hidden page is indistinguishable from a missing one in every answer and error."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from infra import BIN, SAMPLE_SITE, expected_visible, free_port, ingest, mounted, stop_pid, wait_until
from mcp_compare import Calls, Probe, checked_answers, mount_answers, over_stdio, sh, strip_dot, text

SAMPLE_PROBE = Probe("quickstart.mdx", "auth", "token", "$ curl", "auth/api-keys.mdx")


def site_args(chroma: Path, secret_file: Path) -> list[str]:
    return ["--site", "acme", "--chroma-path", str(chroma), "--jwt-secret-file", str(secret_file)]


def over_http(url: str, token: str | None, calls: Calls) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def session() -> Any:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            return await calls(client)

    return anyio.run(session)


@contextlib.contextmanager
def serving_over_http(args: list[str], log_path: Path) -> Iterator[str]:
    """`chromafs mcp --http` on a free port until the block ends (stopped by its PID); its URL."""
    port = free_port()
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [str(BIN / "chromafs"), "mcp", "--http", f"127.0.0.1:{port}", *args], stdout=log, stderr=log
        )

        def answers() -> bool:
            assert server.poll() is None, log_path.read_text()
            probe = ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"]
            return subprocess.run(probe, capture_output=True).returncode == 0

        try:
            wait_until(answers, 60, f"chromafs mcp answering on port {port} (its log: {log_path})")
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            stop_pid(server)


@pytest.fixture
def mounts(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> Iterator[dict[str, tuple[Path | None, Path]]]:
    """An anonymous and a billing reader's mounts: name -> (token file, mountpoint)."""
    args = site_args(sample_chroma("public"), secret_file)
    billing = token_file(["billing"])
    with mounted(tmp_path / "anon", *args), mounted(tmp_path / "billing", *args, "--token-file", str(billing)):
        yield {"anon": (None, tmp_path / "anon"), "billing": (billing, tmp_path / "billing")}


def test_mcp_over_stdio_answers_as_the_tools_do_on_a_mount_for_two_tokens(
    mounts: dict[str, tuple[Path | None, Path]], sample_chroma: Callable[[str], Path], secret_file: Path
) -> None:
    args = site_args(sample_chroma("public"), secret_file)
    seen: dict[str, dict[tuple[str, ...], str]] = {}
    for name, (token, root) in mounts.items():
        expected = mount_answers(root, SAMPLE_PROBE)
        token_args = ["--token-file", str(token)] if token else []

        got = over_stdio([*args, *token_args], partial(checked_answers, keys=list(expected), probe=SAMPLE_PROBE))
        for key, answer in expected.items():
            assert got[key] == answer, key
        seen[name] = got
    assert seen["anon"] != seen["billing"]  # two readers, two views


def test_a_hidden_page_is_a_missing_page_in_every_mcp_answer_and_error(
    sample_chroma: Callable[[str], Path], secret_file: Path
) -> None:
    everything = expected_visible(SAMPLE_SITE, "public", {"admin", "billing"})
    hidden = sorted(everything - expected_visible(SAMPLE_SITE, "public", None))
    page = next(p for p in hidden if p.endswith((".md", ".mdx")))
    folder = page.rsplit("/", 1)[0]
    title = next(line for line in (SAMPLE_SITE / page).read_text().splitlines() if line.startswith(("title:", "# ")))
    title = title.split(":", 1)[1] if title.startswith("title:") else title[2:]

    async def calls(client: Client) -> dict[str, tuple[bool, str]]:
        out = {}
        for label, path in (
            ("hidden", page),
            ("missing", "no/such-page.md"),
            ("hidden-dir", folder),
            ("missing-dir", "no"),
        ):
            out[f"read {label}"] = await text(client, "read", path=path)
            out[f"list {label}"] = await text(client, "list", path=path)
            out[f"find {label}"] = await text(client, "find", path=path)
            out[f"grep {label}"] = await text(client, "grep", pattern=".", path=path)
        out["find all"] = await text(client, "find")
        out["grep all"] = await text(client, "grep", pattern=".", files_with_matches=True)
        out["search title"] = await text(client, "search", query=title.strip(), n=100)
        return out

    got = over_stdio(site_args(sample_chroma("public"), secret_file), calls)
    for tool in ("read", "list", "find", "grep"):
        error, message = got[f"{tool} hidden"]
        assert error and (error, message) == (True, got[f"{tool} missing"][1].replace("no/such-page.md", page))
        error, message = got[f"{tool} hidden-dir"]
        assert error and message == got[f"{tool} missing-dir"][1].replace("no:", f"{folder}:")
    answers = "\n".join(message for probe, (_, message) in got.items() if "hidden" not in probe)
    for path in hidden:
        assert path not in answers, f"{path} leaked"
    shown = {line.split(":", 1)[0] for line in got["search title"][1].splitlines()}
    assert shown and shown <= expected_visible(SAMPLE_SITE, "public", None)


def test_mcp_over_http_takes_each_requests_token(
    mounts: dict[str, tuple[Path | None, Path]],
    sample_chroma: Callable[[str], Path],
    secret_file: Path,
    make_token: Callable[..., str],
    tmp_path: Path,
) -> None:
    with serving_over_http(site_args(sample_chroma("public"), secret_file), tmp_path / "mcp.log") as url:

        async def files(client: Client) -> tuple[bool, str]:
            return await text(client, "find", type="f")

        def on_mount(root: Path) -> str:
            return "\n".join(sorted(strip_dot(sh(["find", ".", "-type", "f"], root)).splitlines()))

        assert over_http(url, None, files) == (False, on_mount(mounts["anon"][1]))
        assert over_http(url, make_token(["billing"]), files) == (False, on_mount(mounts["billing"][1]))
        error, message = over_http(url, make_token(["billing"], exp=int(time.time()) - 60), files)
        assert error and "token refused: token has expired" in message
        error, message = over_http(url, make_token(["admin"]) + "x", files)
        assert error and "token refused: token signature is invalid" in message


def test_an_mcp_session_stops_reading_when_its_token_expires(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path
) -> None:
    expires_at = int(time.time()) + 10  # the server starts (imports, tree) well before, even on a loaded host
    args = [
        *site_args(sample_chroma("public"), secret_file),
        "--token-file",
        str(token_file(["billing"], exp=expires_at)),
    ]

    async def calls(client: Client) -> tuple[tuple[bool, str], tuple[bool, str]]:
        before = await text(client, "read", path="quickstart.mdx")
        await anyio.sleep(max(0.0, expires_at - time.time()) + 0.5)  # not a wait: the token's time runs out
        return before, await text(client, "read", path="quickstart.mdx")

    before, after = over_stdio(args, calls)
    assert before == (False, (SAMPLE_SITE / "quickstart.mdx").read_text())
    assert after[0] and after[1].endswith("the token expired")


def test_mcp_over_http_gives_readers_of_different_groups_their_own_views(
    sample_chroma: Callable[[str], Path], secret_file: Path, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """One server, two valid tokens of different groups asked in turn (the admin first, so its
    view is loaded and kept): each sees exactly its own pages in find, list, read and grep, and
    a page only the other may read is missing, not shown."""
    readers = {"admin": {"admin"}, "billing": {"billing"}}
    visible = {name: expected_visible(SAMPLE_SITE, "public", groups) for name, groups in readers.items()}
    only = {
        "admin": sorted(p for p in visible["admin"] - visible["billing"] if p.startswith("admin/")),
        "billing": sorted(p for p in visible["billing"] - visible["admin"] if p.startswith("api-reference/")),
    }
    assert only["admin"] and only["billing"]

    async def calls(client: Client) -> dict[str, tuple[bool, str]]:
        out = {"find": await text(client, "find", type="f")}
        for name, pages in only.items():
            page = pages[0]
            folder = page.split("/", 1)[0]
            out[f"list {name}"] = await text(client, "list", path=folder)
            out[f"read {name}"] = await text(client, "read", path=page)
            out[f"grep {name}"] = await text(client, "grep", pattern=".", path=folder, files_with_matches=True)
        return out

    with serving_over_http(site_args(sample_chroma("public"), secret_file), tmp_path / "mcp.log") as url:
        for name in ("admin", "billing", "admin"):  # each after the other's view is loaded
            got = over_http(url, make_token(sorted(readers[name])), calls)
            other = "billing" if name == "admin" else "admin"
            mine, theirs = only[name][0], only[other][0]
            error, message = got[f"read {other}"]
            assert error and message.endswith(f"read: {theirs}: No such file or directory"), f"{name}: read {theirs}"
            assert got[f"read {name}"] == (False, (SAMPLE_SITE / mine).read_text()), f"{name}: read {mine}"
            error, found = got["find"]
            assert not error and set(found.splitlines()) == visible[name], f"{name}: find -type f"
            for folder_of in (name, other):
                folder = only[folder_of][0].split("/", 1)[0]
                error, listing = got[f"list {folder_of}"]
                shown = {f"{folder}/{entry}".rstrip("/") for entry in listing.splitlines()}
                assert not error and shown == {
                    f"{folder}/{p.split('/')[1]}" for p in visible[name] if p.startswith(f"{folder}/")
                }, f"{name}: ls {folder}"
                error, matches = got[f"grep {folder_of}"]
                expected = sorted(p for p in visible[name] if p.startswith(f"{folder}/"))
                assert (error, matches.splitlines()) == (False, expected), f"{name}: grep -rl . {folder}"


@pytest.mark.parametrize("refresh", ["0.3", "0"])
def test_mcp_over_http_follows_a_reingest_for_every_reader(
    refresh: str, secret_file: Path, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """A re-ingest reaches both readers' views, polled every 0.3 s or checked on every call (0): an
    edited page reads new, and a page locked away from the anonymous reader is missing for it
    while a billing reader still reads it."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    chroma = tmp_path / "chroma"
    ingest(site, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    edited, locked = "quickstart.mdx", "guides/migration.mdx"
    billing = make_token(["billing"])

    async def reads(client: Client) -> dict[str, tuple[bool, str]]:
        return {path: await text(client, "read", path=path) for path in (edited, locked)}

    def current(path: str) -> tuple[bool, str]:
        return False, (site / path).read_text()

    args = [*site_args(chroma, secret_file), "--refresh-interval", refresh]
    with serving_over_http(args, tmp_path / "mcp.log") as url:
        for token in (None, billing):
            assert over_http(url, token, reads) == {path: current(path) for path in (edited, locked)}
        (site / edited).write_text((site / edited).read_text() + "\nEdited by a re-ingest.\n")
        (site / locked).write_text("---\ngroups: [billing]\n" + (site / locked).read_text()[4:])
        ingest(site, "--site", "acme", "--chroma-path", str(chroma), "--quiet")

        def reingested() -> dict[str, tuple[bool, str]] | None:
            answers = over_http(url, None, reads)
            return answers if answers[edited] == current(edited) else None

        anonymous = wait_until(reingested, 30, "the anonymous reader reading the re-ingested page", 0.2)
        error, message = anonymous[locked]
        assert error and message.endswith(f"read: {locked}: No such file or directory")
        assert over_http(url, billing, reads) == {path: current(path) for path in (edited, locked)}
