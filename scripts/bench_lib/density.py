"""The "density" figure (issue 30): what the design costs per site and reader class on one host:
one `chroma run`, one `redis-server`, one `chromafs-mountd` with its own defaults (every reader
class a view of one of its pool of serving processes, one per core; `scripts/bench
--serving-processes N` sets the pool), as the "sessions" figure runs it.

Sites are the corpus under many names (ingested once, its records copied: site_copies.py). For
S sites in turn (--density-sites), each new site gets one session per reader class (anonymous,
signed in), and a `grep -rl` in it. After each step: the processes under chromafs-mountd and
their total PSS (the server, its forker, the serving processes; /proc/PID/smaps_rollup), the PSS
per class view, the CPU those processes use while idle (once the new views' background warm-ups
are done), p50/p90 of a class's first session and of later sessions of served classes, and of
the `grep -rl` in each: a class's first (right after its first session, racing its warm-up) and
a later session's, with the FUSE requests it made and how much of a copy of the site on disk,
read at the start, the kernel still holds (this VM drops page cache by itself, with no memory
pressure). Once, for the first site: how many copies of a page the kernel's page cache holds when
both classes read it (fincore on the files through each class's session; and how much `Cached` -
`Shmem` in /proc/meminfo grew while the second class opened, grepped and warmed, which other work
on the machine blurs). Before all that: the same `grep -rl` over a tmpfs copy of one site, and
cold reads per second, 16 readers at once, 16 per-site daemons against the pool (cold_reads.py).
No site is added once MemAvailable falls under 4 GiB; the output says where it stopped and why.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_lib import cold_reads, measure
from bench_lib import corpus as corpora
from bench_lib.mount_server import cmdline
from bench_lib.mounts import _smaps_rollup
from bench_lib.procs import run_timed
from bench_lib.sessions import Sessions, _visible_sets, describe_pool
from bench_lib.site_copies import SiteCopier
from harness.processes import unmount

MIN_AVAILABLE_KB = 4 * 1024 * 1024
CLASSES: dict[str, list[str] | None] = {"anonymous": None, "signed-in": []}
LATER_SESSIONS = 30  # per step, each of a served class picked with the run's seed
IDLE_CPU_WINDOW_S = 5.0
TOKEN_LIFE_S = 12 * 3600.0
FINCORE_BATCH = 200


def meminfo_kb(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def pss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += _smaps_rollup(pid)["pss"]
        except (OSError, KeyError):
            continue  # gone meanwhile
    return total


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            continue
    return total


def idle_cpu_percent(pids: list[int]) -> float:
    """CPU the serving processes use while nobody reads, in % of one core."""
    before = cpu_ticks(pids)
    time.sleep(IDLE_CPU_WINDOW_S)
    return (cpu_ticks(pids) - before) / os.sysconf("SC_CLK_TCK") / IDLE_CPU_WINDOW_S * 100


def resident_bytes(root: Path, keys: list[str]) -> int:
    """Bytes of these files in the kernel's page cache, through the mount at root (fincore)."""
    total = 0
    for start in range(0, len(keys), FINCORE_BATCH):
        files = [str(root / key) for key in keys[start : start + FINCORE_BATCH]]
        out = run_timed(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files])
        total += sum(int(line) for line in out.stdout.decode().split())
    return total


