"""The chromafs image's HEALTHCHECK: exit 0 when what the container serves answers.

- chromafs-mountd: when $CHROMAFS_MOUNTD_SOCKET is set, or the default socket
  /run/chromafs/mountd.sock exists, the server must accept a connection there and close it
  (it answers a connection that sends nothing by closing it: the probe of a health check).
  A socket file left by a killed server refuses the connection; a hung server never closes.
- otherwise, a mount (the image's entrypoint): a FUSE filesystem answers at
  $CHROMAFS_MOUNTPOINT (default /mnt/docs) and its root lists. Before the mount, statfs names
  the filesystem underneath (overlay, ext4, ...); after the daemon died, it fails with
  "Transport endpoint is not connected".

Standard library only; runs with the image's venv Python (docker/Dockerfile).
"""

from __future__ import annotations

import os
import socket
import sys

DEFAULT_SOCKET = "/run/chromafs/mountd.sock"


def mountd_answers(path: str, timeout: float = 4.0) -> str | None:
    """None when the server accepted a connection on `path` and closed it; else why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.shutdown(socket.SHUT_WR)  # an empty request: the server closes without a word
            if conn.recv(1024) != b"":
                return f"{path}: the server answered an empty request"
    except OSError as exc:
        return f"{path}: {exc}"
    return None


def mount_answers(path: str) -> str | None:
    """None when a FUSE filesystem is mounted at `path` and its root lists; else why not."""
    try:
        if not os.path.ismount(path):
            return f"{path}: not a mount point"
        with open("/proc/self/mountinfo", encoding="utf-8") as table:
            kinds = [line.split(" - ", 1)[1].split()[0] for line in table if line.split()[4] == path]
        if not kinds or not kinds[-1].startswith("fuse"):
            return f"{path}: not a FUSE mount ({kinds[-1] if kinds else 'unknown'})"
        os.listdir(path)
    except OSError as exc:
        return f"{path}: {exc}"
    return None


def main() -> int:
    sock = os.environ.get("CHROMAFS_MOUNTD_SOCKET")
    if sock or os.path.exists(DEFAULT_SOCKET):
        problem = mountd_answers(sock or DEFAULT_SOCKET)
    else:
        problem = mount_answers(os.environ.get("CHROMAFS_MOUNTPOINT") or "/mnt/docs")
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
