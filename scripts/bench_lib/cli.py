"""`scripts/bench`: arguments, machine facts, the run, and the report files."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_lib import csi_publish, multitenant, reingest, report, search_cli, search_quality
from bench_lib.corpus import REPO
from bench_lib.procs import become_subreaper
from bench_lib.runner import Run, run_corpus

ALL_SYSTEMS = ["tmpfs", "sandbox", "chromafs-embedded", "chromafs-server-redis", "chromafs-mountd"]
ALL_FIGURES = [
    "boot", "tools", "memory", "ingest", "sessions", "density", "mountd", "csi", "search", "search-cli", "reingest"
]  # fmt: skip
# figures with data or servers of their own: no corpus prepared for them
ALONE = ("mountd", "csi", "search", "search-cli", "reingest")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench", description="chromafs side by side with tmpfs and a sandbox copy")
    p.add_argument(
        "--corpus",
        action="append",
        help="sample, gen:N, gen:N@MEDIAN_BYTES or a docs folder (repeatable; default sample, gen:1000)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of generated corpora")
    p.add_argument("--boot-runs", type=int, default=20, help="mounts timed for boot p50/p90")
    p.add_argument("--mounts", type=int, default=8, help="concurrent mounts for the marginal PSS")
    p.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma list (tmpfs is always measured)")
    p.add_argument(
        "--figures",
        default=",".join(ALL_FIGURES),
        help="comma list of boot, tools, memory, ingest, sessions, density, mountd, csi, search, search-cli, reingest "
        "(ingest alone: no "
        "mounts, no systems; mountd, chromafs-mountd as a multi-tenant host, runs once over copies of the sample "
        "site: alone, no corpus is prepared; csi, chromafs-csi's NodePublishVolume p50/p90, alone too; search, "
        "recall@5 and MRR@10 of vector, BM25 and hybrid ranking on real docs trees' descriptions: alone too; "
        "search-cli, `chromafs search` from the command line through the host's mount server and alone: alone too; "
        "reingest, a big site with no blob store ingested and re-ingested after 2 changed pages while another "
        "site's readers and searches run, the version before (--baseline, default "
        f"{reingest.BEFORE}) side by side: alone too)",
    )
    p.add_argument("--reingest-docs", metavar="DIR", help=f"the reingest figure's docs ({reingest.DEFAULT_DOCS})")
    p.add_argument("--reingest-mib", type=int, default=200, help="the reingest figure's MiB of generated images")
    p.add_argument(
        "--density-sites",
        default="1,10,100,500",
        help="the density figure's steps: sites served at once (each with 2 reader classes)",
    )
    p.add_argument(
        "--mountd-sessions",
        type=int,
        default=10_000,
        metavar="N",
        help="the mountd figure's many-sessions case: N sessions over 200 classes (0: skip it)",
    )
    p.add_argument(
        "--serving-processes",
        type=int,
        metavar="N",
        help="chromafs-mountd --serving-processes of the sessions, density and mountd figures (default: none "
        "given, the server's own default: one per core)",
    )
    p.add_argument(
        "--baseline",
        metavar="REF",
        help="also measure the code at git REF (a temporary worktree), alternating with the current code, "
        "and compare every chromafs figure (not density)",
    )
    p.add_argument("--rounds", type=int, default=3, help="with --baseline: rounds of each version, alternated")
    p.add_argument("--json", type=Path, default=REPO / "docs/bench/results.json")
    p.add_argument("--png", type=Path, default=REPO / "docs/bench/ratios.png")
    p.add_argument("--keep", action="store_true", help="keep temp dirs (generated sites, Chroma data, logs)")
    args = p.parse_args(argv)
    args.corpus = args.corpus or ["sample", "gen:1000"]
    args.systems = [s for s in args.systems.split(",") if s]
    args.figures = [f for f in args.figures.split(",") if f]
    for name in args.systems:
        if name not in ALL_SYSTEMS:
            p.error(f"unknown system {name!r}")
    for name in args.figures:
        if name not in ALL_FIGURES:
            p.error(f"unknown figure {name!r}")
    try:
        args.density_sites = sorted({int(n) for n in args.density_sites.split(",") if n})
    except ValueError:
        p.error("--density-sites wants a comma list of numbers")
    if not args.density_sites or args.density_sites[0] < 1:
        p.error("--density-sites wants numbers of at least 1")
    if args.baseline and args.rounds < 2:
        p.error("--rounds must be at least 2: the spread between rounds is the yardstick")
    if args.boot_runs < 1 or args.mounts < 1:
        p.error("--boot-runs and --mounts must be at least 1")
    if args.serving_processes is not None and args.serving_processes < 1:
        p.error("--serving-processes must be at least 1")
    return args


def machine() -> dict[str, Any]:
    def first_line(argv: list[str]) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        return "?"

    def changed(folder: str) -> bool | None:
        """Whether the working tree's `folder` differs from the commit measured (None: no git)."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            argv = ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", folder]
            return bool(subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return None

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kb = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemTotal"))
    import chromadb

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "chromadb": chromadb.__version__,
        "grep": first_line(["grep", "--version"]),
        "rg": first_line(["rg", "--version"]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": first_line(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"]),
        "chromafs_fuse_changed": changed("chromafs_fuse"),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv[1:])
    command = shlex.join(argv)
    print(f"command: {command}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    become_subreaper()
    run = Run(args)
    results: dict[str, Any] = {"command": command, "machine": machine(), "corpora": []}
    print(f"machine: {results['machine']}", flush=True)
    try:
        if args.baseline:
            run.use_baseline(args.baseline)
            results["baseline"] = run.versions.describe() if run.versions else None
        if any(f not in ALONE for f in args.figures):  # the figures measured per corpus
            if "chromafs-server-redis" in args.systems or "density" in args.figures:
                run.start_servers()
            for index, spec in enumerate(args.corpus):
                results["corpora"].append(run_corpus(run, spec, index))
        if "mountd" in args.figures:
            results["mountd"] = multitenant.measure_mountd(run)
        if "csi" in args.figures:
            results["csi"] = csi_publish.measure(run)
        if "search" in args.figures:
            results["search"] = search_quality.measure(run)
        if "search-cli" in args.figures:
            results["search-cli"] = search_cli.measure(run)
        if "reingest" in args.figures:
            results["reingest"] = reingest.measure(run)
    except BaseException as exc:
        print(f"bench: FAILED: {exc.__class__.__name__}: {exc} (cleaning up)", file=sys.stderr, flush=True)
        raise
    finally:
        run.close()
    results["problems"] = run.problems
    results["incidents"] = [i for m in run.mounters for i in m.incidents]
    results["elapsed_s"] = round(time.monotonic() - run.started, 1)
    results["machine"]["loadavg_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
    print(report.text_report(results), flush=True)
    report.write_json(results, args.json)
    print(f"\nJSON: {args.json}")
    if report.write_png(results, args.png):
        print(f"PNG: {args.png}")
    else:
        print("PNG: skipped (no mounted systems measured, or matplotlib missing: pip install -e '.[bench]')")
    for incident in results["incidents"]:
        print(f"INCIDENT: {incident}", file=sys.stderr)
    for problem in run.problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if run.problems else 0
