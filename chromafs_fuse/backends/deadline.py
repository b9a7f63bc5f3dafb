"""A blocking call that may hang (a dead or stopped server), given a deadline: run on a daemon
thread that is abandoned when the deadline passes. For calls made before a trio loop runs (at
mount time) or where there is none (ingest)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def with_deadline(fn: Callable[[], T], seconds: float) -> T:
    """`fn()`, or TimeoutError when it has not returned within `seconds`; its own errors pass through."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    worker = threading.Thread(target=target, name="chromafs-deadline", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g}s")
    if error:
        raise error[0]
    return result[0]
