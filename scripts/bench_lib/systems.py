"""The systems under test. Each hands out a fresh root to run tools in, and takes it back.

`extra_s` is what the fresh root cost before any tool ran: the materialise time for the sandbox,
zero for the others (chromafs boot is its own figure).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from bench_lib.mounts import Mounter
from harness.processes import child_env
from harness.servers import RedisServer


@dataclass
class Fresh:
    root: Path
    extra_s: float = 0.0
    pid: int | None = None  # the chromafs daemon
    info: dict[str, Any] = field(default_factory=dict)


class System(Protocol):
    name: str

    def before(self) -> None: ...

    def fresh(self) -> Fresh: ...

    def release(self, fresh: Fresh) -> None: ...


@dataclass
class Tmpfs:
    copy: Path
    name: str = "tmpfs"

    def before(self) -> None:
        return None

    def fresh(self) -> Fresh:
        return Fresh(self.copy)

    def release(self, fresh: Fresh) -> None:
        return None


@dataclass
class Sandbox:
    chroma_path: Path
    site: str
    workdir: Path
    name: str = "sandbox"
    count: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)

    def before(self) -> None:
        return None

    def fresh(self) -> Fresh:
        self.count += 1
        dest = self.workdir / f"sandbox-{self.count}"
        script = Path(__file__).with_name("materialise.py")
        argv = [sys.executable, str(script), str(dest), "--chroma-path", str(self.chroma_path), "--site", self.site]
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, timeout=1800, env=child_env(), stdin=subprocess.DEVNULL)
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"materialise failed: {proc.stderr.decode(errors='replace')[-2000:]}")
        info = json.loads(proc.stdout)
        info["wall_s"] = took
        self.runs.append(info)
        return Fresh(dest, took, info=info)

    def release(self, fresh: Fresh) -> None:
        shutil.rmtree(fresh.root, ignore_errors=True)


@dataclass
class Chromafs:
    """A chromafs backend; `before` runs ahead of each mount (flush Redis, or make sure it is warm)."""

    name: str
    mounter: Mounter
    redis: RedisServer | None = None
    shared: str = ""  # "", "cold" or "warm"
    tree_doc: str = ""
    boot_tree_sources: list[str] = field(default_factory=list)

    def before(self) -> None:
        """Untimed: flush Redis (shared cache cold) or put the tree back if it expired (warm)."""
        if self.redis is None:
            return
        if self.shared == "cold":
            self.redis.flushall()
        elif self.shared == "warm":
            self.ensure_tree()

    def tree_key(self) -> str:
        from chromafs_fuse.backends.redis_cache import RedisCache

        site = self.mounter.site
        return RedisCache("redis://unused").tree_key(site, site)

    def ensure_tree(self) -> None:
        """Keep the tree (and its version key) in Redis: they live --tree-ttl (300 s) and a long run
        outlasts that."""
        from chromafs_fuse.tree import tree_version

        assert self.redis is not None
        client = redis.Redis.from_url(self.redis.url)
        key, version_key = self.tree_key(), self.tree_key() + "-version"
        if not client.exists(key) or not client.exists(version_key):
            client.set(key, self.tree_doc.encode(), ex=300)
            client.set(version_key, tree_version(self.tree_doc).encode(), ex=300)

    def fresh(self) -> Fresh:
        point, took = self.mounter.mount()
        return Fresh(point, 0.0, self.mounter.pid(point), {"mount_s": took})

    def release(self, fresh: Fresh) -> None:
        log = self.mounter.log_text(fresh.root)
        if "handed over by the mount server" in log:
            self.boot_tree_sources.append("mount server")
        elif "loaded from Redis" in log:
            self.boot_tree_sources.append("redis")
        else:
            self.boot_tree_sources.append("chroma")
        self.mounter.unmount(fresh.root)

    def wait_prefetch(self, fresh: Fresh, wait_s: float = 300.0) -> bool:
        """Wait (bounded) for the daemon's background prefetch to finish; False if it did not."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            log = self.mounter.log_text(fresh.root)
            if "preloaded" in log or "preload stopped" in log:
                return True
            time.sleep(0.1)
        return False
