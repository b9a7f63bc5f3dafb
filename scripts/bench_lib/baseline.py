"""`--baseline REF`: every chromafs figure for two versions of the code in one run (issue 29).

REF is checked out in a temporary `git worktree` (removed at the end). Each chromafs system's
figures, and the sessions figure, are measured for both versions in turn, baseline first
(A B A B ..., `--rounds` rounds), the version chosen by the PYTHONPATH of every process the bench
starts (mounts, `chromafs-mountd`; the bench's own process and the ingest stay on the current
code, so both versions serve the same ingested sites). Per figure: the median of each version's
rounds, the spread (the larger of the two versions' max - min over rounds), the ratio current /
baseline, and "worse beyond spread" when the current median exceeds the baseline's by more than
the spread. Every figure compared is a time or a size: lower is better.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_lib.corpus import REPO
from bench_lib.report import rows

VERSIONS = ("baseline", "current")
SESSIONS_UNITS = {"_s": "s", "_kb": "kb", "_ratio": "x"}


class CodeVersions:
    """The current tree and REF's worktree; `use(label)` points the bench's children at one of them."""

    def __init__(self, ref: str, workdir: Path) -> None:
        self.ref = ref
        self.tree = workdir / "baseline-tree"
        self.commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
        _git("worktree", "add", "--detach", str(self.tree), self.commit)
        self.current_commit = _git("rev-parse", "HEAD")
        self.paths = {"baseline": self.tree, "current": REPO}
        self.hooks: list[Callable[[str], None]] = []  # called on each switch (a mount server per version)

    @contextlib.contextmanager
    def use(self, label: str) -> Iterator[None]:
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(self.paths[label])
        for hook in self.hooks:
            hook(label)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            _git("worktree", "remove", "--force", str(self.tree))
        with contextlib.suppress(RuntimeError):
            _git("worktree", "prune")

    def describe(self) -> dict[str, str]:
        return {"ref": self.ref, "baseline": self.commit, "current": self.current_commit}


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def alternate(versions: CodeVersions, rounds: int, measure: Callable[[], dict[str, Any]]) -> dict[str, list[Any]]:
    """`measure` run for each version in turn, baseline first, `rounds` times: each version's results."""
    out: dict[str, list[Any]] = {label: [] for label in VERSIONS}
    for _ in range(rounds):
        for label in VERSIONS:
            with versions.use(label):
                out[label].append(measure())
    return out


def system_figures(result: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """A chromafs system's figures as {label: (value, unit)}, as the side-by-side table names them."""
    return {label: (float(v), unit) for label, unit, get in rows() if (v := get(result)) is not None}


def sessions_figures(result: dict[str, Any]) -> dict[str, tuple[float, str]]:
    out = {}
    for key, value in result.items():
        unit = next((u for suffix, u in SESSIONS_UNITS.items() if key.endswith(suffix)), None)
        if key.startswith("tmpfs_"):
            continue  # the same for both versions
        if unit is not None and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = (float(value), unit)
    return out


def compare(per_version: dict[str, list[dict[str, tuple[float, str]]]]) -> list[dict[str, Any]]:
    """Per figure both versions have in every round: medians, spread, ratio and the verdict."""
    first = per_version["baseline"][0]
    out = []
    for figure, (_, unit) in first.items():
        values = {label: [r[figure][0] for r in per_version[label] if figure in r] for label in VERSIONS}
        if any(len(v) != len(per_version[label]) for label, v in values.items()):
            continue
        medians = {label: statistics.median(v) for label, v in values.items()}
        spreads = {label: max(v) - min(v) for label, v in values.items()}
        spread = max(spreads.values())
        out.append(
            {
                "figure": figure,
                "unit": unit,
                "baseline_median": medians["baseline"],
                "current_median": medians["current"],
                "baseline_spread": spreads["baseline"],
                "current_spread": spreads["current"],
                "spread": spread,
                "ratio": medians["current"] / medians["baseline"] if medians["baseline"] else None,
                "worse_beyond_spread": medians["current"] - medians["baseline"] > spread,
                "rounds": values,
            }
        )
    return out
