"""Counters kept on the hot path: cheap, lock-free (the trio loop is single-threaded)."""

from __future__ import annotations

import bisect

LATENCY_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)


class LatencyHistogram:
    """Cumulative-at-export histogram with fixed buckets (Prometheus style)."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
