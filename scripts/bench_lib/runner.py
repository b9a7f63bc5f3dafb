"""One benchmark run: the servers it starts, each corpus measured on each system, and cleanup."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench_lib import baseline, density, ingest_speed, measure, report, sessions
from bench_lib import corpus as corpora
from bench_lib.mounts import Mounter
from bench_lib.procs import run_timed
from bench_lib.systems import Chromafs, Sandbox, System, Tmpfs
from harness.processes import mounts_under, unmount
from harness.servers import ChromaServer, MountServer, RedisServer

PREFETCH_AUTO_MAX = 16 * 1024 * 1024  # --preload auto: min(--preload-max-bytes, --cache-bytes / 2)
SANDBOX_BOOT_RUNS = 5


class Run:
    """Everything one invocation starts, so `close` can take it all down."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="chromafs-bench-", dir="/tmp"))
        self.shm = Path(tempfile.mkdtemp(prefix="chromafs-bench-", dir="/dev/shm"))
        self.mounters: list[Mounter] = []
        self.chroma: ChromaServer | None = None
        self.redis: RedisServer | None = None
        self.mountds: dict[str, MountServer] = {}  # by code version ("current" without --baseline)
        self.versions: baseline.CodeVersions | None = None
        self.started = time.monotonic()
        self.problems: list[str] = []

    @property
    def mountd_socket(self) -> Path:
        """Where chromafs-mountd listens: with --baseline, a link to the version in use's."""
        return self.tmp / "mountd-active.sock" if self.versions else self.mountds["current"].socket

    def use_baseline(self, ref: str) -> None:
        self.versions = baseline.CodeVersions(ref, self.tmp)
        self.say(f"baseline {ref} = {self.versions.commit[:12]} checked out in {self.versions.tree}")

        def point_mountd(label: str) -> None:
            if label in self.mountds:
                self.mountd_socket.unlink(missing_ok=True)
                self.mountd_socket.symlink_to(self.mountds[label].socket)

        self.versions.hooks.append(point_mountd)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)

    def start_servers(self) -> None:
        self.chroma = ChromaServer(self.tmp / "chroma-server")
        self.chroma.start()
        self.redis = RedisServer(self.tmp)
        self.redis.start()
        if "chromafs-mountd" in self.args.systems:
            for label in baseline.VERSIONS if self.versions else ["current"]:
                folder = self.tmp / f"mountd-{label}"
                folder.mkdir()
                # a daemon per mount: the "sessions" figure shares; `use` links mountd_socket to it
                self.mountds[label] = MountServer(folder, isolated=True)
                with self.versions.use(label) if self.versions else contextlib.nullcontext():
                    self.mountds[label].start()
        self.say(
            f"chroma run on {self.chroma.url} (pid {self.chroma.proc and self.chroma.proc.pid}), "
            f"redis-server on {self.redis.url} (pid {self.redis.proc and self.redis.proc.pid})"
        )

    def mounter(self, site: str, backend: list[str], label: str) -> Mounter:
        made = Mounter(site, backend, self.tmp / "mnt", label)
        (self.tmp / "mnt").mkdir(exist_ok=True)
        self.mounters.append(made)
        return made

    def close(self) -> None:
        for mounter in self.mounters:
            with contextlib.suppress(Exception):
                mounter.unmount_all()
        for point in mounts_under(self.tmp):
            unmount(point)
        for server in (*self.mountds.values(), self.chroma, self.redis):
            if server is not None:
                server.stop()
        if self.versions is not None:
            self.versions.remove()
        leftover = mounts_under(self.tmp)
        if leftover:
            self.problems.append(f"still mounted after cleanup: {leftover}")
        if self.args.keep:
            self.say(f"kept {self.tmp} and {self.shm}")
        elif not leftover:
            shutil.rmtree(self.tmp, ignore_errors=True)
            shutil.rmtree(self.shm, ignore_errors=True)


def du_kb(path: Path) -> int:
    return int(run_timed(["du", "-sk", str(path)]).stdout.split()[0])


