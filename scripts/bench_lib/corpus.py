"""A corpus: its source folder, ingested into both Chroma backends, and the anonymous view of it.

The visible set comes from the tree record chromafs wrote (decoded and pruned with chromafs's
own access rule for an anonymous principal); the tmpfs copy holds exactly those files.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_lib.gensite import MEDIAN_PAGE_BYTES, generate
from bench_lib.procs import run_checked
from harness.processes import BIN

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "chromafs_fuse" / "sample_site"


@dataclass
class Corpus:
    name: str
    site: str
    source: Path
    facts: dict[str, Any] = field(default_factory=dict)
    visible: dict[str, Any] = field(default_factory=dict)  # key -> chromafs PathEntry
    tmpfs_copy: Path | None = None
    visible_bytes: int = 0
    cat_sample: Path = Path("/dev/null")  # the file list "cat 50" reads, written once the visible set is known


def resolve(spec: str, index: int, seed: int, workdir: Path) -> Corpus:
    """`sample`, `gen:N` or `gen:N@BYTES` (generated now into workdir; BYTES: the median page size,
    default 6000) or a path to a docs folder."""
    site = f"bench{index}"
    if spec == "sample":
        return Corpus(spec, site, SAMPLE, {"kind": "bundled sample site"})
    if spec.startswith("gen:"):
        count, _, median = spec[4:].partition("@")
        pages = int(count)
        median_bytes = int(median) if median else MEDIAN_PAGE_BYTES
        started = time.perf_counter()
        made = generate(workdir / f"gen-{pages}", pages, seed, median_bytes)
        facts = {"kind": "generated", "seed": seed, "generate_s": round(time.perf_counter() - started, 2)}
        facts["median_page_bytes"] = median_bytes
        facts.update(pages=made.pages, dirs=made.dirs, bytes=made.bytes)
        return Corpus(spec, site, made.root, facts)
    path = Path(spec).expanduser().resolve()
    if not path.is_dir():
        raise SystemExit(f"bench: --corpus {spec!r} is neither sample, gen:N nor a directory")
    return Corpus(spec, site, path, {"kind": "folder"})


def ingest(corpus: Corpus, backend_args: list[str]) -> float:
    argv = [str(BIN / "chromafs-ingest"), str(corpus.source), "--site", corpus.site, "--quiet", *backend_args]
    return run_checked(argv, f"chromafs-ingest {corpus.name}").seconds


def tree_document(chroma_path: Path, site: str) -> str:
    """The site's tree record, as stored in the embedded Chroma."""
    from chromafs_fuse.backends.chroma_store import ChromaLocation, ChromaPages

    return ChromaPages.open(ChromaLocation(path=str(chroma_path), collection=site)).load_tree_document()[0]


def load_visible(corpus: Corpus, chroma_path: Path) -> None:
    """Read the tree record from the embedded Chroma and keep what an anonymous reader sees."""
    from chromafs_fuse.access import Principal, visible_entries
    from chromafs_fuse.tree import parse_tree

    document = tree_document(chroma_path, corpus.site)
    tree = parse_tree(document)
    corpus.facts["tree_record_bytes"] = len(document)
    corpus.visible = visible_entries(tree.entries, Principal.anonymous())
    dirs = {k.rsplit("/", i)[0] for k in corpus.visible for i in range(1, k.count("/") + 1)}
    corpus.facts.update(tree_files=len(tree.entries), visible_files=len(corpus.visible), visible_dirs=len(dirs))


def copy_visible(corpus: Corpus, dest: Path) -> float:
    """Copy the visible files from the source folder to dest (on /dev/shm): the tmpfs system."""
    started = time.perf_counter()
    total = 0
    for key in sorted(corpus.visible):
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(corpus.source / key, target)
        total += target.stat().st_size
    dest.mkdir(parents=True, exist_ok=True)
    corpus.tmpfs_copy, corpus.visible_bytes = dest, total
    corpus.facts["visible_bytes"] = total
    return time.perf_counter() - started
