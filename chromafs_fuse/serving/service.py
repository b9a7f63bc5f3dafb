"""Running as a service: systemd readiness, a status file per mount for
`chromafs status`, and an optional Prometheus endpoint. No token or page
content ever goes into any of them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from chromafs_fuse.serving.mounttable import mounts

log = logging.getLogger("chromafs.service")


M_ARENA_MAX = -8  # mallopt parameter, glibc's malloc.h


def limit_malloc_arenas(arenas: int = 1) -> None:
    """Keep glibc from giving each worker thread its own malloc arena. Pages pass through the
    backend threads; with an arena per thread, memory they free stays reserved in that arena,
    and an idle mount holds tens of megabytes it no longer uses. Call before threads start."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas)


def sd_notify(message: str) -> None:
    """Tell systemd about our state when run as a Type=notify unit."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode("utf-8"))


def runtime_dir() -> str:
    """Where mounts publish their status: /run/chromafs/mounts, else a per-user temp dir."""
    for base in ("/run/chromafs", os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chromafs-{os.getuid()}")):
        path = os.path.join(base, "mounts")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    return ""


def process_start(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None if there is no such process.
    With the pid it names one process for good: a pid alone is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[19])  # field 22; the split starts at field 3
    except (OSError, IndexError, ValueError):
        return None


def write_private_json(path: str, data: object) -> None:
    """Replace `path` with `data` as JSON in one step, readable by its owner only."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)


def utc_text(seconds: float | None) -> str:
    """A time for a log line: ISO 8601 in UTC, "-" for none."""
    return "-" if seconds is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class StatusFile:
    """A small JSON file describing this mount, rewritten every few seconds."""

    def __init__(self, describe: Callable[[], dict[str, Any]]) -> None:
        self.describe = describe
        directory = runtime_dir()
        self.path = os.path.join(directory, f"{os.getpid()}.json") if directory else ""
        self.pid_start = process_start(os.getpid())

    def write(self) -> None:
        if not self.path:
            return
        try:
            write_private_json(self.path, {**self.describe(), "pid_start": self.pid_start})
        except OSError as exc:
            log.debug("cannot write status file %s: %s", self.path, exc)

    def remove(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def read_statuses() -> list[dict[str, Any]]:
    """Status of every live chromafs mount of this machine that this user can see."""
    mounted = {entry.target: entry.source for entry in mounts() if entry.fstype == "fuse.chromafs"}
    statuses = []
    seen = set()
    directory = runtime_dir()
    for name in sorted(os.listdir(directory)) if directory else []:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                status = json.load(f)
            pid = int(status["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a file being written
        started = process_start(pid)
        if started is None or status.get("pid_start", started) != started:
            # Left by a daemon that was killed; its pid may belong to another process by now.
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if status.get("mountpoint") in mounted:
            statuses.append(status)
            seen.add(status["mountpoint"])
    for mountpoint, source in mounted.items():
        if mountpoint not in seen:
            statuses.append({"mountpoint": mountpoint, "site": source.partition(":")[2], "pid": None})
    return statuses


def start_metrics_server(address: str, collect: Callable[[], dict[str, Any]]) -> None:
    """Serve Prometheus metrics on host:port from a background thread."""
    from prometheus_client import start_http_server
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    class Collector:
        def collect(self) -> Any:
            data = collect()
            requests = CounterMetricFamily("chromafs_requests", "FUSE requests served", labels=["op"])
            for op, count in sorted(data["requests"].items()):
                requests.add_metric([op], count)
            yield requests
            cache = CounterMetricFamily("chromafs_cache_lookups", "Cache lookups", labels=["tier", "result"])
            for tier, (hits, misses) in data["caches"].items():
                cache.add_metric([tier, "hit"], hits)
                cache.add_metric([tier, "miss"], misses)
            yield cache
            errors = CounterMetricFamily("chromafs_backend_errors", "Failed backend calls", labels=["backend"])
            for backend, count in data["backend_errors"].items():
                errors.add_metric([backend], count)
            yield errors
            latency = CounterMetricFamily("chromafs_backend_seconds", "Time spent in backend calls", labels=["backend"])
            for backend, seconds in data["backend_seconds"].items():
                latency.add_metric([backend], seconds)
            yield latency
            per_op = HistogramMetricFamily(
                "chromafs_request_seconds", "Time the daemon spent on each FUSE request", labels=["op"]
            )
            for op, (buckets, total) in data.get("latency", {}).items():
                per_op.add_metric([op], buckets, total)
            yield per_op
            yield HistogramMetricFamily(
                "chromafs_read_seconds",
                "Latency of FUSE read requests that reach the daemon",
                buckets=data["read_latency"],
                sum_value=data["read_latency_sum_s"],
            )
            pushed = CounterMetricFamily(
                "chromafs_pages_pushed",
                "Pages offered to the kernel's page cache ahead of a read, by outcome",
                labels=["outcome"],
            )
            for outcome, count in data.get("pages_pushed", {}).items():
                pushed.add_metric([outcome], count)
            yield pushed
            yield single(
                GaugeMetricFamily, "chromafs_cached_bytes", "Bytes in the in-process page cache", data["cached_bytes"]
            )
            yield single(
                GaugeMetricFamily, "chromafs_visible_files", "Files visible on this mount", data["visible_files"]
            )
            tree = GaugeMetricFamily("chromafs_tree_info", "The tree version served", labels=["version"])
            tree.add_metric([str(data.get("tree_version", ""))], 1)
            yield tree
            if "tree_applied_at" in data:
                yield single(
                    GaugeMetricFamily,
                    "chromafs_tree_applied_timestamp_seconds",
                    "When the tree was applied",
                    data["tree_applied_at"],
                )
                yield single(
                    CounterMetricFamily,
                    "chromafs_tree_switches",
                    "Switches to a re-ingested tree",
                    data["tree_switches"],
                )
                yield single(
                    GaugeMetricFamily,
                    "chromafs_tree_last_switch_seconds",
                    "How long the last switch took",
                    data["last_switch_s"],
                )

    def single(family: Any, name: str, documentation: str, value: float) -> Any:
        """A metric with one unlabelled sample."""
        metric = family(name, documentation)
        metric.add_metric([], value)
        return metric

    REGISTRY.register(Collector())  # type: ignore[arg-type]
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host or "127.0.0.1")
    log.info("metrics on http://%s:%s/metrics", host or "127.0.0.1", port)


def uptime_since(started: float) -> float:
    return round(time.time() - started, 1)
