"""How a serving process says why it cannot serve: one line, to the one waiting for it (its
ready fd) or on stderr, and in its log; a traceback only for what nobody expected."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys

from chromafs_fuse.errors import ChromafsError, kind_of, unexpected

log = logging.getLogger("chromafs.mount")


def report_failure(ready_fd: int | None, message: str, kind: str = "internal") -> int:
    """Say why: on stderr, or to whoever waits on `ready_fd` as a JSON line with the failure's
    kind (handshake.ready_report reads it); 1."""
    log.error("%s", message)
    if ready_fd is None:
        print(f"chromafs-mount: {message}", file=sys.stderr)
    else:
        with contextlib.suppress(OSError):
            os.write(ready_fd, json.dumps({"ok": False, "kind": kind, "error": message}).encode() + b"\n")
            os.close(ready_fd)
    return 1


def exit_now(status: int) -> None:
    """Leave without interpreter finalisation: a backend call abandoned at its deadline may
    still run in a worker thread inside native code (chromadb, boto3), and tearing the
    interpreter down under it can crash the process after a clean unmount."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def failure_text(exc: Exception) -> str:
    """The one line saying why a mount could not start (a ChromafsError's message; anything
    else is a bug, worded as one)."""
    if isinstance(exc, ChromafsError):
        return exc.message
    return f"cannot mount: {unexpected(exc)}"


def mount_failure(ready_fd: int | None, exc: Exception) -> int:
    """Report why a mount could not start (logged, and sent to `ready_fd` or printed); 1."""
    if not isinstance(exc, ChromafsError):
        log.error("cannot mount", exc_info=exc)
    return report_failure(ready_fd, failure_text(exc), kind_of(exc))