def measure_system(run: Run, system: System, corpus: corpora.Corpus, expected: dict[str, str] | None) -> dict[str, Any]:
    args, out = run.args, {}
    if "boot" in args.figures:
        if isinstance(system, Chromafs):
            system.boot_tree_sources.clear()
        # A sandbox "boot" is a whole materialise (tens of seconds on a large site): fewer runs.
        runs = min(args.boot_runs, SANDBOX_BOOT_RUNS) if isinstance(system, Sandbox) else args.boot_runs
        out["boot"] = measure.boot(system, runs)
        if isinstance(system, Chromafs):
            out["boot"]["tree_from"] = {s: system.boot_tree_sources.count(s) for s in set(system.boot_tree_sources)}
        run.say(
            f"{corpus.name} {system.name}: boot p50 {report.fmt(out['boot']['p50_s'], 's')}, "
            f"p90 {report.fmt(out['boot']['p90_s'], 's')}"
        )
    if "tools" in args.figures:
        out["tools"] = measure.tools(system, expected, corpus.cat_sample)
        for name, entry in out["tools"].items():
            if entry.get("matches_tmpfs") is False:
                problem = f"{corpus.name} {system.name}: {name!r} output differs from tmpfs"
                run.problems.append(problem)
                print(f"MISMATCH: {problem}", file=sys.stderr)
        summary = ", ".join(
            f"{n} {report.fmt(e['cold_s'], 's')}/{report.fmt(e['warm_s'], 's')}" for n, e in out["tools"].items()
        )
        run.say(f"{corpus.name} {system.name}: cold/warm {summary}")
    if "memory" in args.figures:
        if isinstance(system, Chromafs):
            prefetch = corpus.visible_bytes <= PREFETCH_AUTO_MAX
            out["memory"] = measure.memory(system, args.mounts, prefetch)
            m = out["memory"]
            run.say(
                f"{corpus.name} {system.name}: PSS {m['after_grep_kb']['pss'] / 1024:.1f} MiB, marginal "
                f"{(m['marginal_pss_kb'] or 0) / 1024:.1f} MiB, {m['answered_ls']}/{m['mounts']} answered ls"
            )
            if m["answered_ls"] != m["mounts"]:
                run.problems.append(f"{corpus.name} {system.name}: only {m['answered_ls']}/{m['mounts']} answered ls")
        elif isinstance(system, Tmpfs):
            out["memory"] = {"copy_kb": du_kb(system.copy)}
    return out


