"""Presenting the results: a terminal table, the JSON file and the PNG chart of ratios to tmpfs."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_lib import csi_publish, density, ingest_speed, multitenant, reingest, search_cli, search_quality
from bench_lib.measure import TOOLS

SYSTEMS = [
    ("tmpfs", "tmpfs"),
    ("sandbox", "sandbox"),
    ("chromafs-embedded", "embedded"),
    ("chromafs-server-redis/shared-cold", "server+redis cold"),
    ("chromafs-server-redis/shared-warm", "server+redis warm"),
    ("chromafs-mountd/shared-cold", "mountd+redis cold"),
    ("chromafs-mountd/shared-warm", "mountd+redis warm"),
]
Getter = Callable[[dict[str, Any]], float | None]


def _dig(data: dict[str, Any], *path: str) -> Any:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _memory(field: str) -> Getter:
    def get(system: dict[str, Any]) -> float | None:
        if "copy_kb" in system.get("memory", {}):
            return float(system["memory"]["copy_kb"])  # tmpfs and sandbox: the copy is the cost
        value = _dig(system, "memory", *field.split("."))
        return None if value is None else float(value)

    return get


def rows() -> list[tuple[str, str, Getter]]:
    """(label, unit, getter) of every figure, in table order."""
    out: list[tuple[str, str, Getter]] = [
        ("boot p50", "s", lambda s: _dig(s, "boot", "p50_s")),
        ("boot p90", "s", lambda s: _dig(s, "boot", "p90_s")),
    ]
    for name, _, _ in TOOLS:
        out.append((f"{name} cold", "s", lambda s, n=name: _dig(s, "tools", n, "cold_s")))
        out.append((f"{name} warm", "s", lambda s, n=name: _dig(s, "tools", n, "warm_s")))
    out += [
        ("RSS, 1 mount", "kb", _memory("after_grep_kb.rss")),
        ("PSS, 1 mount", "kb", _memory("after_grep_kb.pss")),
        ("marginal PSS", "kb", _memory("marginal_pss_kb")),
    ]
    return out


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "kb":
        return f"{value / 1024:.1f} MiB"
    if value < 1:
        return f"{value * 1000:.1f} ms" if value < 0.1 else f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def corpus_table(corpus: dict[str, Any]) -> list[str]:
    systems = corpus["systems"]
    present = [(key, label) for key, label in SYSTEMS if key in systems]
    width = 25
    lines = ["figure".ljust(16) + "".join(label.ljust(width) for _, label in present)]
    for label, unit, get in rows():
        if all(get(systems[key]) is None for key, _ in present):
            continue
        base = get(systems["tmpfs"]) if "tmpfs" in systems else None
        cells = []
        for key, _ in present:
            value = get(systems[key])
            cell = fmt(value, unit)
            r = ratio(value, base)
            if key != "tmpfs" and r is not None:
                cell += f" ({r:.3g}x)"
            cells.append(cell.ljust(width))
        lines.append(label.ljust(16) + "".join(cells))
    answered = [
        f"{label}: {m['answered_ls']}/{m['mounts']}"
        for key, label in present
        if (m := systems[key].get("memory", {})).get("mounts")
    ]
    if answered:
        lines.append("concurrent mounts answering ls: " + ", ".join(answered))
    return lines


def text_report(results: dict[str, Any]) -> str:
    out = []
    for corpus in results["corpora"]:
        f = corpus["facts"]
        out.append("")
        if not corpus["systems"]:
            out.append(f"== corpus {corpus['name']} (site {corpus['site']})")
        else:
            out.append(f"== corpus {corpus['name']} (site {corpus['site']}): {_facts_line(f)}")
            out += corpus_table(corpus)
        if "ingest" in corpus:
            out.append(ingest_speed.text_line(corpus["ingest"]))
        for name, system in {**corpus["systems"], "sessions": corpus.get("sessions", {})}.items():
            if "baseline" in system and system["baseline"]["compared"]:
                out += comparison_lines(f"{corpus['name']} {name}", system["baseline"]["compared"])
        if "density" in corpus:
            out.append(f"density ({corpus['name']}):")
            out += density.text_lines(corpus["density"])
    if "mountd" in results:
        out.append("")
        out.append(
            "mountd, a multi-tenant host (chromafs-mountd; sessions timed from chromafs-mount --mountd to `ls` done):"
        )
        out += multitenant.text_lines(results["mountd"])
    if "csi" in results:
        out.append("")
        out.append("csi, chromafs-csi's NodePublishVolume (timed at the gRPC caller, as kubelet calls it):")
        out += csi_publish.text_lines(results["csi"])
    if "search" in results:
        out.append("")
        out.append("search: the page whose description is the query, found in the top 5 (recall@5) and MRR@10:")
        out += search_quality.text_lines(results["search"])
    if "search-cli" in results:
        out.append("")
        out.append("search-cli: `chromafs search` from the command line, through the host's mount server and alone:")
        out += search_cli.text_lines(results["search-cli"])
    if "reingest" in results:
        out.append("")
        out.append("reingest: a big site into chroma run (no blob store) while another site is read and searched:")
        out += reingest.text_lines(results["reingest"])
    out.append("")
    out.append("cold: first run on a fresh mount (sandbox: materialise wall time + first run); warm: best of 3")
    out.append("tmpfs/sandbox memory rows: the size of one copy in /dev/shm (what each extra reader costs)")
    if results.get("incidents"):
        out.append(f"incidents (failed mounts, retried; daemons exiting non-zero): {len(results['incidents'])}")
    return "\n".join(out)


def _value(value: float, unit: str) -> str:
    return f"{value:.2f}x" if unit == "x" else fmt(value, unit)


def comparison_lines(title: str, compared: list[dict[str, Any]]) -> list[str]:
    """--baseline: per figure, each version's median, the ratio, the spread and the verdict."""
    lines = [f"{title}: baseline vs current, median of rounds", f"  {'figure':<30}{'baseline':>12}{'current':>12}"]
    lines[-1] += f"{'ratio':>9}{'spread':>12}  verdict"
    for row in compared:
        unit, ratio = row["unit"], row["ratio"]
        verdict = "WORSE beyond spread" if row["worse_beyond_spread"] else "not worse beyond spread"
        lines.append(
            f"  {row['figure']:<30}{_value(row['baseline_median'], unit):>12}{_value(row['current_median'], unit):>12}"
            f"{'-' if ratio is None else f'{ratio:.3f}':>9}{_value(row['spread'], unit):>12}  {verdict}"
        )
    return lines


