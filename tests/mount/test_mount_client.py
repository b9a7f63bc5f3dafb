"""The mount client's quick path: what it reads from argv without argparse, and the request
line it sends, against the real parser and a JSON decoder (no mount)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chromafs_fuse.cli.mount import build_parser
from chromafs_fuse.cli.mount_request import (
    FLAGS,
    VALUE_OPTIONS,
    encode_request,
    quick_options,
    request_options,
    server_argv,
)
from chromafs_fuse.options import CLIENT_ONLY, MOUNT_OPTIONS, request_values
from chromafs_fuse.serving.protocol import MOUNT_SERVER_REQUESTS, OpenSession, decode

# what the quick path hands to the full parser instead of reading itself
FULL_PARSER_ONLY = {"-h", "--help", "--foreground", "-f", "--ready-fd", "--token-stdin"}


def _parser_options() -> tuple[set[str], set[str]]:
    flags: set[str] = set()
    values: set[str] = set()
    for action in build_parser()._actions:
        names = set(action.option_strings) - FULL_PARSER_ONLY
        if not names:
            continue
        if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
            flags |= names
        else:
            values |= names
    return flags, values


def test_the_quick_path_knows_every_option_of_the_parser() -> None:
    flags, values = _parser_options()
    assert set(FLAGS) == flags
    assert set(VALUE_OPTIONS) == values


@pytest.mark.parametrize(
    "argv",
    [
        ["/mnt/docs", "--site", "acme", "--mountd", "/run/s.sock", "--token-file", "/t"],
        ["--site=acme", "/mnt/docs", "--isolated", "-o", "allow_other", "--no-push-pages"],
        ["--chunk-joiner", "-", "/mnt/docs", "--site", "a"],
        ["/m", "--site", "a", "-o", "allow_other", "-o", "ro,noatime", "--backend-timeout=2.5", "--push-pages"],
        ["/m", "--site", "a", "--prefetch", "off", "--readahead-pages", "0", "--log-format", "json"],
    ],
)
def test_plain_requests_are_read_as_the_parser_reads_them(argv: list[str]) -> None:
    """What the quick path sends, read by the mount server (options.request_values), is what
    chromafs-mount's parser makes of the same argv, option by option."""
    parsed = quick_options(argv)
    assert parsed is not None
    values, mountpoint = parsed
    args = build_parser().parse_args(argv)
    assert mountpoint == args.mountpoint
    served = request_values(request_options(values, {}))
    for option in MOUNT_OPTIONS:
        if option.name not in CLIENT_ONLY and not option.hidden:
            assert served[option.dest] == getattr(args, option.dest), option.name


@pytest.mark.parametrize(
    "argv",
    [
        ["/mnt/docs", "--help"],
        ["/mnt/docs", "--foreground"],
        ["/mnt/docs", "--sit", "acme"],  # an abbreviation: argparse decides
        ["/mnt/docs", "--site"],  # a missing value: argparse words the error
        ["/mnt/docs", "--site", "--isolated"],
        ["/mnt/docs", "/mnt/other"],
        [],
        ["--", "/mnt/docs"],
        ["/mnt/docs", "--token-stdin"],
    ],
)
def test_anything_else_goes_to_the_full_parser(argv: list[str]) -> None:
    assert quick_options(argv) is None


def test_the_request_line_is_the_protocols_open_session() -> None:
    """The client's own encoder (lighter to import) writes what serving/protocol.py reads."""
    odd = ['quote " and \\ back', "tab\tnew\nline\x01", "ünï", "bytes \udcff\udc80 undecodable"]
    options: dict[str, object] = {"--site": odd[0], "--collection": odd[1], "--chunk-joiner": odd[2]}
    options |= {"--log-file": "/" + odd[3], "--isolated": True, "-o": ["allow_other", "ro"], "--cache-bytes": 5}
    options |= {"--backend-timeout": 2.5}
    line = encode_request("/mnt/dócs", options, "a.b.c")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line, MOUNT_SERVER_REQUESTS) == OpenSession("/mnt/dócs", options, "a.b.c")
    assert decode(encode_request("/m", {}, None), MOUNT_SERVER_REQUESTS) == OpenSession("/m", {}, None)


def test_a_request_carries_absolute_paths_and_the_callers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server reads neither the caller's working directory nor its environment: the client
    resolves both."""
    monkeypatch.chdir(tmp_path)
    given = {"--site": "a", "--chroma-path": "chroma", "--log-file": "logs/m.log", "--token-file": "t"}
    environ = {"CHROMAFS_REDIS_URL": "redis://r:6379/0", "CHROMAFS_JWT_SECRET_FILE": "k", "CHROMAFS_TOKEN": "T"}
    environ["CHROMAFS_MOUNTD_SOCKET"] = "/s"
    sent = request_options(given, environ)
    assert sent == {
        "--site": "a",
        "--chroma-path": str(tmp_path / "chroma"),
        "--log-file": str(tmp_path / "logs/m.log"),
        "--redis-url": "redis://r:6379/0",
        "--jwt-secret-file": str(tmp_path / "k"),
    }
    assert request_options({"--site": "a"}, {"CHROMAFS_CHROMA_URL": "http://c:8000"})["--chroma-url"] == "http://c:8000"
    given = {"--site": "a", "--redis-url": "redis://mine"}
    assert request_options(given, environ)["--redis-url"] == "redis://mine"  # a flag beats the environment


def test_the_token_never_travels_in_the_servers_argv() -> None:
    argv = ["/m", "--token", "SECRET", "--token-file=/f", "--token-file", "/g", "--token=SECRET2", "--site", "a"]
    assert server_argv(argv) == ["/m", "--site", "a"]