def run_corpus(run: Run, spec: str, index: int) -> dict[str, Any]:
    args = run.args
    corpus = corpora.resolve(spec, index, args.seed, run.tmp)
    run.say(f"corpus {spec}: {corpus.source}")
    speed = None
    if "ingest" in args.figures and run.versions is not None:
        rounds = itertools.count()  # each ingest, of either version, into a Chroma of its own

        def ingest_once() -> dict[str, Any]:
            workdir = run.tmp / f"ingest-{next(rounds)}"
            workdir.mkdir()
            return ingest_speed.measure(corpus.source, corpus.site, workdir)

        speed = _compared(run, f"{spec} ingest", ingest_once, ingest_speed.figures)
        run.say(f"{spec}: {ingest_speed.text_line(speed)} (current code, first round)")
    elif "ingest" in args.figures:
        speed = ingest_speed.measure(corpus.source, corpus.site, run.tmp)
        run.say(f"{spec}: {ingest_speed.text_line(speed)}")
    if speed is not None and [f for f in args.figures if f != "mountd"] == ["ingest"]:
        return {"name": spec, "site": corpus.site, "facts": corpus.facts, "ingest": speed, "systems": {}}
    chroma_dir = run.tmp / f"{corpus.site}-chroma"
    if speed is not None and run.versions is None:  # the ingest figure's first run made this very collection
        chroma_dir = ingest_speed.chroma_dir(run.tmp, corpus.site)
        corpus.facts["ingest_embedded_s"] = speed["first_s"]
    else:
        corpus.facts["ingest_embedded_s"] = corpora.ingest(corpus, ["--chroma-path", str(chroma_dir)])
    corpora.load_visible(corpus, chroma_dir)
    corpus.cat_sample = measure.write_cat_sample(list(corpus.visible), args.seed, run.tmp / f"{corpus.site}-cat50")
    corpus.facts["tmpfs_copy_s"] = corpora.copy_visible(corpus, run.shm / f"{corpus.site}-tmpfs")
    run.say(f"{spec}: ingested (embedded) in {corpus.facts['ingest_embedded_s']:.1f}s; {corpus.facts}")
    tmpfs = Tmpfs(corpus.tmpfs_copy or Path())
    systems: list[tuple[str, System]] = [("tmpfs", tmpfs)]
    if "sandbox" in args.systems:
        systems.append(("sandbox", Sandbox(chroma_dir, corpus.site, run.shm)))
    if "chromafs-embedded" in args.systems:
        mounter = run.mounter(corpus.site, ["--chroma-path", str(chroma_dir)], f"{corpus.site}-embedded")
        systems.append(("chromafs-embedded", Chromafs("chromafs-embedded", mounter)))
    if "chromafs-server-redis" in args.systems:
        assert run.chroma is not None and run.redis is not None
        blobs = (run.tmp / f"{corpus.site}-blobs").as_uri()
        backend = ["--chroma-url", run.chroma.url, "--redis-url", run.redis.url]
        corpus.facts["ingest_server_s"] = corpora.ingest(corpus, [*backend, "--blob-store", blobs])
        run.say(f"{spec}: ingested (server) in {corpus.facts['ingest_server_s']:.1f}s")
        tree_doc = corpora.tree_document(chroma_dir, corpus.site)
        for shared in ("cold", "warm"):
            mounter = run.mounter(corpus.site, backend, f"{corpus.site}-server-{shared}")
            name = f"chromafs-server-redis/serving-{shared}"
            systems.append((name, Chromafs(name, mounter, run.redis, shared, tree_doc)))
        if run.mountds:
            # The same deployment, each mount forked by the resident mount server.
            # Shared cache cold: Redis flushed before each mount, so the child loads the tree from Chroma.
            for shared in ("cold", "warm"):
                argv = [*backend, "--mountd", str(run.mountd_socket)]
                mounter = run.mounter(corpus.site, argv, f"{corpus.site}-mountd-{shared}")
                name = f"chromafs-mountd/serving-{shared}"
                systems.append((name, Chromafs(name, mounter, run.redis, shared, tree_doc)))
    results: dict[str, Any] = {}
    expected: dict[str, str] | None = None
    for name, system in systems:
        if isinstance(system, Chromafs) and system.shared == "warm":
            _prime(run, system, corpus)
        if run.versions is not None and isinstance(system, Chromafs):
            results[name] = _compared(run, name, partial(measure_system, run, system, corpus, expected))
        else:
            results[name] = measure_system(run, system, corpus, expected)
        if name == "tmpfs" and "tools" in results[name]:
            expected = {tool: entry.pop("output") for tool, entry in results[name]["tools"].items()}
            total = expected["read all"]
            if total != str(corpus.visible_bytes):
                raise RuntimeError(f"tmpfs read-all counted {total} bytes, the copy holds {corpus.visible_bytes}")
        if isinstance(system, Sandbox) and system.runs:
            results[name]["materialise_runs"] = system.runs
            walls = sorted(r["wall_s"] for r in system.runs)
            corpus.facts["materialise_p50_s"] = walls[len(walls) // 2]
            if "memory" in results["tmpfs"]:
                results[name]["memory"] = dict(results["tmpfs"]["memory"])
    out = {"name": spec, "site": corpus.site, "facts": corpus.facts, "systems": results}
    if "sessions" in args.figures and run.chroma is not None and run.redis is not None:
        backend = ["--chroma-url", run.chroma.url, "--redis-url", run.redis.url]
        if run.versions is None:
            out["sessions"] = sessions.measure_sessions(run, corpus, backend, chroma_dir)
        else:
            tags = itertools.count(1)  # a workdir per round

            def measure_once() -> dict[str, Any]:
                return sessions.measure_sessions(run, corpus, backend, chroma_dir, f"-{next(tags)}")

            out["sessions"] = _compared(run, "sessions", measure_once, baseline.sessions_figures)
        for line in sessions.text_lines(out["sessions"]):
            run.say(f"{spec} sessions:{line}")
    if "density" in args.figures and run.chroma is not None and run.redis is not None:
        backend = ["--chroma-url", run.chroma.url, "--redis-url", run.redis.url]
        if "ingest_server_s" not in corpus.facts:
            blobs = (run.tmp / f"{corpus.site}-blobs").as_uri()
            corpus.facts["ingest_server_s"] = corpora.ingest(corpus, [*backend, "--blob-store", blobs])
        out["density"] = density.measure_density(run, corpus, backend, chroma_dir)
        for line in density.text_lines(out["density"]):
            run.say(f"{spec} density:{line}")
    if speed is not None:
        out["ingest"] = speed
    return out


def _compared(
    run: Run,
    name: str,
    measure_once: Callable[[], dict[str, Any]],
    figures: Callable[[dict[str, Any]], dict[str, tuple[float, str]]] = baseline.system_figures,
) -> dict[str, Any]:
    """`measure_once` for both versions alternately: the current version's first round (for the
    side-by-side table), every round of both, and the comparison."""
    assert run.versions is not None
    rounds = baseline.alternate(run.versions, run.args.rounds, measure_once)
    compared = baseline.compare({label: [figures(r) for r in rs] for label, rs in rounds.items()})
    for line in report.comparison_lines(name, compared) if compared else []:
        run.say(line)
    return {**rounds["current"][0], "baseline": {**run.versions.describe(), "rounds": rounds, "compared": compared}}


def _prime(run: Run, system: Chromafs, corpus: corpora.Corpus) -> None:
    """Warm the shared cache: one mount reads every byte, so Redis holds the tree and every page."""
    system.before()
    fresh = system.fresh()
    try:
        measure.run_tool(measure.command_of("read all"), fresh.root)
    finally:
        system.release(fresh)
    assert system.redis is not None
    keys = int(system.redis.cli("dbsize") or 0)
    run.say(f"{corpus.name}: shared cache primed, {keys} keys in Redis for {len(corpus.visible)} visible files")
