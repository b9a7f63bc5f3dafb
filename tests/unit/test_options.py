"""The one table of options (options.py) against everything that names an option: chromafs-mount's,
chromafs-mountd's and the session commands' parsers, the mount client's quick path, the fstab
helper and the configuration's defaults. None of them may declare an option of its own."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from chromafs_fuse.cli import mount_helper, mount_request
from chromafs_fuse.cli.chromafs import build_parser as chromafs_parser
from chromafs_fuse.cli.common import add_session_arguments
from chromafs_fuse.cli.ingest import build_parser as ingest_parser
from chromafs_fuse.cli.mount import build_parser as mount_parser
from chromafs_fuse.cli.mountd import build_parser as mountd_parser
from chromafs_fuse.config import MountConfig, RedisSettings, ServerConfig, SessionConfig, chroma_location, flag_values
from chromafs_fuse.errors import UsageError
from chromafs_fuse.ingest.pipeline import IngestOptions
from chromafs_fuse.options import (
    INGEST_OPTIONS,
    MOUNT_OPTIONS,
    MOUNTD_OPTIONS,
    SESSION_OPTIONS,
    Option,
    deprecated_names,
    find,
    fstab_names,
    quick_path_names,
)

HELP = {"-h", "--help"}
ENV = ("CHROMAFS_SITE", "CHROMAFS_REDIS_URL", "CHROMAFS_REDIS_CA", "CHROMAFS_MOUNTD_SOCKET", "CHROMAFS_CLASS_ROOT")
ENV += (
    "CHROMAFS_TOKEN",
    "CHROMAFS_TOKEN_FILE",
    "CHROMAFS_JWT_SECRET_FILE",
    "CHROMAFS_JWT_PUBLIC_KEY",
    "CHROMAFS_JWKS_URL",
    "CHROMAFS_JWT_ISSUER",
    "CHROMAFS_JWT_AUDIENCE",
    "CHROMAFS_CHROMA_URL",
    "CHROMAFS_CHROMA_PATH",
)


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each option string of the parser -> its action (positionals and -h left out)."""
    return {name: action for action in parser._actions for name in action.option_strings if name not in HELP}


def _session_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_session_arguments(parser)
    return parser


