"""The search-cli figure (issue 48): `chromafs search` from the command line, answered by the
host's mount server (warm: its models, vectors and BM25 index loaded once) side by side with the
same command alone (`--no-mountd`: a process that loads them for each query), in one run.

The sample site is ingested into an embedded Chroma with the default embedder; a mount server is
started; each query (a page's title) is asked through it QUERIES times over and alone ALONE_RUNS
times. Each run is a fresh `chromafs search --json` process timed from spawn to exit; the first
through the server (which loads the site) is left out. Both answers must be the same pages in the
same order.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench_lib.measure import percentile
from bench_lib.procs import run_checked, run_timed
from harness.processes import BIN, SAMPLE_SITE
from harness.servers import MountServer

SITE = "acme"
QUERIES = 20
ALONE_RUNS = 5
GOAL_P90_MS = 100.0
TITLE = re.compile(r'^title:\s*"?([^"\n]+)"?\s*$', re.MULTILINE)


def titles(site: Path, count: int) -> list[str]:
    found = []
    for page in sorted(site.rglob("*.md*")):
        match = TITLE.search(page.read_text(encoding="utf-8", errors="replace"))
        if match:
            found.append(match.group(1).strip())
    return found[:count]


def measure(run: Any) -> dict[str, Any]:
    work = run.tmp / "search-cli"
    chroma = work / "chroma"
    run_checked([str(BIN / "chromafs-ingest"), str(SAMPLE_SITE), "--site", SITE, "--chroma-path", str(chroma),
                 "--quiet"], "chromafs-ingest sample")  # fmt: skip
    queries = titles(SAMPLE_SITE, QUERIES)
    base = [str(BIN / "chromafs"), "search", "--json", "--site", SITE, "--chroma-path", str(chroma)]
    out: dict[str, Any] = {"queries": len(queries), "goal_p90_ms": GOAL_P90_MS}
    (work / "server").mkdir()
    server = MountServer(work / "server")
    server.start()
    try:
        through = [*base, "--mountd", str(server.socket)]
        first = run_timed([*through, queries[0]])
        out["first_through_server_ms"] = round(first.seconds * 1000, 1)
        warm, answers = [], {}
        for query in queries:
            done = run_timed([*through, query])
            if done.returncode != 0:
                run.problems.append(f"search-cli: through the server, {query!r} failed: {done.stderr[-300:]!r}")
                continue
            warm.append(done.seconds * 1000)
            answers[query] = pages(done.stdout)
    finally:
        server.stop()
    alone, differ = [], 0
    for query in queries[:ALONE_RUNS]:
        done = run_timed([*base, "--no-mountd", query])
        if done.returncode != 0:
            run.problems.append(f"search-cli: alone, {query!r} failed: {done.stderr[-300:]!r}")
            continue
        alone.append(done.seconds * 1000)
        differ += pages(done.stdout) != answers.get(query)
    out["through_server_ms"] = {"p50": round(percentile(warm, 50), 1), "p90": round(percentile(warm, 90), 1)}
    out["alone_ms"] = {"p50": round(percentile(alone, 50), 1), "p90": round(percentile(alone, 90), 1)}
    out["ratio_p50"] = round(out["alone_ms"]["p50"] / out["through_server_ms"]["p50"], 1)
    out["answers_that_differ"] = differ
    out["met"] = out["through_server_ms"]["p90"] <= GOAL_P90_MS and differ == 0
    if differ:
        run.problems.append(f"search-cli: {differ} queries answered otherwise through the server than alone")
    for line in text_lines(out):
        run.say(f"search-cli:{line}")
    return out


def pages(stdout: bytes) -> list[str]:
    """The pages of a `chromafs search --json` answer (a JSON line each), in order."""
    return [json.loads(line)["path"] for line in stdout.decode().splitlines() if line.strip()]


def text_lines(out: dict[str, Any]) -> list[str]:
    warm, alone = out["through_server_ms"], out["alone_ms"]
    return [
        f" {out['queries']} queries, each a fresh `chromafs search` process: through the mount server "
        f"p50 {warm['p50']} ms, p90 {warm['p90']} ms (goal p90 <= {out['goal_p90_ms']:.0f} ms: "
        f"{'met' if out['met'] else 'NOT met'}); alone p50 {alone['p50']} ms, p90 {alone['p90']} ms "
        f"({out['ratio_p50']}x); the server's first (loading the site) {out['first_through_server_ms']} ms; "
        f"answers that differ: {out['answers_that_differ']}",
    ]
