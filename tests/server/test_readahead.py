"""Directory read-ahead, seen from Redis: reading a directory's files in order fetches
each page once, in batches, and never stops to fetch pages one by one."""

from __future__ import annotations

import re
from pathlib import Path

from infra import RedisMonitor, RedisServer, ingest, mounted, run

FILES = 100


def test_reading_a_directory_in_order_fetches_pages_in_batches(
    redis_server: RedisServer, mnt: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    (site / "many").mkdir(parents=True)
    for i in range(FILES):
        (site / "many" / f"page-{i:03d}.md").write_text(f"# Page {i}\n\n" + f"line {i}\n" * (i + 1))
    chroma = tmp_path / "chroma"
    ingest(site, "--site", "readahead", "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    base = ["--site", "readahead", "--chroma-path", str(chroma), "--redis-url", redis_server.url]
    with mounted(tmp_path / "prime", *base, "--preload", "on"):
        run(["grep", "-rq", "never-matches", str(tmp_path / "prime")])  # every page into Redis

    with RedisMonitor(redis_server) as monitor:
        with mounted(mnt, *base, "--preload", "off"):
            for i in range(FILES):  # one reader, in order, like `cat many/*`
                name = f"page-{i:03d}.md"
                assert (mnt / "many" / name).read_bytes() == (site / "many" / name).read_bytes()
        seen = monitor.seen()
    fetches = [line for line in seen.splitlines() if re.search(r'"(MGET|GET)"', line) and ":page:" in line]
    fetched = re.findall(r":page:many/(page-\d+\.md)", "\n".join(fetches))
    assert sorted(fetched) == sorted(set(fetched)), "a page was fetched twice"
    assert len(set(fetched)) == FILES
    assert len(fetches) <= FILES // 16 + 1, f"{len(fetches)} fetches for {FILES} files: not batched"
