"""Loads in flight, by key: concurrent readers of one key wait for one load (trio, one loop)."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

import trio


class Claim:
    """The keys one load has taken; releasing it (or leaving its `with`) wakes their waiters."""

    def __init__(self, loads: dict[str, trio.Event], keys: list[str]) -> None:
        self.keys = keys
        self._loads = loads  # the InFlight's, shared
        self._done = trio.Event()
        for key in keys:
            loads[key] = self._done

    def release(self) -> None:
        if self._done.is_set():
            return
        for key in self.keys:
            if self._loads.get(key) is self._done:
                del self._loads[key]
        self._done.set()

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


class InFlight:
    def __init__(self) -> None:
        self._loads: dict[str, trio.Event] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._loads

    def claim(self, keys: Iterable[str]) -> Claim:
        """Take the keys not being loaded already for one load; the claim names those it took."""
        return Claim(self._loads, [key for key in dict.fromkeys(keys) if key not in self._loads])

    async def wait(self, key: str) -> None:
        """Until the load that holds `key` ends (at once if none does); then look for its result."""
        done = self._loads.get(key)
        if done is not None:
            await done.wait()
