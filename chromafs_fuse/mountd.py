"""`chromafs-mountd`: a resident mount server that makes new mounts boot fast.

A fresh Python process spends most of a second importing trio, pyfuse3,
redis and the JWT stack before it can mount anything. The mount server pays
that once: it imports everything, then listens on a Unix socket. For each
request it forks a child that already has every module loaded (and shares
their memory with the server copy-on-write), and that child serves the mount
exactly as `chromafs-mount --foreground` would. Mounts outlive the server.

Only peers running as root or as the server's own user may ask for a mount.
The client (`chromafs-mount --mountd SOCKET`) reads the token itself, so file
permissions are checked as the caller, and sends it over the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import struct
import sys

import setproctitle

log = logging.getLogger("chromafs.mountd")
MAX_REQUEST_BYTES = 256 * 1024
DEFAULT_SOCKET = "/run/chromafs/mountd.sock"


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _read_request(conn: socket.socket) -> dict[str, object]:
    conn.settimeout(5)
    data = b""
    while len(data) <= MAX_REQUEST_BYTES:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError("request too large")
    request = json.loads(data)
    if not isinstance(request, dict) or not isinstance(request.get("argv"), list):
        raise ValueError("malformed request")
    return request


def _serve_in_child(conn: socket.socket, request: dict[str, object]) -> int:
    """In the forked child: become the mount's daemon."""
    from .daemon import run_daemon
    from .mount_cli import build_parser

    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir(str(request.get("cwd") or "/"))
    argv = [str(a) for a in request["argv"]]  # type: ignore[union-attr]
    args = build_parser().parse_args([*argv, "--foreground"])
    # Without this the child shows the server's command line, and `pkill chromafs-mountd` would take
    # every mount down with the server.
    setproctitle.setproctitle(f"chromafs-mount {os.path.abspath(args.mountpoint)} --site {args.site}")
    args.token = request.get("token") or None
    args.token_file = None
    conn.setblocking(True)
    return run_daemon(args, conn.detach(), background=True)


def serve_forever(socket_path: str) -> None:
    os.makedirs(os.path.dirname(socket_path) or ".", mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    os.chmod(socket_path, 0o600)
    server.listen(128)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        server.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("listening on %s", socket_path)
    try:
        while not stopping:
            try:
                conn, _ = server.accept()
            except OSError:
                if stopping:
                    break
                raise
            with conn:
                uid = _peer_uid(conn)
                if uid not in (0, os.getuid()):
                    log.warning("refused a mount request from uid %d", uid)
                    with contextlib.suppress(OSError):
                        conn.sendall(b"permission denied: only root or the server's user may mount")
                    continue
                try:
                    request = _read_request(conn)
                except (OSError, ValueError) as exc:
                    log.warning("bad mount request: %s", exc)
                    with contextlib.suppress(OSError):
                        conn.sendall(b"bad request")
                    continue
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        server.close()
                        code = _serve_in_child(conn, request)
                    finally:
                        logging.shutdown()
                        os._exit(code)
                log.info("mount request from uid %d: daemon pid %d", uid, pid)
    finally:
        with contextlib.suppress(OSError):
            server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    from .cli_common import setup_logging

    parser = argparse.ArgumentParser(prog="chromafs-mountd", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=os.environ.get("CHROMAFS_MOUNTD_SOCKET", DEFAULT_SOCKET))
    parser.add_argument("--log-file", help="log here (default: stderr)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-preload-chroma", action="store_true", help="do not import chromadb up front")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_file)
    import chromafs_fuse.daemon  # noqa: F401  - the whole serving stack, imported once

    if not args.no_preload_chroma:
        import chromadb  # noqa: F401  - no threads start at import, so forking stays safe
    serve_forever(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
