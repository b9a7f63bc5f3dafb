"""The reingest figure (issue 47): a big site ingested into `chroma run` with no blob store
(binary files kept in Chroma) while another site's readers and searches run on the same server,
for two versions of the code side by side in one run.

The site: a folder of real docs (`--reingest-docs`, default the mintlify corpus beside the
checkout; the sample site without it) plus `--reingest-mib` MiB of generated images (random
bytes, 50-700 KB each, seeded). Per version, on a Chroma server and a Redis of its own: the
neighbour (the sample site) is ingested; its reader (a page's chunks by `get`, as a mount's
Chroma tier asks on a miss) and searcher (a nearest-chunk `query`) run in a loop, each call with
a 10 s deadline, a busy answer asked again within it (the reader's own client,
chromafs_fuse/backends/chroma_http.py); the big site is ingested (its peak RSS: the ingest
process alone), mounted with `--refresh-interval 1`, two of its pages edited and the site
re-ingested: the re-ingest's time, and when the open mount shows both edits. The neighbour's
calls are counted per phase (the first ingest, the re-ingest): errors, p50, p99. The version
before is `--baseline REF`, default BEFORE (the commit before issue 47's re-ingest work); each
version's code is every child's PYTHONPATH (ingests, mounts).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_lib.measure import percentile
from harness.processes import INGEST, REPO, SAMPLE_SITE, mounted
from harness.servers import ChromaServer, RedisServer

BEFORE = "07765ec"  # the commit before issue 47's re-ingest work
DEFAULT_DOCS = REPO.parent / "shared" / "corpora" / "mintlify-docs"  # real docs beside the checkout
SITE, NEIGHBOUR = "big", "neighbour"
DEADLINE_S = 10.0
PACE_S = 0.1  # between one neighbour's calls
GOALS = {"peak_rss_mib": 512.0, "reingest_s": 3.0, "neighbour_p99_s": 1.0}
# Peak RSS of one child, in kB (ru_maxrss of the wrapper's children: the ingest alone).
PEAK_OF_CHILD = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(done.stderr)\n"
)


def build_site(docs: Path, mib: int, dest: Path, seed: int) -> dict[str, Any]:
    shutil.copytree(docs, dest, symlinks=False)
    rng = random.Random(seed)
    images, total, count = dest / "bench-images", 0, 0
    images.mkdir()
    while total < mib * 1024 * 1024:
        size = rng.randint(50_000, 700_000)
        (images / f"image-{count:04d}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + rng.randbytes(size))
        total, count = total + size + 8, count + 1
    files = [p for p in dest.rglob("*") if p.is_file()]
    return {"files": len(files), "images": count, "bytes": sum(p.stat().st_size for p in files)}


def two_pages(site: Path) -> list[Path]:
    pages = sorted(p for p in site.rglob("*.md*") if p.suffix in (".md", ".mdx") and "bench-images" not in p.parts)
    return [pages[len(pages) // 3], pages[2 * len(pages) // 3]]


class Neighbour:
    """Another site's reader and searcher on the same Chroma, each call timed and tagged with the
    phase it ran in."""

    def __init__(self, url: str) -> None:
        from chromafs_fuse.backends.chroma_http import HttpCollection
        from chromafs_fuse.names import TREE_RECORD_ID
        from chromafs_fuse.tree import parse_tree

        self.collection = HttpCollection.open(url, NEIGHBOUR, timeout_s=DEADLINE_S)
        tree = self.collection.get(ids=[TREE_RECORD_ID], include=["documents"])
        self.pages = sorted(k for k, e in parse_tree(tree["documents"][0]).entries.items() if e.blob is None)
        one = self.collection.get(where={"page_slug": self.pages[0]}, include=["embeddings"], limit=1)
        self.dimensions = len(one["embeddings"][0])
        self._query = self.collection._get_path.removesuffix("/get") + "/query"
        self.phase = "idle"
        self.calls: list[tuple[str, str, float, bool]] = []  # (phase, kind, seconds, ok)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True) for kind in ("read", "search")]

    def _call(self, kind: str, rng: random.Random) -> None:
        if kind == "read":
            self.collection.get(where={"page_slug": rng.choice(self.pages)}, include=["documents", "metadatas"])
        else:
            body = {
                "query_embeddings": [[rng.uniform(-1, 1) for _ in range(self.dimensions)]],
                "n_results": 5,
                "include": ["documents", "metadatas", "distances"],
            }
            self.collection.server.request("POST", self._query, body)

    def _loop(self, kind: str) -> None:
        rng = random.Random(kind)
        while not self._stop.is_set():
            phase, started, ok = self.phase, time.monotonic(), True
            try:
                self._call(kind, rng)
            except Exception:
                ok = False
            self.calls.append((phase, kind, time.monotonic() - started, ok))
            self._stop.wait(PACE_S)

    def __enter__(self) -> Neighbour:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(DEADLINE_S * 3)
        self.collection.close()

    def stats(self, phase: str) -> dict[str, Any]:
        times = [s for p, _, s, ok in self.calls if p == phase and ok]
        return {
            "calls": sum(1 for p, *_ in self.calls if p == phase),
            "errors": sum(1 for p, _, _, ok in self.calls if p == phase and not ok),
            "p50_s": round(percentile(times, 50), 3) if times else None,
            "p99_s": round(percentile(times, 99), 3) if times else None,
        }


def ingest_peak(source: Path, url: str, redis: str, collection: str) -> tuple[float, int]:
    argv = [sys.executable, "-c", PEAK_OF_CHILD, INGEST, str(source), "--site", collection, "--chroma-url", url]
    started = time.monotonic()
    done = subprocess.run([*argv, "--redis-url", redis, "--quiet"], capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    status, peak = done.stdout.split()
    if status != "0":
        raise RuntimeError(f"ingest of {source} failed ({status}): {done.stderr[-2000:]}")
    return seconds, int(peak)


def measure_version(root: Path, site: Path) -> dict[str, Any]:
    root.mkdir(parents=True)
    source = root / "site"
    shutil.copytree(site, source)
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as parts:
        chroma = parts.enter_context(ChromaServer(root / "chroma"))
        redis = parts.enter_context(RedisServer(root / "redis"))
        ingest_peak(SAMPLE_SITE, chroma.url, redis.url, NEIGHBOUR)
        neighbour = parts.enter_context(Neighbour(chroma.url))
        neighbour.phase = "first"
        out["first_ingest_s"], peak_kb = ingest_peak(source, chroma.url, redis.url, SITE)
        out["peak_rss_mib"] = round(peak_kb / 1024, 1)
        neighbour.phase = "idle"
        backend = ["--site", SITE, "--collection", SITE, "--chroma-url", chroma.url, "--redis-url", redis.url]
        mount = parts.enter_context(mounted(root / "mnt", *backend, "--refresh-interval", "1", "--no-mountd"))
        edited = two_pages(source)
        marker = f"edited by the reingest figure {time.time_ns()}"
        for page in edited:
            with page.open("a") as f:
                f.write(f"\n\n{marker}\n")
        neighbour.phase = "reingest"
        started = time.monotonic()
        out["reingest_s"], out["reingest_peak_rss_mib"] = ingest_peak(source, chroma.url, redis.url, SITE)
        out["reingest_peak_rss_mib"] = round(out["reingest_peak_rss_mib"] / 1024, 1)
        neighbour.phase = "idle"
        seen = [mount / page.relative_to(source) for page in edited]
        while not all(marker in p.read_text(errors="replace") for p in seen):
            if time.monotonic() - started > 120:
                raise RuntimeError("the open mount did not show the re-ingest within 120 s")
            time.sleep(0.05)
        out["mount_shows_s"] = round(time.monotonic() - started, 2)  # from the re-ingest's start
        out["first_ingest_s"] = round(out["first_ingest_s"], 2)
        out["reingest_s"] = round(out["reingest_s"], 2)
        out["neighbour_first"] = neighbour.stats("first")
        out["neighbour_reingest"] = neighbour.stats("reingest")
    return out


def measure(run: Any) -> dict[str, Any]:
    args = run.args
    docs = Path(args.reingest_docs) if args.reingest_docs else DEFAULT_DOCS
    if not docs.is_dir():
        docs = SAMPLE_SITE
    root = run.tmp / "reingest-figure"
    site = root / "site"
    run.say(f"reingest: building the site from {docs} and {args.reingest_mib} MiB of images")
    shape = build_site(docs, args.reingest_mib, site, args.seed)
    if run.versions is None:
        run.use_baseline(BEFORE)
    out: dict[str, Any] = {"docs": str(docs), "site": shape, "goals": GOALS, "versions": run.versions.describe()}
    for label in ("baseline", "current"):
        run.say(f"reingest: {label}")
        with run.versions.use(label):
            out[label] = measure_version(root / label, site)
    out["ratios"] = {
        key: round(out["current"][key] / out["baseline"][key], 3)
        for key in ("peak_rss_mib", "first_ingest_s", "reingest_s", "mount_shows_s")
        if out["baseline"][key]
    }
    return out


def text_lines(result: dict[str, Any]) -> list[str]:
    shape = result["site"]
    out = [
        f"  site: {result['docs']} + generated images: {shape['files']} files, {shape['images']} images,"
        f" {shape['bytes'] / 1e6:.0f} MB; chroma run, no blob store, Redis",
        f"  {'':34} {'before':>12} {'now':>12} {'now/before':>10}",
    ]

    def row(name: str, get: Any, ratio: str | None = None) -> None:
        before, now = get(result["baseline"]), get(result["current"])
        r = result["ratios"].get(ratio) if ratio else None
        out.append(f"  {name:34} {before!s:>12} {now!s:>12} {'' if r is None else f'{r:.2f}x':>10}")

    row("peak RSS of the ingest (MiB)", lambda v: v["peak_rss_mib"], "peak_rss_mib")
    row("first ingest (s)", lambda v: v["first_ingest_s"], "first_ingest_s")
    row("re-ingest, 2 pages changed (s)", lambda v: v["reingest_s"], "reingest_s")
    row("open mount shows them (s)", lambda v: v["mount_shows_s"], "mount_shows_s")
    for phase in ("first", "reingest"):
        key = f"neighbour_{phase}"
        row(f"neighbour during {phase}: errors", lambda v, k=key: f"{v[k]['errors']}/{v[k]['calls']}")
        row(f"neighbour during {phase}: p99 (s)", lambda v, k=key: v[k]["p99_s"])
    return out
