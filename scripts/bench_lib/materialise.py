"""The sandbox approach: copy the site a reader may see out of Chroma into a directory.

Run as its own process (`python materialise.py --chroma-path P --site S DEST`) so its wall time
includes what a sandbox pays: start Python, open Chroma, read the tree, fetch every chunk of every
visible page (batched `$in` on the page field), sort by chunk index, join with "\\n", write files.
Prints a JSON breakdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BATCH_PAGES = 200


def materialise(chroma_path: str, site: str, dest: Path) -> dict[str, float | int]:
    started = time.perf_counter()
    import chromadb
    from chromadb.config import Settings

    from chromafs_fuse.access import Principal, visible_entries
    from chromafs_fuse.backends.blobstore import BlobReader
    from chromafs_fuse.backends.chroma_store import TREE_RECORD_ID
    from chromafs_fuse.tree import parse_tree

    client = chromadb.PersistentClient(path=chroma_path, settings=Settings(anonymized_telemetry=False))
    collection = client.get_collection(site, embedding_function=None)
    opened = time.perf_counter()
    tree_doc = collection.get(ids=[TREE_RECORD_ID], include=["documents"])["documents"][0]
    visible = visible_entries(parse_tree(tree_doc).entries, Principal.anonymous())
    pages = sorted(k for k, e in visible.items() if e.blob is None)
    texts: dict[str, dict[int, str]] = {}
    chunks = 0
    for start in range(0, len(pages), BATCH_PAGES):
        slugs = [visible[k].source_key for k in pages[start : start + BATCH_PAGES]]
        got = collection.get(where={"page_slug": {"$in": slugs}}, include=["documents", "metadatas"])
        for doc, meta in zip(got["documents"], got["metadatas"], strict=True):
            texts.setdefault(str(meta["page_slug"]), {})[int(meta["chunk_index"])] = doc
            chunks += 1
    fetched = time.perf_counter()
    written = 0
    blobs = BlobReader()
    for key, entry in visible.items():
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.blob is not None:
            data = blobs.read_range(entry.blob.url, 0, entry.blob.size)
        else:
            parts = texts.get(entry.source_key, {})
            data = "\n".join(parts[i] for i in sorted(parts)).encode("utf-8")
        target.write_bytes(data)
        written += len(data)
    done = time.perf_counter()
    return {
        "files": len(visible),
        "chunks": chunks,
        "bytes": written,
        "import_open_s": opened - started,
        "fetch_s": fetched - opened,
        "write_s": done - fetched,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--chroma-path", required=True)
    parser.add_argument("--site", required=True)
    args = parser.parse_args()
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    print(json.dumps(materialise(args.chroma_path, args.site, args.dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
