"""The plugin's questions to the node's mount server, on its socket, each with a deadline: open
a session (serving/protocol.py's OpenSession, as `chromafs-mount` sends it, or OpenPodSession for
a pod's service account), renew one (RenewSession), and whether it answers at all."""

from __future__ import annotations

import socket

from chromafs_fuse.errors import error_of
from chromafs_fuse.serving.handshake import wait_for_answer
from chromafs_fuse.serving.protocol import OpenPodSession, OpenSession, RenewSession, encode

CONNECT_TIMEOUT_S = 5.0


class MountdUnreachable(Exception):
    """The mount server does not answer on its socket; the message says where and why."""


def open_session(socket_path: str, request: OpenSession | OpenPodSession | RenewSession, wait_s: float) -> None:
    """Ask for a session (or its renewal): returns once it is bound (renewed); the server's refusal raised as its kind
    (errors.py: a site that does not exist is NotFound), MountdUnreachable when nobody answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(min(CONNECT_TIMEOUT_S, wait_s))
        try:
            conn.connect(socket_path)
            conn.sendall(encode(request))
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise MountdUnreachable(_unreachable(socket_path, exc)) from exc
        ok, reason, kind = wait_for_answer(conn.fileno(), wait_s)
    if not ok:
        raise error_of(kind, reason or "the mount server closed the connection")


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
