"""One mount's Prometheus endpoint: its status, collected on each scrape. No token or page
content ever goes into it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("chromafs.metrics")


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

    REGISTRY.register(Collector())
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host or "127.0.0.1")
    log.info("metrics on http://%s:%s/metrics", host or "127.0.0.1", port)
