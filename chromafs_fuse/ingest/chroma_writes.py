"""An ingest's calls to Chroma, retried when the server is slow or away for a moment.

Every call an ingest makes is idempotent (an upsert under a deterministic id, a delete, a
read), so a call that timed out or found the connection refused is simply made again, with
exponential backoff. After the last try the ingest stops with an error that names the call
(which batch, which pages); a re-run then writes only the chunks that are still missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from chromafs_fuse.backends.chroma_http import BUSY, ChromaHttpError, ChromaUnreachable
from chromafs_fuse.errors import Unavailable
from chromafs_fuse.options import INGEST_DEFAULTS

log = logging.getLogger("chromafs.ingest")
MAX_BACKOFF_S = 30.0
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, ConnectionError, TimeoutError)


class WriteFailed(Unavailable):
    """A call to Chroma failed on every try; the message names the call."""


def is_transient(exc: BaseException) -> bool:
    """A failure that another try may not meet: a timeout, a refused or dropped connection."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (*_TRANSIENT, ChromaUnreachable)):
            return True
        if isinstance(cause, ChromaHttpError) and cause.status in BUSY:  # still busy after its own retries
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def retried(
    what: str, method: Callable[..., Any], retries: int, sleep: Callable[[float], None] | None = None, **kwargs: Any
) -> Any:
    """`method(**kwargs)`, tried again up to `retries` times while it fails transiently."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "%s: %s; trying again in %.0f s (try %d of %d)",
            what,
            exc or "no reason given",
            wait,
            state.attempt_number + 1,
            retries + 1,
        )

    options: dict[str, Any] = {
        "stop": stop_after_attempt(retries + 1),
        "wait": wait_exponential(multiplier=1, max=MAX_BACKOFF_S),
        "retry": retry_if_exception(is_transient),
        "before_sleep": before_sleep,
        "reraise": True,
    }
    if sleep is not None:
        options["sleep"] = sleep
    try:
        for attempt in Retrying(**options):
            with attempt:
                return method(**kwargs)
    except Exception as exc:  # whatever Chroma raised on the last try: named in a WriteFailed
        tries = f"after {retries + 1} tries" if is_transient(exc) else "(not retried)"
        raise WriteFailed(f"{what} failed {tries}: {exc or 'no reason given'}") from exc
    raise AssertionError("unreachable")


class RetryingCollection:
    """A chromadb collection whose calls each name what they do and are retried."""

    def __init__(self, collection: Any, retries: int = INGEST_DEFAULTS["--retries"]) -> None:
        self.collection = collection
        self.retries = retries

    def upsert(self, what: str, **kwargs: Any) -> Any:
        return retried(what, self.collection.upsert, self.retries, **kwargs)

    def get(self, what: str, **kwargs: Any) -> Any:
        return retried(what, self.collection.get, self.retries, **kwargs)

    def delete(self, what: str, **kwargs: Any) -> Any:
        return retried(what, self.collection.delete, self.retries, **kwargs)
