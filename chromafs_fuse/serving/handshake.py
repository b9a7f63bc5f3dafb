"""The readiness handshake between a serving process and whoever waits for it: `READY\n` once
the mount answers, else one line saying why not; and the mount server's answer on its socket,
one JSON line like every socket of the server: `{"ok": true}` or `{"ok": false, "error": "..."}`.
Standard library only: the mount client imports it on its fast path (json only for an error)."""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

READY = b"READY\n"
OK_LINE = b'{"ok": true}\n'


def answer_line(error: str | None = None) -> bytes:
    """The mount server's answer to a request: OK_LINE, or the error as one JSON line."""
    if error is None:
        return OK_LINE
    import json

    return json.dumps({"ok": False, "error": error}).encode() + b"\n"


def request_line(argv: list[str], token: str | None, cwd: str) -> bytes:
    """A session request as the mount server reads it: {"argv": [...], "token": ..., "cwd": ...}
    (the mount client writes the same line with an encoder of its own, lighter to import)."""
    import json

    return json.dumps({"argv": argv, "token": token, "cwd": cwd}).encode() + b"\n"


def wait_for_answer(fd: int, wait_s: float) -> tuple[bool, str]:
    """Read the mount server's answer from `fd`: (True, "") for OK_LINE, else (False, why)."""
    data = _read_until(fd, wait_s, lambda data: data.endswith(b"\n"))
    if data is None:
        return False, "the mount server did not answer in time"
    if data == OK_LINE:
        return True, ""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return False, "the mount server closed the connection"
    import json

    try:
        answer = json.loads(text)
        return bool(answer.get("ok")), str(answer.get("error") or "")
    except (ValueError, AttributeError):
        return False, text


def wait_for_ready(fd: int, wait_s: float) -> tuple[bool, str]:
    """Read a daemon's or server's report from `fd`: (True, "") once it says READY, or
    (False, reason) when it reports a failure, closes, or the deadline passes."""
    data = _read_until(fd, wait_s, lambda data: data.startswith(READY))
    if data is None:
        return False, "the daemon did not become ready in time"
    if data.startswith(READY):
        return True, ""
    return False, data.decode("utf-8", "replace").strip()


def _read_until(fd: int, wait_s: float, done: Callable[[bytes], bool]) -> bytes | None:
    """What `fd` gives until `done` says so or it closes; None when `wait_s` passes first."""
    data = b""
    deadline = time.monotonic() + wait_s
    while not done(data):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data
