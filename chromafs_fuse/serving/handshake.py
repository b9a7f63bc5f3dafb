"""The readiness handshake between a serving process and whoever waits for it: `READY\n` once
the mount answers, else one line saying why not. Standard library only: the mount client
imports it on its fast path."""

from __future__ import annotations

import os
import select
import time

READY = b"READY\n"


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
