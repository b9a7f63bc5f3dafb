"""The mount client's quick path: what it reads from argv without argparse, and the request
line it sends, against the real parser and a JSON decoder (no mount)."""

from __future__ import annotations

import argparse
import json

import pytest

from chromafs_fuse.cli.mount import build_parser
from chromafs_fuse.cli.mount_request import FLAGS, VALUE_OPTIONS, encode_request, quick_options, server_argv

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
    ],
)
def test_plain_requests_are_read_as_the_parser_reads_them(argv: list[str]) -> None:
    parsed = quick_options(argv)
    assert parsed is not None
    values, mountpoint = parsed
    args = build_parser().parse_args(argv)
    assert mountpoint == args.mountpoint
    for name, value in values.items():
        dest = name.lstrip("-").replace("-", "_") if name != "-o" else "options"
        got = getattr(args, dest)
        assert (value in got) if isinstance(got, list) else str(got) == value


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


def test_the_request_line_is_json_the_server_reads_back() -> None:
    odd = ['quote " and \\ back', "tab\tnew\nline\x01", "ünï", "bytes \udcff\udc80 undecodable"]
    line = encode_request(["/mnt/docs", *odd], "a.b.c", "/home/ä")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    request = json.loads(line)
    assert request == {"argv": ["/mnt/docs", *odd], "token": "a.b.c", "cwd": "/home/ä"}
    assert json.loads(encode_request([], None, "/"))["token"] is None


def test_the_token_never_travels_in_the_servers_argv() -> None:
    argv = ["/m", "--token", "SECRET", "--token-file=/f", "--token-file", "/g", "--token=SECRET2", "--site", "a"]
    assert server_argv(argv) == ["/m", "--site", "a"]
