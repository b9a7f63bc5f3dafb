"""`chromafs mcp` through the official SDK's own client, over stdio and streamable HTTP: every
answer equals what ls, cat, sed, find and grep give on a real mount with the same token, for two
tokens, and a hidden page is indistinguishable from a missing one in every answer and error."""

from __future__ import annotations

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

from helpers import SAMPLE_SITE, expected_visible, mounted
from infra import BIN, free_port, stop_pid
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
    port = free_port()
    log = (tmp_path / "mcp.log").open("wb")
    server = subprocess.Popen(
        [str(BIN / "chromafs"), "mcp", "--http", f"127.0.0.1:{port}", *site_args(sample_chroma("public"), secret_file)],
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True).returncode:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "mcp.log").read_text()
            time.sleep(0.1)

        async def files(client: Client) -> tuple[bool, str]:
            return await text(client, "find", type="f")

        def on_mount(root: Path) -> str:
            return "\n".join(sorted(strip_dot(sh(["find", ".", "-type", "f"], root)).splitlines()))

        assert over_http(url, None, files) == (False, on_mount(mounts["anon"][1]))
        assert over_http(url, make_token(["billing"]), files) == (False, on_mount(mounts["billing"][1]))
        error, message = over_http(url, make_token(["billing"], exp=int(time.time()) - 60), files)
        assert error and message.endswith("token refused: token has expired")
        error, message = over_http(url, make_token(["admin"]) + "x", files)
        assert error and message.endswith("token refused: token signature is invalid")
    finally:
        stop_pid(server)
        log.close()


def test_an_mcp_session_stops_reading_when_its_token_expires(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path
) -> None:
    expires_at = int(time.time()) + 4
    args = [
        *site_args(sample_chroma("public"), secret_file),
        "--token-file",
        str(token_file(["billing"], exp=expires_at)),
    ]

    async def calls(client: Client) -> tuple[tuple[bool, str], tuple[bool, str]]:
        before = await text(client, "read", path="quickstart.mdx")
        await anyio.sleep(max(0.0, expires_at - time.time()) + 0.5)
        return before, await text(client, "read", path="quickstart.mdx")

    before, after = over_stdio(args, calls)
    assert before == (False, (SAMPLE_SITE / "quickstart.mdx").read_text())
    assert after[0] and after[1].endswith("the token expired")
