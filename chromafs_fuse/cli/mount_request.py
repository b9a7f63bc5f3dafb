"""The client side of a mount server's socket, and the checks `chromafs-mount` makes before
it starts or asks for a mount. Nothing heavier than C modules is imported here: the mount
client's fast path uses it.
"""

from __future__ import annotations

import os
import sys

from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import (
    CLIENT_ONLY,
    MOUNT_OPTIONS,
    MOUNTD_DEFAULTS,
    absolute,
    by_name,
    deprecated_names,
    quick_path_names,
)
from chromafs_fuse.serving.handshake import wait_for_answer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

HOST_MOUNTD_SOCKET: str = MOUNTD_DEFAULTS["--socket"]
FALL_BACK_ERRNOS = frozenset({2, 13, 111})  # ENOENT, EACCES, ECONNREFUSED: no host server for us
FLAGS, VALUE_OPTIONS = quick_path_names()  # chromafs-mount's options the quick path reads itself
RENAMED = deprecated_names()  # old flag -> new flag
OPTIONS = by_name()  # every name -> its option


def quick_options(argv: list[str]) -> tuple[dict[str, object], str] | None:
    """(the options given, each by its current name: a string, True/False for a switch or a
    toggle, a list for -o; the one positional) when argv is a plain request a mount server can
    take as it is; None when only the full parser can tell (help, unknown or abbreviated
    options, `--`, several positionals, serving in the foreground)."""
    values: dict[str, object] = {}
    positionals: list[str] = []
    at = 0
    while at < len(argv):
        arg = argv[at]
        at += 1
        if not arg.startswith("-") or arg == "-":
            positionals.append(arg)
            continue
        name, equals, value = arg.partition("=")
        if name in FLAGS and not equals:
            option = OPTIONS[name]
            values[option.name] = not name.startswith("--no-") or option.kind == "switch"
            continue
        if name not in VALUE_OPTIONS:
            return None
        if not equals:
            if at == len(argv) or (argv[at].startswith("-") and argv[at] != "-"):
                return None  # let argparse word the error
            value = argv[at]
            at += 1
        option = OPTIONS[name]
        if option.kind == "append":
            appended = values.setdefault(option.name, [])
            assert isinstance(appended, list)
            appended.append(value)
        else:
            values[option.name] = value
    return (values, positionals[0]) if len(positionals) == 1 else None


def request_options(given: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, object]:
    """What a session request carries of the options `given` (by their current names): the
    client's own left out, each path made absolute against this process's working directory,
    and the caller's environment read for the options it sets that were not given (the mount
    server reads none of the caller's environment, nor its working directory)."""
    out: dict[str, object] = {}
    for name, value in given.items():
        if name in CLIENT_ONLY:
            continue
        out[name] = absolute(OPTIONS[name], value) if OPTIONS[name].path and isinstance(value, str) and value else value
    for option in MOUNT_OPTIONS:
        if option.env and option.name not in out and option.name not in CLIENT_ONLY and environ.get(option.env):
            value = environ[option.env]
            out[option.name] = absolute(option, value) if option.path else value
    if "--chroma-path" not in out and "--chroma-url" not in out:  # config.chroma_location's variables
        if environ.get("CHROMAFS_CHROMA_URL"):
            out["--chroma-url"] = environ["CHROMAFS_CHROMA_URL"]
        elif environ.get("CHROMAFS_CHROMA_PATH"):
            out["--chroma-path"] = os.path.abspath(environ["CHROMAFS_CHROMA_PATH"])
    return out


def check_mountpoint(path: str) -> None:
    """The mountpoint must be a directory with nothing mounted on it; a dead chromafs mount
    there is cleaned first."""
    import errno

    try:
        os.stat(path)
        if os.path.ismount(path):
            os.statvfs(path)  # never answered from the kernel's caches: detects a dead daemon
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):  # daemon gone; aborted by its watchdog
            unmount_lazily(path)
            try:
                os.stat(path)
            except OSError as again:
                raise UsageError(f"{path}: stale mount could not be cleaned: {again.strerror}") from again
        else:
            raise UsageError(f"{path}: {exc.strerror}") from exc
    if not os.path.isdir(path):
        raise UsageError(f"{path}: not a directory")
    if os.path.ismount(path):
        raise UsageError(f"{path}: something is already mounted there")


def unmount_lazily(path: str) -> None:
    import subprocess

    subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, check=False)


def require_chroma_location(chroma_path: str | None, chroma_url: str | None) -> None:
    """Fail fast when no Chroma is given at all."""
    if not (
        chroma_path or chroma_url or os.environ.get("CHROMAFS_CHROMA_URL") or os.environ.get("CHROMAFS_CHROMA_PATH")
    ):
        raise UsageError("no Chroma given: use --chroma-path DIR or --chroma-url URL")