def _subcommand(name: str) -> argparse.ArgumentParser:
    commands = next(a for a in chromafs_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def _assert_parser_is_the_table(parser: argparse.ArgumentParser, table: tuple[Option, ...]) -> None:
    actions = _actions(parser)
    declared = {name for option in table for name in option.names}
    assert set(actions) == declared, "flags added by hand, or missing from the parser"
    for option in table:
        action = actions[option.name]
        assert action.dest == option.dest, option
        assert action.type is option.type, option
        assert tuple(action.choices or ()) == tuple(option.choices or ()), option
        assert action.metavar == option.metavar, option
        assert (action.help == argparse.SUPPRESS) == option.hidden, option
        if option.kind == "value":
            assert action.default == option.default, option
        for old in option.deprecated:  # an old name stores where the new one does
            assert actions[old].dest == option.dest and actions[old].help == argparse.SUPPRESS


def test_the_parsers_declare_exactly_the_tables_options() -> None:
    _assert_parser_is_the_table(mount_parser(), MOUNT_OPTIONS)
    _assert_parser_is_the_table(mountd_parser(), MOUNTD_OPTIONS)
    _assert_parser_is_the_table(_session_parser(), SESSION_OPTIONS)
    _assert_parser_is_the_table(ingest_parser(), INGEST_OPTIONS)
    assert MOUNT_OPTIONS[: len(SESSION_OPTIONS)] == SESSION_OPTIONS
    session_names = {name for option in SESSION_OPTIONS for name in option.names}
    for command in ("grep", "search", "mcp"):
        assert session_names <= set(_actions(_subcommand(command))), command
    for parser in (mount_parser(), mountd_parser(), _subcommand("grep")):
        assert "--site" in parser.format_help() or "--socket" in parser.format_help()
    with pytest.raises(SystemExit):  # --chroma-path and --chroma-url exclude each other
        mount_parser().parse_args(["/m", "--site", "a", "--chroma-path", "p", "--chroma-url", "u"])


def test_the_quick_path_reads_exactly_the_tables_options() -> None:
    assert quick_path_names() == (mount_request.FLAGS, mount_request.VALUE_OPTIONS)
    full_parser_only = {name for option in MOUNT_OPTIONS if not option.quick for name in option.names}
    assert full_parser_only == {"--foreground", "-f", "--ready-fd", "--token-stdin"}
    quick = mount_request.FLAGS | mount_request.VALUE_OPTIONS
    assert quick == set(_actions(mount_parser())) - full_parser_only
    assert not mount_request.FLAGS & mount_request.VALUE_OPTIONS


def test_the_fstab_helper_takes_every_mount_option() -> None:
    valued, switches = fstab_names()
    assert mount_helper.mount_flags() == (set(valued), set(switches))
    parser = mount_parser()
    for option in MOUNT_OPTIONS:
        names = {name[2:].replace("-", "_") for name in option.names if name.startswith("--")}
        if not option.fstab:
            assert not names & (set(valued) | set(switches)), option
            continue
        for name in names:
            if option.kind in ("switch", "toggle"):
                argv = mount_helper.translate("acme", "/mnt/docs", name)
                assert argv[3:] == [f"--{name.replace('_', '-')}"]
            else:
                value = option.choices[0] if option.choices else "7"
                argv = mount_helper.translate("acme", "/mnt/docs", f"{name}={value}")
                assert argv[3:] == [option.name, value], name  # an old name is translated to the new one
            assert getattr(parser.parse_args(argv), option.dest) is not None
    assert {"site", "token", "foreground", "o", "token_stdin", "ready_fd"}.isdisjoint({*valued, *switches})


def test_config_defaults_are_the_tables(tmp_path: Path) -> None:
    args = mount_parser().parse_args([str(tmp_path), "--site", "acme", "--chroma-path", str(tmp_path)])
    session = SessionConfig(args.site, chroma_location(args), args.page_field, args.chunk_index_field)
    assert MountConfig.from_args(args) == MountConfig(session, str(tmp_path))
    redis_url = "redis://127.0.0.1:6379/0"
    args = mount_parser().parse_args([str(tmp_path), "--site", "acme", "--chroma-path", ".", "--redis-url", redis_url])
    assert SessionConfig.from_args(args).redis == RedisSettings(redis_url)
    assert MountConfig.from_args(args).refresh_interval_s == 1.0  # --refresh-interval's default with Redis


def test_the_mount_servers_defaults_are_the_tables() -> None:
    assert find("--socket", MOUNTD_OPTIONS).default == ServerConfig().socket == mount_request.HOST_MOUNTD_SOCKET
    args = mountd_parser().parse_args([])
    assert ServerConfig.from_args(args) == ServerConfig()
    assert ServerConfig().class_root == find("--class-root", MOUNTD_OPTIONS).default
    assert ServerConfig().class_warm_wait_s == find("--class-warm-wait", MOUNTD_OPTIONS).default


def test_every_config_field_set_by_a_flag_names_one_of_the_table() -> None:
    """A field's flag, default and bounds are the table's: a negative value of a bounded flag is
    refused with the flag's name, whichever config reads it."""
    for cls in (SessionConfig, MountConfig, ServerConfig, IngestOptions):
        for field in dataclasses.fields(cls):
            if "flag" in field.metadata:
                option = find(field.metadata["flag"], field.metadata["options"])
                if field.default is not dataclasses.MISSING and field.name != "refresh_interval_s":
                    assert field.default == option.default, field.name
    for flag in ("--readahead-pages", "--cache-timeout", "--warm-wait", "--idle-exit", "--cache-bytes"):
        args = mount_parser().parse_args(["/m", "--site", "a", "--chroma-path", "/c", flag, "-1"])
        with pytest.raises(UsageError, match=f"^{flag} must not be negative$"):
            MountConfig.from_args(args)
    args = mount_parser().parse_args(["/m", "--site", "a", "--chroma-path", "/c", "--backend-timeout", "0"])
    with pytest.raises(UsageError, match=r"^--backend-timeout must be more than 0$"):
        MountConfig.from_args(args)
    with pytest.raises(UsageError, match=r"^--class-idle must not be negative$"):
        ServerConfig.from_args(mountd_parser().parse_args(["--class-idle", "-1"]))
    for flag in ("--retries", "--grace-period", "--chroma-blob-limit"):
        args = ingest_parser().parse_args(["/docs", "--site", "a", "--chroma-path", "/c", flag, "-1"])
        with pytest.raises(UsageError, match=f"^{flag} must not be negative$"):
            flag_values(IngestOptions, args)


def test_old_names_still_work_and_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert deprecated_names() == {"--prefetch": "--preload", "--prefetch-max-bytes": "--preload-max-bytes"}
    old = mount_parser().parse_args(["/m", "--site", "a", "--prefetch", "off", "--prefetch-max-bytes=5"])
    new = mount_parser().parse_args(["/m", "--site", "a", "--preload", "off", "--preload-max-bytes=5"])
    assert old == new and (old.preload, old.preload_max_bytes) == ("off", 5)
    assert capsys.readouterr().err.splitlines() == [
        "chromafs-mount: --prefetch is deprecated, use --preload",
        "chromafs-mount: --prefetch-max-bytes is deprecated, use --preload-max-bytes",
    ]
    # what a serving process or a mount server is handed: the new names, so it says nothing
    argv = ["/m", "--prefetch", "on", "--token", "T", "--prefetch-max-bytes=9", "--", "--prefetch"]
    assert mount_request.server_argv(argv) == ["/m", "--preload", "on", "--preload-max-bytes=9", "--", "--prefetch"]
    assert mount_helper.translate("acme", "/m", "prefetch=off") == ["/m", "--site", "acme", "--preload", "off"]
    assert capsys.readouterr().err == "mount.fuse.chromafs: option prefetch= is deprecated, use preload=\n"


def test_the_quick_path_warns_of_old_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from chromafs_fuse.cli import mount_client

    sent: list[bytes] = []
    monkeypatch.setattr(mount_client, "request_mount", lambda _socket, request, *_: sent.append(request) or 0)
    argv = [str(tmp_path), "--site", "a", "--chroma-path", ".", "--mountd", "/s", "--prefetch=off"]
    assert mount_client.quick_request(argv) == 0
    assert capsys.readouterr().err == "chromafs-mount: --prefetch is deprecated, use --preload\n"
    assert b'"--preload": "off"' in sent[0] and b"prefetch" not in sent[0]


def test_a_mount_servers_request_builds_its_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server parses a request and builds its MountConfig once; that object is what goes down
    (to the class mount or the forked daemon), never rebuilt from the flags."""
    from chromafs_fuse.serving.protocol import OpenSession
    from chromafs_fuse.serving.server.server import _prepare

    built: list[MountConfig] = []
    from_args = MountConfig.from_args

    def counted(args: argparse.Namespace) -> MountConfig:
        built.append(from_args(args))
        return built[-1]

    monkeypatch.setattr(MountConfig, "from_args", counted)
    options = {"--site": "acme", "--chroma-path": str(tmp_path), "--preload": "off"}
    got = _prepare(OpenSession(str(tmp_path / "docs"), options, None))
    assert len(built) == 1 and got.config is built[0]
    assert got.config.mountpoint == str(tmp_path / "docs") and got.config.preload == "off"
