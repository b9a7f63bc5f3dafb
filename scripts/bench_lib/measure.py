"""The figures: boot, the tools (cold and warm), and memory."""

from __future__ import annotations

import random
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

from bench_lib.mounts import memory_kb
from bench_lib.procs import run_timed
from bench_lib.systems import Chromafs, Fresh, System

TOOLS: list[tuple[str, str, str]] = [
    ("find", "find {M} -name '*.md*'", "lines"),
    ("ls -R", "ls -R {M}", "text"),
    ("grep -rl", "grep -rl 'refresh token' {M}", "lines"),
    ("grep -rlE", "grep -rlE 'refresh[a-z ]+token|Bearer [A-Za-z]+' {M}", "lines"),
    ("rg -l", "rg -l 'refresh token' {M}", "lines"),
    # The reference design's "cat of 50 pages": 50 visible files picked with the run's seed.
    ("cat 50", "cd {M} && xargs -d '\\n' -a {SAMPLE} cat | wc -c", "text"),
    ("read all", "find {M} -type f -exec cat {} + | wc -c", "text"),
]
WARM_RUNS = 3
CAT_SAMPLE_FILES = 50


def command_of(tool: str) -> str:
    return next(command for name, command, _ in TOOLS if name == tool)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]  # nearest-rank


def write_cat_sample(visible: list[str], seed: int, path: Path) -> Path:
    """The files "cat 50" reads: a seeded sample of the visible keys, one per line."""
    chosen = random.Random(seed).sample(sorted(visible), min(CAT_SAMPLE_FILES, len(visible)))
    path.write_text("".join(f"{key}\n" for key in chosen))
    return path


def run_tool(command: str, root: Path, cat_sample: Path | None = None) -> tuple[float, str]:
    """Run one tool over root with bash; (seconds, output with root replaced by M, normalised)."""
    command = command.replace("{SAMPLE}", shlex.quote(str(cat_sample))) if cat_sample else command
    result = run_timed(["bash", "-c", command.replace("{M}", shlex.quote(str(root)))])
    if result.returncode not in (0, 1):  # grep and rg exit 1 when nothing matches
        err = result.stderr.decode(errors="replace").strip()[-1000:]
        raise RuntimeError(f"{command!r} on {root} exited {result.returncode}: {err}")
    return result.seconds, result.stdout.decode("utf-8", "replace").replace(str(root), "M")


def normalise(output: str, kind: str) -> str:
    return "\n".join(sorted(output.splitlines())) if kind == "lines" else output.strip()


def boot(system: System, runs: int) -> dict[str, Any]:
    """Wall time from starting the system to `ls ROOT` returning, over `runs` fresh roots."""
    times: list[float] = []
    for _ in range(runs):
        system.before()
        started = time.perf_counter()
        fresh = system.fresh()
        listed = run_timed(["ls", str(fresh.root)])
        times.append(time.perf_counter() - started)
        system.release(fresh)
        if listed.returncode != 0:
            raise RuntimeError(f"ls {fresh.root} failed on {system.name}")
    return {"p50_s": statistics.median(times), "p90_s": percentile(times, 90), "runs_s": times}


def tools(system: System, expected: dict[str, str] | None, cat_sample: Path) -> dict[str, Any]:
    """Each tool on a fresh root (cold, plus what the root cost) then repeated (warm, best of 3)."""
    out: dict[str, Any] = {}
    for name, command, kind in TOOLS:
        system.before()
        fresh = system.fresh()
        try:
            cold, output = run_tool(command, fresh.root, cat_sample)
            warm = [run_tool(command, fresh.root, cat_sample)[0] for _ in range(WARM_RUNS)]
        finally:
            system.release(fresh)
        got = normalise(output, kind)
        entry = {"cold_s": fresh.extra_s + cold, "tool_cold_s": cold, "warm_s": min(warm), "warm_runs_s": warm}
        entry["output_lines"] = got.count("\n") + 1 if got else 0
        if expected is not None:
            entry["matches_tmpfs"] = got == expected[name]
        else:
            entry["output"] = got
        out[name] = entry
    return out


def memory(system: Chromafs, mounts: int, prefetch: bool) -> dict[str, Any]:
    """RSS/PSS of one daemon (after boot, after a grep -rl) and the marginal PSS of the Kth mount,
    all K mounted at once, each having served a grep -rl (and finished its prefetch, if any)."""
    grep = command_of("grep -rl")
    held: list[Fresh] = []
    out: dict[str, Any] = {"mounts": mounts}
    try:
        for index in range(mounts):
            system.before()
            fresh = system.fresh()
            held.append(fresh)
            assert fresh.pid is not None
            if index == 0:
                out["after_boot_kb"] = memory_kb(fresh.pid)
            run_tool(grep, fresh.root)
            if prefetch and not system.wait_prefetch(fresh):
                out["prefetch_unfinished"] = out.get("prefetch_unfinished", 0) + 1
            if index == 0:
                out["after_grep_kb"] = memory_kb(fresh.pid)
        total = sum(memory_kb(f.pid)["pss"] for f in held if f.pid is not None)
        answered = sum(1 for f in held if run_timed(["ls", str(f.root)]).returncode == 0)
    finally:
        for fresh in held:
            system.release(fresh)
    pss_1 = out["after_grep_kb"]["pss"]
    out.update(pss_total_kb=total, answered_ls=answered)
    out["marginal_pss_kb"] = (total - pss_1) / (mounts - 1) if mounts > 1 else None
    return out