def _escaped(c: str) -> bool:
    return c < " " or "\ud800" <= c <= "\udfff"  # control characters; undecodable argv bytes


def _json_string(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    if any(_escaped(c) for c in out):
        out = "".join(f"\\u{ord(c):04x}" if _escaped(c) else c for c in out)
    return f'"{out}"'


def _json_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_json_value(v) for v in value) + "]"
    return _json_string(str(value))


def encode_request(mountpoint: str, options: Mapping[str, object], token: str | None) -> bytes:
    """The OpenSession line of serving/protocol.py (the same JSON its codec writes):
    {"op": "open_session", "mountpoint": ..., "options": {...}, "token": ...}."""
    fields = ", ".join(f"{_json_string(name)}: {_json_value(value)}" for name, value in options.items())
    token_json = "null" if token is None else _json_string(token)
    return (
        f'{{"op": "open_session", "mountpoint": {_json_string(os.path.abspath(mountpoint))}, '
        f'"options": {{{fields}}}, "token": {token_json}}}\n'
    ).encode()


def encode_search(
    options: Mapping[str, object], query: str, limit: int, token: str | None, embedder: str | None, rank: str
) -> bytes:
    """The Search line of serving/protocol.py (the same JSON its codec writes), without importing it."""
    import json

    request = {"op": "search", "options": dict(options), "query": query, "limit": limit, "token": token}
    return json.dumps({**request, "embedder": embedder, "rank": rank}).encode() + b"\n"


def answer_fields(line: bytes) -> dict[str, object]:
    """An answer's fields when it says ok; else its error raised as its kind (protocol.answer_of's
    reading, without importing it)."""
    import json

    from chromafs_fuse.errors import error_of

    try:
        answer = json.loads(line)
    except ValueError:
        raise error_of("unavailable", line.decode("utf-8", "replace").strip() or "no answer") from None
    if not isinstance(answer, dict):
        raise error_of("internal", "an answer that is not a JSON object")
    if answer.get("ok"):
        return answer
    raise error_of(str(answer.get("kind") or "internal"), str(answer.get("error") or "no reason given"))


def mount_server_socket(given: str | None, no_mountd: bool) -> tuple[str | None, bool]:
    """(the mount server to ask, whether to mount alone if it does not answer): the one given
    (--mountd, CHROMAFS_MOUNTD_SOCKET), else the host's when its socket is there, as `docker`
    uses its daemon's socket; (None, _) with --no-mountd or when the host runs none."""
    if no_mountd:
        return None, False
    if given:
        return given, False
    if os.path.exists(HOST_MOUNTD_SOCKET):
        return HOST_MOUNTD_SOCKET, True
    return None, False


def request_mount(
    socket_path: str, request: bytes, mountpoint: str, wait_s: float, fall_back: bool = False
) -> int | None:
    """Ask the server for a mount; 0 once it answers ok, 1 with one line otherwise. With
    `fall_back`, None when the server cannot be reached at all (the caller mounts alone)."""
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(5)
        try:
            conn.connect(socket_path)
        except OSError as exc:
            if fall_back and exc.errno in FALL_BACK_ERRNOS:
                return None
            raise
        conn.sendall(request)
        conn.shutdown(_socket.SHUT_WR)
        ok, reason, _kind = wait_for_answer(conn.fileno(), wait_s)
    except OSError as exc:
        print(f"chromafs-mount: cannot reach chromafs-mountd at {socket_path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if ok:
        return 0
    if os.path.ismount(mountpoint) and not reason.startswith(f"{os.path.abspath(mountpoint)} is already mounted"):
        unmount_lazily(mountpoint)
    print(f"chromafs-mount: {reason or 'the mount server closed the connection'}", file=sys.stderr)
    return 1


def server_argv(argv: list[str]) -> list[str]:
    """The arguments a serving process gets: the caller's minus the token, each option by its
    current name (the caller was told of an old one already)."""
    out: list[str] = []
    skip = False
    for at, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--":
            return out + argv[at:]
        if arg in ("--token", "--token-file"):
            skip = True
            continue
        if arg.startswith(("--token=", "--token-file=")):
            continue
        name, equals, value = arg.partition("=")
        out.append(f"{RENAMED[name]}{equals}{value}" if name in RENAMED else arg)
    return out


def warn_of_old_names(argv: list[str]) -> None:
    """One line on stderr for each old name among the options the quick path read (the full parser
    says it itself)."""
    for arg in argv:
        name = arg.partition("=")[0]
        if name in RENAMED:
            print(f"chromafs-mount: {name} is deprecated, use {RENAMED[name]}", file=sys.stderr)