def wait_shared_warm(class_root: Path, views: int, timeout_s: float = 300.0) -> bool:
    """Until the shared processes' logs name `views` warmed views (or views not warmed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = [p.read_text(errors="replace") for p in class_root.glob("shared*.log")]
        done = sum(t.count(" warm /") + t.count("not warming") for t in logs)
        if done >= views:
            return True
        time.sleep(0.5)
    return False


def shared_requests(class_root: Path) -> Counter[str]:
    """FUSE requests the serving processes answered so far, by operation (statfs aside: a fixed answer)."""
    total: Counter[str] = Counter()
    for described in describe_pool(class_root):
        total.update({op: n for op, n in (described.get("requests") or {}).items() if op != "statfs"})
    return total


class Density:
    def __init__(self, run: Any, corpus: corpora.Corpus, backend: list[str], chroma_dir: Path) -> None:
        self.run = run
        self.corpus = corpus
        self.workdir = run.tmp / f"{corpus.site}-density"
        self.workdir.mkdir()
        self.copier = SiteCopier(run.chroma.url, corpus.site, run.redis.url)
        (self.workdir / "classes").mkdir()
        self.sessions = Sessions(
            self.workdir / "classes",
            corpus.site,
            backend,
            class_idle_s=TOKEN_LIFE_S,
            serving_processes=run.args.serving_processes,
        )
        self.visible = {name: sorted(keys) for name, keys in _visible_sets(chroma_dir, corpus.site).items()}
        self.sites: list[str] = []
        self.served: list[tuple[str, str]] = []  # (site, class)
        self.control = self._disk_control()
        self.rng = random.Random(run.args.seed)

    def _disk_control(self) -> Path:
        """A copy of the site on the work directory's disk, read once now: how much of it the
        kernel still holds when later sessions grep tells what the machine drops by itself."""
        control = self.workdir / "disk-control"
        shutil.copytree(self.corpus.source, control)
        for path in control.rglob("*"):
            if path.is_file():
                path.read_bytes()
        return control

    def control_resident(self) -> float | None:
        keys = self.visible["anonymous"]
        held = resident_bytes(self.control, keys)
        total = sum(-(-(self.control / key).stat().st_size // 4096) * 4096 for key in keys)
        return held / total if total else None

    def open(self, site: str, reader: str) -> tuple[Path, float]:
        groups = CLASSES[reader]
        exp = time.time() + TOKEN_LIFE_S if groups is not None else None
        return self.sessions.open(groups, exp, site=site)

    def add_site(self, firsts: list[float], greps: list[float]) -> dict[str, Any] | None:
        """A new site with a session and a grep -rl per class; for the first site, what the page
        cache holds (returned)."""
        site = f"{self.corpus.site}-s{len(self.sites):04d}"
        self.copier.copy(site)
        self.sites.append(site)
        first_site = len(self.sites) == 1
        roots, cached = {}, []
        for reader in CLASSES:
            roots[reader], took = self.open(site, reader)
            firsts.append(took)
            greps.append(measure.run_tool(measure.command_of("grep -rl"), roots[reader])[0])
            self.served.append((site, reader))
            if first_site:
                cached.append(meminfo_kb("Cached") - meminfo_kb("Shmem"))
        return self.page_cache_sharing(roots, cached[1] - cached[0]) if first_site else None

    def page_cache_sharing(self, roots: dict[str, Path], second_growth_kb: int) -> dict[str, Any]:
        """`second_growth_kb`: how much file cache grew while the second class opened, grepped and warmed."""
        common = sorted(set(self.visible["anonymous"]) & set(self.visible["signed-in"]))
        page = 4096
        common_bytes = sum(-(-(self.corpus.source / key).stat().st_size // page) * page for key in common)
        held = {reader: resident_bytes(root, common) for reader, root in roots.items()}
        # Classes whose files are the same inodes (views of one site in a serving process) hold one copy.
        files_of = {reader: [os.stat(root / key)[1:3] for key in common] for reader, root in roots.items()}
        distinct = {tuple(files_of[reader]): reader for reader in roots}
        second = sum((self.corpus.source / key).stat().st_size for key in self.visible["signed-in"])
        return {
            "common_files": len(common),
            "common_bytes_in_pages": common_bytes,
            "resident_bytes_per_class": held,
            "same_inodes_across_classes": len(distinct) == 1 and len(roots) > 1,
            "copies_held": sum(held[r] for r in distinct.values()) / common_bytes if common_bytes else None,
            "second_class_cached_growth_bytes": second_growth_kb * 1024,
            "second_class_bytes": second,
            "second_class_growth_to_bytes": second_growth_kb * 1024 / second if second else None,
        }

    def later_sessions(self) -> tuple[list[float], list[float], list[Counter[str]]]:
        """(seconds each session took, seconds its first `grep -rl` took, FUSE requests by operation
        that grep made of the shared processes: none when its class is warm in the kernel)."""
        times: list[float] = []
        greps: list[float] = []
        requests: list[Counter[str]] = []
        class_root = self.sessions.server.class_root
        for site, reader in self.rng.sample(self.served, min(LATER_SESSIONS, len(self.served))):
            root, took = self.open(site, reader)
            times.append(took)
            before = shared_requests(class_root)
            greps.append(measure.run_tool(measure.command_of("grep -rl"), root)[0])
            requests.append(shared_requests(class_root) - before)
            unmount(root)
        return times, greps, requests

    def step(self, target: int, baseline_pss_kb: int, previous: dict[str, Any] | None) -> dict[str, Any]:
        firsts: list[float] = []
        greps: list[float] = []
        out: dict[str, Any] = {"target_sites": target}
        while len(self.sites) < target:
            available = meminfo_kb("MemAvailable")
            if available < MIN_AVAILABLE_KB:
                out["stopped"] = f"MemAvailable {available / 1024 / 1024:.1f} GiB < 4 GiB at {len(self.sites)} sites"
                break
            try:
                sharing = self.add_site(firsts, greps)
            except RuntimeError as exc:
                out["stopped"] = f"at {len(self.sites)} sites: {exc}"
                break
            if sharing is not None:
                out["page_cache"] = sharing
            if len(self.sites) % 50 == 0:
                self.run.say(f"density: {len(self.sites)} sites, MemAvailable {available / 1024 / 1024:.1f} GiB")
        pids = self.sessions.serving_pids()
        classes = len(self.served)
        total = pss_kb(pids)
        out.update(sites=len(self.sites), classes=classes, serving_processes=len(pids), pss_total_kb=total)
        out["process_kinds"] = dict(Counter(_kind(pid) for pid in pids))
        out["pss_mountd_alone_kb"] = baseline_pss_kb
        out["pss_per_class_kb"] = (total - baseline_pss_kb) / classes if classes else None
        if previous is not None and classes > previous["classes"]:
            out["marginal_pss_per_class_kb"] = (total - previous["pss_total_kb"]) / (classes - previous["classes"])
        # idle: once the new classes' background warm-ups are done
        out["warm_ups_done"] = wait_shared_warm(self.sessions.server.class_root, classes)
        out["idle_cpu_percent_of_a_core"] = idle_cpu_percent(pids)
        out["disk_control_resident"] = self.control_resident()
        later, later_greps, grep_requests = self.later_sessions()
        if grep_requests:
            out["later_session_grep_requests"] = sorted(sum(counts.values()) for counts in grep_requests)
            out["later_session_grep_requests_by_op"] = dict(sum(grep_requests, Counter()))
        figures = (
            ("first_session", firsts),
            ("later_session", later),
            ("class_first_grep", greps),
            ("later_session_grep", later_greps),
        )
        for name, values in figures:
            if values:
                out[f"{name}_n"] = len(values)
                out[f"{name}_p50_s"] = measure.percentile(values, 50)
                out[f"{name}_p90_s"] = measure.percentile(values, 90)
        out["mem_available_gib"] = round(meminfo_kb("MemAvailable") / 1024 / 1024, 2)
        return out


def measure_density(run: Any, corpus: corpora.Corpus, backend: list[str], chroma_dir: Path) -> dict[str, Any]:
    density = Density(run, corpus, backend, chroma_dir)
    facts = corpus.facts
    out: dict[str, Any] = {
        "serving_processes": run.args.serving_processes or "the server's default (one per core)",
        "site_shape": {
            "tree_record_bytes": facts.get("tree_record_bytes"),
            "tree_files": facts.get("tree_files"),
            "visible_files_anonymous": len(density.visible["anonymous"]),
            "visible_files_signed_in": len(density.visible["signed-in"]),
            "visible_bytes_anonymous": facts.get("visible_bytes"),
            "median_page_bytes": _median_size(corpus.source, density.visible["signed-in"]),
        },
        "steps": [],
    }
    if corpus.tmpfs_copy is not None:  # the same grep -rl over a tmpfs copy of one site: the floor
        grep = measure.command_of("grep -rl")
        out["tmpfs_grep_s"] = min(measure.run_tool(grep, corpus.tmpfs_copy)[0] for _ in range(3))
    keys = density.visible["anonymous"]
    out["cold_reads"] = cold_reads.measure(
        density.workdir / "cold", density.copier, corpus.site, backend, keys, run.args.serving_processes
    )
    run.say(f"density: {cold_reads.text_line(out['cold_reads'])}")
    try:
        density.sessions.server.start()
        time.sleep(1.0)
        baseline = pss_kb(density.sessions.serving_pids())
        previous = None
        for target in run.args.density_sites:
            previous = density.step(target, baseline, previous)
            out["steps"].append(previous)
            run.say(f"density: {step_line(previous)}")
            if "stopped" in previous:
                out["stopped"] = previous["stopped"]
                break
    finally:
        density.sessions.close()
    out["site_copies"] = density.copier.summary()
    out["bars"] = bars(out)
    return out


def bars(result: dict[str, Any]) -> dict[str, bool]:
    """Against issue 30's bars: the PSS each class view adds (the marginal between steps, else the
    first step's per class) <= 2 MiB, as many processes at the last step as at the first, every
    later session's p90 <= 50 ms, and the pool's cold reads at least the per-site daemons'."""
    steps = result["steps"]
    per_view = [s.get("marginal_pss_per_class_kb", s.get("pss_per_class_kb")) for s in steps[1:] or steps]
    return {
        "pss_per_class_view_le_2MiB": bool(per_view) and all(v is not None and v <= 2048 for v in per_view),
        "fixed_processes": bool(steps) and steps[-1]["serving_processes"] == steps[0]["serving_processes"],
        "later_session_p90_le_50ms": bool(steps) and all(s.get("later_session_p90_s", 1) <= 0.05 for s in steps),
        "cold_reads_pool_ge_daemons": bool(result.get("cold_reads", {}).get("bar_pool_ge_daemons")),
    }


