"""The `ingest` figure: chromafs-ingest's pages/s on a corpus, next to Chroma's own write floor.

Three timings in one run, each from a fresh process:
- first ingest into a new embedded Chroma directory (whole command: start-up, reading, chunking,
  embedding, writing, the tree record);
- the same command again on the unchanged folder;
- the floor: the very records the first ingest wrote (ids, documents, metadatas, embeddings, read
  back from its collection), upserted into a new directory with chromadb's own API in batches of the
  size ingest uses, timing only the upserts. No ingest through Chroma's API can write faster.

`measure` runs the floor in a fresh Python (`print_floor`), which prints {"seconds": ..., "records": ...}.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_lib.procs import run_checked
from harness.processes import BIN

SCRIPTS = Path(__file__).resolve().parents[1]


def chroma_dir(workdir: Path, site: str) -> Path:
    return workdir / f"{site}-ingest-speed"


def measure(source: Path, site: str, workdir: Path) -> dict[str, Any]:
    chroma = chroma_dir(workdir, site)
    report_path = workdir / f"{site}-ingest-report.json"
    argv = [str(BIN / "chromafs-ingest"), str(source), "--site", site, "--chroma-path", str(chroma), "--quiet"]
    first = run_checked([*argv, "--report", str(report_path)], "chromafs-ingest (first)", timeout=4 * 3600)
    report = json.loads(report_path.read_text())
    print(
        f"first ingest: {report['pages']} pages, {report['chunks_written']} chunks in {first.seconds:.1f} s",
        file=sys.stderr,
        flush=True,
    )  # kept in the log even if a later step fails
    again = run_checked(argv, "chromafs-ingest (unchanged)")
    paths = [str(SCRIPTS), str(SCRIPTS.parent)]
    script = f"import sys; sys.path[:0] = {paths!r}; import bench_lib.ingest_speed as m; m.print_floor()"
    floor_run = run_checked([sys.executable, "-c", script, str(chroma), site], "Chroma write floor", timeout=3600)
    floor = json.loads(floor_run.stdout)
    pages = int(report["pages"])
    return {
        "pages": pages,
        "chunks": int(report["chunks_written"]),
        "problems": len(report["problems"]),
        "first_s": round(first.seconds, 2),
        "pages_per_s": round(pages / first.seconds, 1),
        "unchanged_s": round(again.seconds, 2),
        "floor_s": round(floor["seconds"], 2),
        "floor_pages_per_s": round(pages / floor["seconds"], 1) if floor["seconds"] else None,
        "ingest_to_floor": round(first.seconds / floor["seconds"], 2) if floor["seconds"] else None,
    }


def figures(figure: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """The times `--baseline` compares between versions (lower is better)."""
    return {
        "first ingest": (figure["first_s"], "s"),
        "seconds per 1,000 pages": (1000 * figure["first_s"] / figure["pages"], "s"),
        "unchanged re-ingest": (figure["unchanged_s"], "s"),
    }


def text_line(figure: dict[str, Any]) -> str:
    return (
        f"ingest: {figure['pages']} pages ({figure['chunks']} chunks) in {figure['first_s']:.1f} s ="
        f" {figure['pages_per_s']:.0f} pages/s; Chroma's write floor for the same records"
        f" {figure['floor_s']:.1f} s = {figure['floor_pages_per_s']:.0f} pages/s"
        f" (ingest/floor {figure['ingest_to_floor']:.2f}x); unchanged re-ingest {figure['unchanged_s']:.2f} s"
    )


def _floor(chroma_dir: str, site: str) -> dict[str, float]:
    import chromadb
    from chromadb.config import Settings

    from chromafs_fuse.ingest.pipeline import UPSERT_BATCH
    from chromafs_fuse.names import FORMAT_FIELD, FORMAT_VERSION

    settings = Settings(anonymized_telemetry=False)
    source = chromadb.PersistentClient(chroma_dir, settings=settings).get_collection(site)
    records: dict[str, list[Any]] = {"ids": [], "documents": [], "metadatas": [], "embeddings": []}
    total = source.count()
    for offset in range(0, total, 5000):  # Chroma refuses one get of every record of a large collection
        page = source.get(include=["documents", "metadatas", "embeddings"], limit=5000, offset=offset)
        for field in records:
            records[field].extend(page[field])
    with tempfile.TemporaryDirectory(prefix="chromafs-floor-", dir="/tmp") as target_dir:
        client = chromadb.PersistentClient(target_dir, settings=settings)
        target = client.create_collection(
            site, embedding_function=None, metadata={"hnsw:space": "l2", FORMAT_FIELD: FORMAT_VERSION}
        )
        batch = min(UPSERT_BATCH, client.get_max_batch_size())
        count = len(records["ids"])
        started = time.perf_counter()
        for start in range(0, count, batch):
            end = start + batch
            target.upsert(
                ids=records["ids"][start:end],
                documents=records["documents"][start:end],
                metadatas=records["metadatas"][start:end],
                embeddings=records["embeddings"][start:end],
            )
        return {"seconds": time.perf_counter() - started, "records": count}


def print_floor() -> None:
    print(json.dumps(_floor(sys.argv[1], sys.argv[2])))
