"""What `chromafs mcp` answers next to what the real tools print on a mount with the same token:
shared by tests/mount/test_mcp.py and scripts/probe_frontends (a real docs site)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from infra import BIN

Key = tuple[str, str]
Calls = Callable[[Client], Awaitable[Any]]


@dataclass(frozen=True)
class Probe:
    """The non-exhaustive questions, beside every listing and every file."""

    lines_file: str  # read with start_line 3, end_line 9 (sed -n 3,9p)
    find_dir: str  # find DIR -type d
    word: str  # grep -rn WORD, grep -rni WORD.upper(), grep -rl WORD
    fixed: str  # grep -rnF FIXED
    context_file: str  # grep -Hn -C 2 WORD FILE


def over_stdio(args: list[str], calls: Calls) -> Any:
    params = StdioServerParameters(command=str(BIN / "chromafs"), args=["mcp", *args])

    async def session() -> Any:
        async with Client(params) as client:
            return await calls(client)

    return anyio.run(session)


async def text(client: Client, tool: str, **arguments: Any) -> tuple[bool, str]:
    """(is_error, the answer's text)."""
    result = await client.call_tool(tool, arguments)
    return result.is_error, "".join(getattr(part, "text", "") for part in result.content)


def sh(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "LC_ALL": "C"}
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env=env, errors="replace")
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{argv}: {done.stderr}")
    return done.stdout


def strip_dot(output: str) -> str:
    return "\n".join(line.removeprefix("./") for line in output.splitlines())


def mount_answers(root: Path, probe: Probe) -> dict[Key, str]:
    """What the real tools print on the mount, keyed as `mcp_answers` asks."""
    answers: dict[Key, str] = {}
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        answers[("list", "" if rel == "." else rel)] = sh(["ls", "-p"], Path(folder)).rstrip("\n")
        for name in files:
            path = os.path.normpath(os.path.join(rel, name))
            data = (root / path).read_bytes()
            try:
                answers[("read", path)] = data.decode("utf-8")
            except UnicodeDecodeError:
                answers[("read", path)] = f"binary:{len(data)}"
    word = probe.word

    def sorted_lines(output: str) -> str:
        return "\n".join(sorted(strip_dot(output).splitlines()))

    answers[("lines", probe.lines_file)] = sh(["sed", "-n", "3,9p", probe.lines_file], root)
    answers[("find", "*.md*")] = sorted_lines(sh(["find", ".", "-name", "*.md*"], root))
    answers[("find-d", probe.find_dir)] = sorted_lines(sh(["find", probe.find_dir, "-type", "d"], root))
    answers[("grep", word)] = strip_dot(sh(["grep", "-rn", word, "."], root)).rstrip("\n")
    answers[("grep-i", word.upper())] = strip_dot(sh(["grep", "-rni", word.upper(), "."], root)).rstrip("\n")
    answers[("grep-F", probe.fixed)] = strip_dot(sh(["grep", "-rnF", probe.fixed, "."], root)).rstrip("\n")
    answers[("grep-l", word)] = strip_dot(sh(["grep", "-rl", word, "."], root)).rstrip("\n")
    context = sh(["grep", "-Hn", "-C", "2", word, probe.context_file], root)
    answers[("grep-C", probe.context_file)] = context.rstrip("\n")
    return answers


async def mcp_answers(client: Client, keys: list[Key], probe: Probe) -> dict[Key, str]:
    answers: dict[Key, str] = {}
    for key in keys:
        kind, arg = key
        if kind == "list":
            error, out = await text(client, "list", path=arg or "/")
        elif kind == "read":
            error, out = await text(client, "read", path=arg)
            if error and "binary file of" in out:
                error, out = False, f"binary:{out.split('binary file of ')[1].split()[0]}"
        elif kind == "lines":
            error, out = await text(client, "read", path=arg, start_line=3, end_line=9)
        elif kind == "find":
            error, out = await text(client, "find", name=arg)
        elif kind == "find-d":
            error, out = await text(client, "find", name="*", path=arg, type="d")
        elif kind == "grep-C":
            error, out = await text(client, "grep", pattern=probe.word, path=arg, context=2)
        else:
            flags = {"grep-i": "ignore_case", "grep-F": "fixed_strings", "grep-l": "files_with_matches"}
            options = {flags[kind]: True} if kind in flags else {}
            error, out = await text(client, "grep", pattern=arg, **options)
        answers[key] = f"error: {out}" if error else out
    return answers


async def checked_answers(client: Client, keys: list[Key], probe: Probe) -> dict[Key, str]:
    """The tools are the five, all read-only; then every answer."""
    tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == {"list", "read", "find", "grep", "search"}
    assert all(t.annotations and t.annotations.read_only_hint and not t.annotations.destructive_hint for t in tools)
    return await mcp_answers(client, keys, probe)