def _kind(pid: int) -> str:
    """A process by its title's first word: chromafs-serving (a serving process), or the
    interpreter's name (the server and its forker)."""
    words = cmdline(pid).split()
    return os.path.basename(words[0]) if words else "?"


def _median_size(source: Path, keys: list[str]) -> int:
    sizes = sorted((source / key).stat().st_size for key in keys)
    return sizes[len(sizes) // 2] if sizes else 0


def _ms(step: dict[str, Any], name: str) -> str:
    if f"{name}_p50_s" not in step:
        return "-"
    return f"{step[f'{name}_p50_s'] * 1000:.0f}/{step[f'{name}_p90_s'] * 1000:.0f} ms"


def step_line(step: dict[str, Any]) -> str:
    marginal = step.get("marginal_pss_per_class_kb")
    return (
        f"{step['sites']:>5} {step['classes']:>7} {step['serving_processes']:>9} "
        f"{step['pss_total_kb'] / 1024:>9.0f} MiB {(step['pss_per_class_kb'] or 0) / 1024:>7.1f} MiB "
        f"{'-' if marginal is None else f'{marginal / 1024:.1f} MiB':>10} "
        f"{_ms(step, 'first_session'):>16} {_ms(step, 'later_session'):>16} {_ms(step, 'class_first_grep'):>16} "
        f"{_ms(step, 'later_session_grep'):>16} "
        f"{step['idle_cpu_percent_of_a_core']:>6.0f}% {step['mem_available_gib']:>6.1f} GiB"
    )


def text_lines(result: dict[str, Any]) -> list[str]:
    shape = result["site_shape"]
    lines = [
        f"  each site: {shape['tree_files']} files (anonymous sees {shape['visible_files_anonymous']}, "
        f"signed in {shape['visible_files_signed_in']}), median page {shape['median_page_bytes']} bytes, "
        f"{(shape['visible_bytes_anonymous'] or 0) / 1e6:.2f} MB visible to anonymous, "
        f"tree record {shape['tree_record_bytes']} bytes; 2 reader classes per site; "
        f"chromafs-mountd --serving-processes: {result.get('serving_processes', '?')}",
        "  sites classes processes  PSS total  PSS/class   marginal  first session p50/p90  "
        "later p50/p90  1st grep p50/p90  later grep p50/p90  idle CPU  MemAvail",
    ]
    lines += [f"  {step_line(step)}" for step in result["steps"]]
    if "tmpfs_grep_s" in result:
        lines.append(f"  grep -rl over a tmpfs copy of one site: {result['tmpfs_grep_s'] * 1000:.1f} ms (best of 3)")
    for step in result["steps"]:
        if "process_kinds" in step:
            lines.append(
                f"  {step['sites']} sites: processes under chromafs-mountd and itself: {step['process_kinds']}"
            )
    for step in result["steps"]:
        if "later_session_grep_requests" in step:
            counts = step["later_session_grep_requests"]
            lines.append(f"  {step['sites']} sites: FUSE requests of each later grep, sorted: {counts}")
            lines.append(f"    by operation, all later greps: {step.get('later_session_grep_requests_by_op')}")
        control = step.get("disk_control_resident")
        if control is not None:
            lines.append(
                f"  {step['sites']} sites: a copy of the site on the work directory's disk, read once at the "
                f"start, still held in the page cache: {control:.0%} (what the machine drops by itself)"
            )
    first = next((s["page_cache"] for s in result["steps"] if "page_cache" in s), None)
    if first:
        lines.append(
            f"  page cache, one site's 2 classes: {first['common_files']} files both see "
            f"({first['common_bytes_in_pages'] / 1e6:.2f} MB in pages) held {first['copies_held']:.2f} times "
            f"(fincore); Cached-Shmem grew {first['second_class_cached_growth_bytes'] / 1e6:.2f} MB while the "
            f"second class read its {first['second_class_bytes'] / 1e6:.2f} MB "
            f"({first['second_class_growth_to_bytes']:.2f}x; other work on the machine included)"
        )
    lines.append(f"  {cold_reads.text_line(result['cold_reads'])}")
    lines.append(f"  stopped: {result.get('stopped', 'no: every step fitted')}")
    if "bars" in result:
        lines.append("  bars: " + ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in result["bars"].items()))
    return lines
