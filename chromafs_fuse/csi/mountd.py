"""The plugin's two questions to the node's mount server, on its socket, each with a deadline:
open a session (the JSON line `chromafs-mount` sends), and whether it answers at all."""

from __future__ import annotations

import socket

from chromafs_fuse.serving.handshake import request_line, wait_for_answer

CONNECT_TIMEOUT_S = 5.0


class MountdUnreachable(Exception):
    """The mount server does not answer on its socket; the message says where and why."""


def open_session(socket_path: str, argv: list[str], token: str | None, wait_s: float) -> str | None:
    """Ask for a session; None once it is bound, else the mount server's reason."""
    request = request_line(argv, token, "/")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(min(CONNECT_TIMEOUT_S, wait_s))
        try:
            conn.connect(socket_path)
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise MountdUnreachable(_unreachable(socket_path, exc)) from exc
        ok, reason = wait_for_answer(conn.fileno(), wait_s)
    return None if ok else reason or "the mount server closed the connection"


def answers(socket_path: str, wait_s: float = 2.0) -> bool:
    """Whether the mount server accepts a connection and closes it, as it does an empty request."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(wait_s)
        try:
            conn.connect(socket_path)
            conn.shutdown(socket.SHUT_WR)
            return conn.recv(1) == b""
        except OSError:
            return False


def _unreachable(socket_path: str, exc: OSError) -> str:
    why = exc.strerror or str(exc) or "timed out"
    return f"the node's mount server does not answer on {socket_path} ({why}): is chromafs-mountd running beside it?"
