"""`chromafs-mount`'s entry point.

A session asked of `chromafs-mountd` is mostly this process's own start-up, so a plain request
(`--mountd SOCKET`, CHROMAFS_MOUNTD_SOCKET, or the host's mount server at its default socket
unless --no-mountd; no -h/--foreground) is read from argv without argparse, JSON, or the socket
module, and sent as the options it names (paths made absolute, the caller's environment read):
the server reads them as chromafs-mount's parser would and reports any mistake. Everything else
goes to cli/mount.py. Nothing heavier than C modules is imported here.
"""

from __future__ import annotations

import os
import sys

from chromafs_fuse.cli.mount_request import (
    check_mountpoint,
    encode_request,
    mount_server_socket,
    quick_options,
    request_mount,
    request_options,
    require_chroma_location,
    warn_of_old_names,
)
from chromafs_fuse.errors import UsageError
from chromafs_fuse.token_source import token_of

CliError = UsageError  # the name this module has always exported


def quick_request(argv: list[str]) -> int | None:
    """Send a plain mount server request; None when the full command line parser is needed."""
    parsed = quick_options(argv)
    if parsed is None:
        return None
    options, mountpoint = parsed
    given = str(options.get("--mountd") or os.environ.get("CHROMAFS_MOUNTD_SOCKET") or "")
    socket_path, fall_back = mount_server_socket(given, bool(options.get("--no-mountd")))
    if not socket_path:
        return None
    try:
        wait_s = float(str(options.get("--backend-timeout", "10"))) * 3 + 60
        token_file = options.get("--token-file")
        token = token_of(str(options.get("--token") or "") or None, str(token_file) if token_file else None)
        check_mountpoint(mountpoint)
        sent = request_options(options, os.environ)
        require_chroma_location(_text(sent.get("--chroma-path")), _text(sent.get("--chroma-url")))
        request = encode_request(mountpoint, sent, token)
    except ValueError:
        return None  # argparse words the error
    except UsageError as exc:
        warn_of_old_names(argv)
        print(f"chromafs-mount: {exc}", file=sys.stderr)
        return 1
    warn_of_old_names(argv)  # here, not before: a ValueError above leaves it to the full parser
    return request_mount(socket_path, request, mountpoint, wait_s, fall_back)  # None: mount alone


def _text(value: object) -> str | None:
    return str(value) if value else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    status = quick_request(argv)
    if status is not None:
        return status
    from chromafs_fuse.cli.mount import main as full_main

    return full_main(argv)


if __name__ == "__main__":
    sys.exit(main())
