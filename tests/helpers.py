"""Test helpers: run the real CLIs, mount for real, always unmount."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from chromafs_fuse.serving.mounttable import is_mounted
from infra import BIN, unmount_daemon

REPO = Path(__file__).resolve().parent.parent
SAMPLE_SITE = REPO / "chromafs_fuse" / "sample_site"
MOUNT = str(BIN / "chromafs-mount")
INGEST = str(BIN / "chromafs-ingest")


def ingest(source: Path, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    """Run chromafs-ingest; its exit status must be `status` (0 clean, 3 with errors, 4 nothing ingested)."""
    proc = subprocess.run([INGEST, str(source), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == status, proc.stderr
    return proc


def try_mount(mountpoint: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "CHROMAFS_TOKEN"}
    full_env.update(env or {})
    return subprocess.run(
        [MOUNT, str(mountpoint), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def mounted(mountpoint: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Path]:
    """Mount with the real CLI (background daemon); unmount even if the test fails."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_file = mountpoint.parent / f"{mountpoint.name}.log"
    pid_file = mountpoint.parent / f"{mountpoint.name}.pid"
    proc = try_mount(mountpoint, *args, "--log-file", str(log_file), "--pid-file", str(pid_file), env=env)
    try:
        assert proc.returncode == 0, f"mount failed: {proc.stderr}"
        assert is_mounted(mountpoint)
        yield mountpoint
    finally:
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
        unmount_daemon(mountpoint, pid, 5)


# Shared objects that `import chromadb` maps into a process. chromadb itself is pure Python, so
# its own name alone would never show in the maps.
CHROMADB_FOOTPRINT = ("chromadb", "/numpy/", "pydantic_core", "/grpc/")


def chromadb_libraries_loaded(mnt: Path) -> list[str]:
    """The chromadb-related shared objects mapped into the daemon of `mnt` (mounted by `mounted`)."""
    pid = int((mnt.parent / f"{mnt.name}.pid").read_text())
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "pyfuse3" in maps  # the right process, and its maps are readable
    return sorted({line.split()[-1] for line in maps.splitlines() if any(s in line for s in CHROMADB_FOOTPRINT)})


def kernel_open_mode(mnt: Path) -> str:
    """What `chromafs status` says of the mount: "skipped" (no-open mode) or "per open"."""
    out = run([str(BIN / "chromafs"), "status", "--json"])
    (mine,) = [s for s in json.loads(out.stdout) if s["mountpoint"] == str(mnt)]
    return str(mine["kernel_open"])


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def tree_listing(root: Path) -> set[str]:
    """Every file and directory under root, relative, via the real `find`."""
    out = subprocess.run(["find", ".", "-mindepth", "1"], cwd=root, capture_output=True, timeout=120, check=True)
    return {p[2:] for p in out.stdout.decode("utf-8").split("\n") if p}


# -- what the sample site should look like, derived independently of the ingest code --

NAVIGATION_PUBLIC = {"index", "quickstart", "guides/migration"}  # public groups of sample_site/docs.json


def sample_access(site: Path, default: str) -> dict[str, tuple[bool, frozenset[str]]]:
    """relative path -> (public, groups) for every file of the sample site."""
    table: dict[str, tuple[bool, frozenset[str]]] = {}
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(site).as_posix()
        public, groups, said = False, frozenset(), False
        if path.suffix in (".md", ".mdx"):
            text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
            if text.startswith("---\n"):
                front = yaml.safe_load(text.split("---\n")[1]) or {}
                if "public" in front or "groups" in front:
                    said = True
                    public = bool(front.get("public", False))
                    groups = frozenset(front.get("groups") or [])
            if not said and rel.rsplit(".", 1)[0] in NAVIGATION_PUBLIC:
                said, public = True, True
        if not said:
            public = default == "public"
        table[rel] = (public, groups)
    return table


def expected_visible(site: Path, default: str, user_groups: set[str] | None) -> set[str]:
    """user_groups None = anonymous; a set = a valid token with those groups."""
    visible = set()
    for rel, (public, groups) in sample_access(site, default).items():
        if public or (user_groups is not None and (not groups or groups & user_groups)):
            visible.add(rel)
    return visible


def copy_subset(site: Path, files: set[str], dest: Path) -> Path:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, target)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def source_files(root: Path) -> dict[str, Path]:
    """Every regular file a default ingest takes (dot files and dot folders are skipped)."""
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def expand(spec: str | list[str], everything: set[str], errors: set[str]) -> set[str]:
    if isinstance(spec, list):
        return set(spec)
    if spec == "all":
        return everything
    if spec == "all but errors":
        return everything - errors
    assert spec.startswith("all but "), spec
    return everything - set(spec.removeprefix("all but ").split(", "))
