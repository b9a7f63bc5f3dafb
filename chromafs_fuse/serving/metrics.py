"""The Prometheus endpoints: a standalone mount's (`MountCollector`: its status, `describe()`, read
at each scrape) and the mount server's (`SessionCollector`: its classes and sessions from a copy of
the session table taken under its lock, so a scrape never holds a session up, and what each class
served from the status file its serving process rewrites every two seconds). One endpoint
(`MetricsEndpoint`, `serve_metrics`): each scrape is answered on a worker thread of the loop. No
token or page content ever goes into them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from chromafs_fuse.serving.server.session_table import SessionTable
from chromafs_fuse.serving.status import runtime_dir

log = logging.getLogger("chromafs.metrics")
SCRAPE_TIMEOUT_S = 0.2  # a scraper that dawdles must not hold up mount requests
MAX_REQUEST_BYTES = 8192


def class_status(pid: int, path: str | None = None, read: dict[int, Any] | None = None) -> dict[str, Any]:
    """What a serving process last wrote about the view at `path` ({} if nothing yet); about
    itself without `path`. `read`: the status files read already in this scrape, by pid (a
    process serving a thousand views writes one file, read once)."""
    if read is not None and pid in read:
        status = read[pid]
    else:
        try:
            with open(os.path.join(runtime_dir(), f"{pid}.json")) as f:
                status = json.load(f)
        except (OSError, ValueError):
            status = {}
        if read is not None:
            read[pid] = status
    if not isinstance(status, dict) or status.get("pid") != pid:
        return {}
    views = status.get("views")
    if isinstance(views, dict):
        view = views.get(path)
        return view if isinstance(view, dict) else {}
    return status


class MountCollector:
    """A standalone mount's metrics: its status (`Mount.describe`), read at scrape time."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status  # not `describe`: a registry asks a collector's describe() for its metric names

    def collect(self) -> Iterator[Any]:
        data = self.status()
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
        yield _single(
            GaugeMetricFamily, "chromafs_cached_bytes", "Bytes in the in-process page cache", data["cached_bytes"]
        )
        yield _single(GaugeMetricFamily, "chromafs_visible_files", "Files visible on this mount", data["visible_files"])
        tree = GaugeMetricFamily("chromafs_tree_info", "The tree version served", labels=["version"])
        tree.add_metric([str(data.get("tree_version", ""))], 1)
        yield tree
        if "tree_applied_at" in data:
            yield _single(
                GaugeMetricFamily,
                "chromafs_tree_applied_timestamp_seconds",
                "When the tree was applied",
                data["tree_applied_at"],
            )
            yield _single(
                CounterMetricFamily,
                "chromafs_tree_switches",
                "Switches to a re-ingested tree",
                data["tree_switches"],
            )
            yield _single(
                GaugeMetricFamily,
                "chromafs_tree_last_switch_seconds",
                "How long the last switch took",
                data["last_switch_s"],
            )


