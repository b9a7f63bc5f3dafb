"""The readiness handshake between a serving process and whoever waits for it: `READY\n` once
the mount answers, else one line saying why not; and the mount server's answer on its socket,
one JSON line like every socket of the server: `{"ok": true}` or `{"ok": false, "error": "..."}`.
Standard library only: the mount client imports it on its fast path (json only for an error)."""

from __future__ import annotations

import os
import select
import time

READY = b"READY\n"
OK_LINE = b'{"ok": true}\n'


def answer_line(error: str | None = None) -> bytes:
    """The mount server's answer to a request: OK_LINE, or the error as one JSON line."""
    if error is None:
        return OK_LINE
    import json

    return json.dumps({"ok": False, "error": error}).encode() + b"\n"


def wait_for_answer(fd: int, wait_s: float) -> tuple[bool, str]:
    """Read the mount server's answer from `fd`: (True, "") for OK_LINE, else (False, why)."""
    ok, line = _read_line(fd, wait_s)
    if not ok:
        return False, line or "the mount server closed the connection"
    if line.encode() + b"\n" == OK_LINE:
        return True, ""
    import json

    try:
        answer = json.loads(line)
        return bool(answer.get("ok")), str(answer.get("error") or "")
    except (ValueError, AttributeError):
        return False, line.strip()


def _read_line(fd: int, wait_s: float) -> tuple[bool, str]:
    data = b""
    deadline = time.monotonic() + wait_s
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, "the mount server did not answer in time"
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return (bool(data), data.decode("utf-8", "replace").rstrip("\n"))
        data += chunk
    return True, data.decode("utf-8", "replace").rstrip("\n")


def wait_for_ready(fd: int, wait_s: float) -> tuple[bool, str]:
    """Read a daemon's or server's report from `fd`: (True, "") once it says READY, or
    (False, reason) when it reports a failure, closes, or the deadline passes."""
    message = b""
    deadline = time.monotonic() + wait_s
    while not message.startswith(READY):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, "the daemon did not become ready in time"
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        message += chunk
    if message.startswith(READY):
        return True, ""
    return False, message.decode("utf-8", "replace").strip()
