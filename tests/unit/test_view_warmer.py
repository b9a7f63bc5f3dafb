"""The serving process's warm-up policy without a mount: a new class's first session waits for
its view's warm-up only when no other view warms (a burst of new classes is answered first)."""

from __future__ import annotations

import threading
from pathlib import Path

import trio
import trio.testing

from chromafs_fuse.serving.warm_up import WARMERS, ViewWarmer, WarmJob, WarmPace


def _tree(root: Path, files: int) -> Path:
    root.mkdir()
    for i in range(files):
        (root / f"page-{i}.md").write_bytes(b"x" * 100)
    return root


def test_only_a_view_warming_alone_is_waited_for(tmp_path: Path) -> None:
    release = threading.Event()
    seen: list[bool] = []
    held = _tree(tmp_path / "held", 1)

    def current_until_released() -> bool:
        release.wait(10)  # the first views' warm-ups stay busy until the test has offered the rest
        return True

    async def main() -> None:
        warmer = ViewWarmer()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(warmer.run)
            await trio.testing.wait_all_tasks_blocked()  # every warmer waits for a job
            first = WarmJob(str(held), set(), current_until_released)
            seen.append(warmer.offer(first))
            await trio.testing.wait_all_tasks_blocked()  # a warmer took it
            offered = [WarmJob(str(_tree(tmp_path / f"v{n}", 1)), set(), lambda: True) for n in range(WARMERS + 1)]
            for job in offered:  # beside a busy warmer, then queued behind all of them
                seen.append(warmer.offer(job))
            release.set()
            with trio.fail_after(10):
                for job in [first, *offered]:
                    await job.done.wait()
            await trio.testing.wait_all_tasks_blocked()  # every warmer waits for a job again
            seen.append(warmer.offer(WarmJob(str(_tree(tmp_path / "later", 2)), set(), lambda: True)))
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen == [True] + [False] * (WARMERS + 1) + [True]


def test_a_view_is_read_once_per_site(tmp_path: Path) -> None:
    root = _tree(tmp_path / "view", 3)
    warmed: set[int] = set()
    jobs = [WarmJob(str(root), warmed, lambda: True) for _ in range(2)]

    async def main() -> None:
        warmer = ViewWarmer()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(warmer.run)
            await trio.testing.wait_all_tasks_blocked()
            for job in jobs:
                warmer.offer(job)
                with trio.fail_after(10):
                    await job.done.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(warmed) == 3  # the second job found every inode read by the first


def test_the_pace_learns_what_warm_ups_and_listings_took_and_ignores_small_samples() -> None:
    pace = WarmPace()
    prior = pace.warm_s(80_000, 130_000_000)
    assert prior > 30  # a 100,000-page site: a class's first session never waits for it
    assert pace.warm_s(30, 600_000) < 0.1  # a small site's: it does
    pace.saw_warm(50, 1_000_000, 10.0)  # too few files to tell
    assert pace.warm_s(80_000, 130_000_000) == prior
    pace.saw_warm(2_000, 0, 0.1)  # ten times quicker than the prior (1 s): halfway there
    assert abs(pace.warm_s(2_000, 0) - 0.55) < 1e-9
    listing = pace.list_s(80_000)
    pace.saw_listing(80_000, 10.0)
    assert abs(pace.list_s(80_000) - (listing + 10.0) / 2) < 1e-9
    pace.saw_listing(10, 100.0)
    assert abs(pace.list_s(80_000) - (listing + 10.0) / 2) < 1e-9