class SessionCollector:
    """Metrics of the server's SessionTable (None: it keeps no class mounts), read at scrape time."""

    def __init__(self, table_of: Callable[[], SessionTable | None]) -> None:
        self.table_of = table_of

    def collect(self) -> Iterator[Any]:
        table = self.table_of() or SessionTable()
        yield _single(GaugeMetricFamily, "chromafs_mountd_classes", "Class mounts kept", len(table.classes))
        yield _single(GaugeMetricFamily, "chromafs_mountd_sessions", "Sessions open", len(table.sessions))
        for name, help_text, value in (
            ("chromafs_mountd_sessions_opened", "Sessions opened since the server started", table.binds),
            ("chromafs_mountd_sessions_expired", "Sessions ended by their token's expiry", table.expiries),
            ("chromafs_mountd_sessions_unmounted", "Sessions ended by an unmount", table.ended),
        ):
            yield _single(CounterMetricFamily, name, help_text, value)

        labels = ["class", "site", "reader"]
        sessions = GaugeMetricFamily("chromafs_class_sessions", "Sessions of a class mount", labels=labels)
        files = GaugeMetricFamily("chromafs_class_visible_files", "Files a class mount shows", labels=["class"])
        requests = CounterMetricFamily("chromafs_class_requests", "FUSE requests served", labels=["class", "op"])
        lookups = CounterMetricFamily(
            "chromafs_class_cache_lookups", "Page cache lookups", labels=["class", "tier", "result"]
        )
        pushed = CounterMetricFamily(
            "chromafs_class_pages_pushed", "Pages offered to the kernel's page cache", labels=["class", "outcome"]
        )
        read: dict[int, Any] = {}
        per_class = Counter(session.class_key for session in table.sessions.values())
        for mount in table.classes.values():
            sessions.add_metric([mount.key, mount.site, mount.reader], per_class[mount.key])
            status = class_status(mount.pid, mount.path, read)
            if not status:
                continue
            files.add_metric([mount.key], status.get("visible_files", 0))
            for op, count in sorted(status.get("requests", {}).items()):
                requests.add_metric([mount.key, op], count)
            for tier, (hits, misses) in status.get("caches", {}).items():
                lookups.add_metric([mount.key, tier, "hit"], hits)
                lookups.add_metric([mount.key, tier, "miss"], misses)
            for outcome, count in status.get("pages_pushed", {}).items():
                pushed.add_metric([mount.key, outcome], count)
        yield from (sessions, files, requests, lookups, pushed)

        started = GaugeMetricFamily(
            "chromafs_session_start_timestamp_seconds", "When a session began", labels=["mountpoint", "class"]
        )
        expires = GaugeMetricFamily(
            "chromafs_session_expiry_timestamp_seconds",
            "When a session's token expires (sessions whose token has no exp are not listed)",
            labels=["mountpoint", "class"],
        )
        for session in table.sessions.values():
            started.add_metric([session.mountpoint, session.class_key], session.started)
            if session.expires_at is not None:
                expires.add_metric([session.mountpoint, session.class_key], session.expires_at)
        yield from (started, expires)


def _single(family: Any, name: str, documentation: str, value: float) -> Any:
    metric = family(name, documentation)
    metric.add_metric([], value)
    return metric


class MetricsEndpoint:
    """A listening socket for `GET /metrics`; the server's loop calls `answer()` when it is
    readable."""

    def __init__(self, address: str, collector: Any) -> None:
        host, _, port = address.rpartition(":")
        self.listener = socket.create_server((host or "127.0.0.1", int(port)))
        self.listener.setblocking(False)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        log.info("metrics on http://%s:%s/metrics", host or "127.0.0.1", self.listener.getsockname()[1])

    def fileno(self) -> int:
        return self.listener.fileno()

    def answer(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            conn.settimeout(SCRAPE_TIMEOUT_S)
            try:
                request = b""
                while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                method, _, rest = request.partition(b" ")
                path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
                if method != b"GET" or path not in (b"/metrics", b"/"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                body = generate_latest(self.registry)
                head = (
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                conn.sendall(head.encode() + body)
            except OSError as exc:
                log.debug("a metrics scrape failed: %s", exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()


def mount_endpoint(address: str, describe: Callable[[], dict[str, Any]]) -> MetricsEndpoint:
    """A standalone mount's endpoint: its status, and the process's own figures (CPU, memory,
    descriptors, the collector's) under prometheus_client's usual names."""
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

    endpoint = MetricsEndpoint(address, MountCollector(describe))
    for own in (ProcessCollector, PlatformCollector, GCCollector):
        own(registry=endpoint.registry)
    return endpoint


async def serve_metrics(endpoint: MetricsEndpoint, pause_s: float) -> None:
    """Answer scrapes until cancelled, each on a worker thread (a scraper that dawdles holds the
    thread, never the loop); a failing scrape is logged and the endpoint pauses `pause_s`."""
    while True:
        await trio.lowlevel.wait_readable(endpoint.listener)
        try:
            await trio.to_thread.run_sync(endpoint.answer)
        except Exception:  # a bug in one scrape: logged; the endpoint goes on
            log.exception("the metrics endpoint failed")
            await trio.sleep(pause_s)