def _facts_line(f: dict[str, Any]) -> str:
    parts = [f"{f.get('visible_files')} of {f.get('tree_files')} files visible to anonymous"]
    parts.append(f"{f.get('visible_bytes', 0) / 1e6:.1f} MB, {f.get('visible_dirs')} dirs")
    for key in ("ingest_embedded_s", "ingest_server_s", "tmpfs_copy_s", "materialise_p50_s"):
        if key in f:
            parts.append(f"{key.removesuffix('_s').replace('_', ' ')} {f[key]:.2f} s")
    return "; ".join(parts)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")


def write_png(results: dict[str, Any], path: Path) -> bool:
    """One panel per corpus: each figure's ratio to tmpfs per system, log scale. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    corpora = [c for c in results["corpora"] if any(name != "tmpfs" for name in c["systems"])]
    if not corpora:
        return False
    fig, axes = plt.subplots(len(corpora), 1, figsize=(15, 4.5 * len(corpora)), squeeze=False)
    figures = rows()
    others = SYSTEMS[1:]
    for ax, corpus in zip(axes[:, 0], corpora, strict=True):
        systems = corpus["systems"]
        bar = 0.8 / len(others)
        for number, (key, label) in enumerate(others):
            if key not in systems:
                continue
            values = []
            for _, _, get in figures:
                r = ratio(get(systems[key]), get(systems["tmpfs"]))
                values.append(r if r is not None and r > 0 else math.nan)
            xs = [i + (number - (len(others) - 1) / 2) * bar for i in range(len(figures))]
            ax.bar(xs, values, bar, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(figures)), [label for label, _, _ in figures], rotation=45, ha="right")
        ax.set_ylabel("ratio to tmpfs (log)")
        ax.set_title(f"{corpus['name']}: {corpus['facts'].get('visible_files')} visible files")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize="small", ncol=len(others))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
