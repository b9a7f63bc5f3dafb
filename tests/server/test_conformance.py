"""Conformance of the production shape: one `chroma run`, one `redis-server`, one `chromafs-mountd`
serving shared class mounts, every docs tree of tests/data/sites, the real mintlify-docs corpus and
generated pages of the known-bad kinds, each ingested into a site of its own and read through session
mounts by three reader classes (no token, groups [admin], groups [billing]).

For every site and reader, what a real `find` lists is exactly what the frontmatter says, every byte
read with a real `cat` is the source's, no hidden path shows in any listing, a hidden path fails with
ENOENT exactly as a name that never existed does (`stat`, `cat`, and the syscalls themselves), and a
`grep -rl` for words found only in hidden pages finds nothing.

The expectations never come from chromafs's own code: tests/data/sites.yaml for what it states, the
tables below for the rest, and for the corpus its report's errors plus a plain frontmatter check.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from chromafs_fuse.serving.server.state_journal import StateJournal
from infra import (
    CORPORA,
    INGEST,
    MOUNT,
    REPO,
    ChromaServer,
    MountServer,
    RedisServer,
    child_env,
    expand,
    mounts_under,
    need_corpus,
    running_mount_server,
    source_files,
    unmount,
    wait_gone,
)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="chromafs-mountd's shared class mounts need root (bind mounts)"),
    pytest.mark.timeout(900),  # the module's servers and every ingest start with the first test
]

SITES = REPO / "tests" / "data" / "sites"
SITES_YAML = yaml.safe_load((REPO / "tests" / "data" / "sites.yaml").read_text())
CORPUS = CORPORA / "mintlify-docs"
READERS: dict[str, tuple[str, ...] | None] = {"anonymous": None, "admin": ("admin",), "billing": ("billing",)}
MARKDOWN = (".md", ".mdx", ".markdown")

# What a token with groups [billing] sees of the trees in tests/data/sites (sites.yaml states the
# anonymous reader and the admin), read off their frontmatter, in sites.yaml's notation.
BILLING = {
    "mintlify": "all",  # --default-access authenticated, and no page names groups
    "hugo": "all but docs/broken.md, docs/admin/_index.md, docs/admin/audit-export.md, docs/admin/drain.md, "
    "docs/admin/rotate-keys.md",  # groups [admin] (TOML, JSON, YAML, Hugo's [params]); broken.md: an error
    "docusaurus": "all",  # docs/internal/billing.mdx: groups [billing, admin]
    "mkdocs": "all",  # no page has frontmatter: public
}


# -- the generated sites --------------------------------------------------------------------------


@dataclass
class Generated:
    """A generated site: its ingest flags and, stated here, what each reader sees and which files
    the report names as errors."""

    args: tuple[str, ...]
    visible: dict[str, set[str]]
    errors: set[str]


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def generate_batch_bound(root: Path, bound: int) -> Generated:
    """One page of more chunks than the server takes in one batch: `bound` + 500 lines, each shorter
    than --max-chunk-chars 48 but no two of them fitting in one chunk."""
    lines = [f"line {n:05d} of the lemurbatch page" for n in range(bound + 500)]
    write_files(
        root,
        {
            "index.md": b"# A small public page\n\nNothing to hide here.\n",
            "long.md": ("---\npublic: false\ngroups: [billing]\n---\n" + "\n".join(lines) + "\n").encode(),
        },
    )
    visible = {"anonymous": {"index.md"}, "admin": {"index.md"}, "billing": {"index.md", "long.md"}}
    return Generated(("--max-chunk-chars", "48"), visible, set())


def generate_odd_bytes(root: Path) -> Generated:
    """Pages with a NUL byte or invalid UTF-8 next to their access keys. Frontmatter that is not a
    mapping of `key: value` lines, or whose access keys do not parse, is served to nobody (FORMAT.md,
    "fail closed"); bytes in the body never change who may read the page."""
    write_files(
        root,
        {
            # NUL in the body: the frontmatter decides
            "nul-body.md": b"---\npublic: false\ngroups: [admin]\n---\nby Jane\x00Doe, okapinulbody\n",
            "nul-public.md": b"---\npublic: true\n---\na NUL \x00 in a public page\n",
            # NUL inside the access keys: they cannot be read, so nobody
            "nul-in-groups.md": b"---\ngroups: [ad\x00min, billing]\n---\nokapinulgroups\n",
            "nul-after-public.md": b"---\npublic: false\x00\ngroups: [admin]\n---\nokapinulpublic\n",
            # invalid UTF-8 as a line of the block: not `key: value`, so nobody
            "ff-line-in-block.md": b"---\ngroups: [billing]\n\xff\xfe\n---\nokapiffblock\n",
            # invalid UTF-8 next to, but outside, the access keys: the keys decide
            "ff-in-title.md": b"---\ntitle: caf\xe9\npublic: false\ngroups: [admin]\n---\n\xff\xfe okapifftitle\n",
            "ff-after-fence.md": b"---\ngroups: [billing]\n---\n\xff\xfe\nokapiffbilling refunds\n",
            "crlf-ff.md": b"---\r\npublic: false\r\ngroups: [admin]\r\n---\r\n\xff\r\nokapicrlf\r\n",
            "latin1-public.md": b"---\npublic: true\n---\nCaf\xe9 cr\xe8me, a Latin-1 page\n",
            "data/blob.bin": bytes(range(256)) * 4,  # binary, not a page: the default (public)
        },
    )
    public = {"nul-public.md", "latin1-public.md", "data/blob.bin"}
    visible = {
        "anonymous": public,
        "admin": public | {"nul-body.md", "ff-in-title.md", "crlf-ff.md"},
        "billing": public | {"ff-after-fence.md"},
    }
    return Generated((), visible, {"nul-in-groups.md", "nul-after-public.md", "ff-line-in-block.md"})


BIG_PAGES = 2000
BIG_PAGE_BYTES = 10_500
BIG_ACCESS = {  # page number % 20 -> (frontmatter, the readers who see it); the rest: no frontmatter
    0: (b"---\ngroups: [admin]\n---\n", {"admin"}),
    1: (b"---\npublic: false\ngroups: [billing]\n---\n", {"billing"}),
    2: (b"---\npublic: false\n---\n", {"admin", "billing"}),
    3: (b"---\npublic: true\ngroups: [admin]\n---\n", {"anonymous", "admin", "billing"}),
}
BIG_WORDS = {0: "zebraadminonly", 1: "yakbillingonly", 2: "gnusignedinonly"}


def generate_big(root: Path) -> Generated:
    """2,000 pages of varied text, over 16 MiB for every reader, the same every run; the admin's own pages
    in a folder of their own."""
    rng = random.Random(20240601)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    vocabulary = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(4000)]
    visible: dict[str, set[str]] = {reader: set() for reader in READERS}
    files = {}
    for n in range(BIG_PAGES):
        folder = "admin-area" if n % 20 == 0 else f"section-{n % 25:02d}"  # a folder of hidden pages only
        name = f"{folder}/page-{n:04d}.md"
        front, readers = BIG_ACCESS.get(n % 20, (b"", set(READERS)))
        words = rng.choices(vocabulary, k=BIG_PAGE_BYTES // 6)
        if n % 20 in BIG_WORDS:
            words[len(words) // 2] = BIG_WORDS[n % 20]
        body = "\n".join(" ".join(words[i : i + 14]) for i in range(0, len(words), 14))
        files[name] = front + f"# Page {n}\n\n{body}\n".encode()
        for reader in readers:
            visible[reader].add(name)
    write_files(root, files)
    return Generated((), visible, set())


# -- expectations ----------------------------------------------------------------------------------


ACCESS_LINE = re.compile(r"^\s*(?:public|groups)\s*:", re.MULTILINE)


def plain_frontmatter(data: bytes) -> dict | None:
    """The YAML frontmatter of a page read the plain way (None: it has none). A block that does not
    parse but names an access key gives {"unreadable": True}: such a page is for nobody."""
    text = data.decode("utf-8", "replace").removeprefix("\ufeff").replace("\r\n", "\n")
    if not text.startswith("---\n"):
        return None
    block = re.split(r"^(?:---|\.\.\.)[ \t]*$", text[4:], maxsplit=1, flags=re.MULTILINE)
    if len(block) != 2:
        return None
    try:
        front = yaml.safe_load(block[0])
    except yaml.YAMLError:
        front = None
    if isinstance(front, dict):
        return front
    return {"unreadable": True} if ACCESS_LINE.search(block[0]) else None


def corpus_visibility(files: dict[str, Path], errors: set[str]) -> dict[str, set[str]]:
    """The corpus is ingested with the default (public): a page is hidden from a reader only by its
    own frontmatter; a file the report names as an error is shown to nobody."""
    visible: dict[str, set[str]] = {reader: set() for reader in READERS}
    for key, path in files.items():
        front = (plain_frontmatter(path.read_bytes()) if key.endswith(MARKDOWN) else None) or {}
        if key in errors or front.get("unreadable"):
            continue
        groups = front.get("groups")
        groups = {g.strip() for g in groups.split(",")} if isinstance(groups, str) else set(groups or [])
        public = front.get("public")
        if isinstance(public, str):
            public = public.strip().lower() == "true"
        if public is None:
            public = not groups  # the site's default is public, unless the page names groups
        for reader, reader_groups in READERS.items():
            if public is True or (reader_groups is not None and (not groups or groups & set(reader_groups))):
                visible[reader].add(key)
    return visible


# -- the deployment --------------------------------------------------------------------------------


@dataclass
class Site:
    name: str
    source: Path
    files: dict[str, Path]
    visible: dict[str, set[str]]
    report: dict
    status: int
    seconds: float
    words: dict[Path, set[bytes]] = field(default_factory=dict)


@dataclass
class Deployment:
    root: Path
    chroma: ChromaServer
    redis: RedisServer
    socket: Path
    secret_file: Path
    token_file: Callable[..., Path]
    bound: int = 0  # the server's batch bound: get_max_batch_size()
    sites: dict[str, Site] = field(default_factory=dict)
    sessions: dict[tuple[str, str], Path] = field(default_factory=dict)

    def session(self, site: str, reader: str) -> Path:
        """A session mount of the site for the reader, opened through the mount server once."""
        if (site, reader) not in self.sessions:
            mountpoint = self.root / "sessions" / f"{site}-{reader}"
            mountpoint.mkdir(parents=True)
            args = ["--site", site, "--chroma-url", self.chroma.url, "--redis-url", self.redis.url]
            args += ["--mountd", str(self.socket), "--jwt-secret-file", str(self.secret_file)]
            groups = READERS[reader]
            if groups is not None:
                args += ["--token-file", str(self.token_file(list(groups), site=site))]
            done = subprocess.run(
                [MOUNT, str(mountpoint), *args],
                capture_output=True,
                text=True,
                timeout=180,
                env=child_env(),
                stdin=subprocess.DEVNULL,
            )
            assert done.returncode == 0, f"session {site}/{reader}: {done.stderr}"
            self.sessions[site, reader] = mountpoint
        return self.sessions[site, reader]


def ingest(deployment: Deployment, name: str, source: Path, *args: str) -> Site:
    report = deployment.root / f"report-{name}.json"
    argv = [INGEST, str(source), "--site", name, "--chroma-url", deployment.chroma.url]
    argv += ["--redis-url", deployment.redis.url, "--blob-store", (deployment.root / "blobs").as_uri()]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--report", str(report), "--quiet", *args], capture_output=True, text=True, timeout=600, env=child_env()
    )
    assert done.returncode in (0, 3), f"ingest of {name}: {done.stderr}"
    return Site(name, source, source_files(source), {}, json.loads(report.read_text()), done.returncode,
                time.monotonic() - started)  # fmt: skip


def error_paths(site: Site) -> set[str]:
    return {p["path"] for p in site.report["problems"] if p["severity"] == "error"}


def build_sites(deployment: Deployment, bound: int) -> dict[str, Site]:
    generated_root = deployment.root / "generated"
    generated = {
        "gen-batch-bound": generate_batch_bound(generated_root / "gen-batch-bound", bound),
        "gen-odd-bytes": generate_odd_bytes(generated_root / "gen-odd-bytes"),
        "gen-big": generate_big(generated_root / "gen-big"),
    }
    jobs: dict[str, tuple[Path, tuple[str, ...]]] = {name: (SITES / name, tuple(spec["args"]))
                                                     for name, spec in SITES_YAML.items()}  # fmt: skip
    jobs.update({name: (generated_root / name, spec.args) for name, spec in generated.items()})
    if CORPUS.is_dir():
        jobs["mintlify-docs"] = (CORPUS, ())
    largest_first = sorted(jobs, key=lambda name: -sum(p.stat().st_size for p in source_files(jobs[name][0]).values()))
    with ThreadPoolExecutor(2) as pool:  # two cores: the server and one ingest each
        futures = {name: pool.submit(ingest, deployment, name, jobs[name][0], *jobs[name][1]) for name in largest_first}
        sites = {name: futures[name].result() for name in sorted(jobs)}
    for name, site in sites.items():
        errors = error_paths(site)
        everything = set(site.files)
        if name in SITES_YAML:
            spec = SITES_YAML[name]
            assert (site.status, errors) == (spec["exit"], set(spec["errors"])), site.report["problems"]
            site.visible = {
                "anonymous": expand(spec["anonymous"], everything, errors),
                "admin": expand(spec["admin"], everything, errors),
                "billing": expand(BILLING[name], everything, errors),
            }
        elif name in generated:
            assert errors == generated[name].errors, site.report["problems"]
            assert site.status == (3 if errors else 0)
            outcomes = {p["outcome"] for p in site.report["problems"] if p["severity"] == "error"}
            assert outcomes <= {"hidden from everyone"}, site.report["problems"]
            site.visible = generated[name].visible
        else:
            site.visible = corpus_visibility(site.files, errors)
            assert site.report["pages"] == len(everything) - len(errors)
    return sites


def stray_processes(marker: str) -> list[int]:
    """Processes (other than this one) whose command line names `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def conformance_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's folder. Torn down last: then no mount may be left under it and no process
    (a server, a class mount's daemon, its watchdog) may still name it."""
    root = tmp_path_factory.mktemp("conformance")
    yield root
    for path in mounts_under(root):
        unmount(path)
    left = [pid for pid in stray_processes(str(root)) if not wait_gone(pid, 10.0)]
    for pid in left:  # every one of them is a process this module started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running after the servers stopped: {left}"


@pytest.fixture(scope="module")
def chroma(chroma_server: ChromaServer) -> ChromaServer:
    """The session's `chroma run`: the sites' collections are this module's own."""
    return chroma_server


@pytest.fixture(scope="module")
def redis(conformance_root: Path) -> Iterator[RedisServer]:
    with RedisServer(conformance_root / "redis") as server:
        yield server


@pytest.fixture(scope="module")
def mount_server(conformance_root: Path) -> Iterator[MountServer]:
    """chromafs-mountd with shared class mounts; afterwards every session and class mount is
    unmounted, and each class mount's daemon must end."""
    folder, sessions = conformance_root / "mountd", conformance_root / "sessions"
    folder.mkdir()
    sessions.mkdir()
    class_pids: list[int] = []
    with running_mount_server(folder, sessions, class_idle_s=900.0) as server:
        try:
            yield server
        finally:
            with contextlib.suppress(OSError, ValueError, KeyError):
                state = StateJournal(str(server.class_root / "state.json")).load()
                class_pids = [c.pid for c in state.classes.values()]
    left = [pid for pid in class_pids if not wait_gone(pid, 15.0)]
    assert not left, f"class mount daemons still running once unmounted: {left}"


@pytest.fixture(scope="module")
def deployment(
    conformance_root: Path,
    chroma: ChromaServer,
    redis: RedisServer,
    mount_server: MountServer,
    secret_file: Path,
    token_file: Callable[..., Path],
) -> Deployment:
    """Every site ingested (sessions are opened by the tests, each once)."""
    import chromadb

    url = urlparse(chroma.url)
    bound = chromadb.HttpClient(host=url.hostname, port=url.port).get_max_batch_size()
    deployment = Deployment(conformance_root, chroma, redis, mount_server.socket, secret_file, token_file, bound)
    started = time.monotonic()
    deployment.sites = build_sites(deployment, bound)
    timings = ", ".join(f"{s.name} {s.seconds:.1f}s" for s in deployment.sites.values())
    print(f"\ningest of every site: {time.monotonic() - started:.1f}s ({timings})")
    return deployment


# -- reading a session mount with the real tools ------------------------------------------------------


def listing(mountpoint: Path) -> tuple[dict[str, int], set[str], list[str]]:
    """(file -> size, directories, anything else) under the mount, from the real `find`."""
    found = subprocess.run(
        ["find", ".", "-mindepth", "1", "-printf", "%y %s %P\\0"], cwd=mountpoint, capture_output=True, timeout=300
    )
    assert found.returncode == 0, found.stderr
    files: dict[str, int] = {}
    dirs: set[str] = set()
    other: list[str] = []
    for record in found.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]:
        kind, size, name = record.split(" ", 2)
        if kind == "f":
            files[name] = int(size)
        elif kind == "d":
            dirs.add(name)
        else:
            other.append(f"{kind} {name}")
    return files, dirs, other


def cat_files(mountpoint: Path, names: list[str], sizes: dict[str, int]) -> Iterator[tuple[str, bytes]]:
    """Each file's bytes as the real `cat` reads them: many files per `cat`, cut at the sizes the
    listing gave; a batch that does not add up is read again one `cat` per file."""
    for start in range(0, len(names), 400):
        batch = names[start : start + 400]
        out = subprocess.run(["cat", "--", *batch], cwd=mountpoint, capture_output=True, timeout=300)
        if out.returncode == 0 and len(out.stdout) == sum(sizes[n] for n in batch):
            offset = 0
            for name in batch:
                yield name, out.stdout[offset : offset + sizes[name]]
                offset += sizes[name]
            continue
        for name in batch:
            one = subprocess.run(["cat", "--", name], cwd=mountpoint, capture_output=True, timeout=60)
            assert one.returncode == 0, f"cat {name}: {one.stderr.decode(errors='replace')}"
            yield name, one.stdout


def parents(names: set[str]) -> set[str]:
    return {str(parent) for name in names for parent in Path(name).parents if str(parent) != "."}


def made_up(name: str) -> str:
    """A name beside `name` that never existed."""
    head, _, tail = name.rpartition("/")
    return f"{head}/never-was-{tail}" if head else f"never-was-{tail}"


def tool_errors(tool: str, mountpoint: Path, names: list[str]) -> list[str]:
    """What the real `stat` or `cat` says of each name, the name itself replaced by NAME."""
    said = []
    for name in names:  # one call per name: each line is then surely about that name
        out = subprocess.run([tool, "--", name], cwd=mountpoint, capture_output=True, timeout=60, env=child_env())
        said.append(f"exit {out.returncode}, {len(out.stdout)} bytes out: {out.stderr.decode().replace(name, 'NAME')}")
    return said


def syscall_errno(path: Path) -> tuple[int | None, int | None]:
    results: list[int | None] = []
    for call in (os.stat, lambda p: os.close(os.open(p, os.O_RDONLY))):
        try:
            call(path)
            results.append(None)
        except OSError as exc:
            results.append(exc.errno)
    return results[0], results[1]


WORD = re.compile(rb"[A-Za-z][A-Za-z0-9]{5,}")


def words_of(site: Site, key: str) -> set[bytes]:
    path = site.files[key]
    if path not in site.words:
        site.words[path] = set(WORD.findall(path.read_bytes()))
    return site.words[path]


def hidden_only_words(site: Site, hidden: set[str], visible: set[str], most: int = 8) -> list[str]:
    """Words of the hidden files that no visible file holds, not even inside another word."""
    candidates = set().union(*(words_of(site, k) for k in hidden)) - set().union(*(words_of(site, k) for k in visible))
    visible_bytes = b"\0".join(site.files[k].read_bytes() for k in sorted(visible))
    chosen = []
    for word in sorted(candidates, key=lambda w: (-len(w), w)):
        if word not in visible_bytes:
            chosen.append(word.decode())
            if len(chosen) == most:
                break
    return chosen


# -- the tests ---------------------------------------------------------------------------------------

SITE_NAMES = sorted([*SITES_YAML, "gen-batch-bound", "gen-odd-bytes", "gen-big", "mintlify-docs"])


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("name", SITE_NAMES)
def test_a_reader_sees_exactly_what_the_frontmatter_says_and_nothing_leaks(
    deployment: Deployment, name: str, reader: str
) -> None:
    if name == "mintlify-docs":
        need_corpus(CORPUS)
    site = deployment.sites[name]
    expected = site.visible[reader]
    hidden = set(site.files) - expected
    mountpoint = deployment.session(name, reader)

    files, dirs, other = listing(mountpoint)
    leaks = sorted(set(files) & hidden)
    assert not leaks, f"LEAK: {reader} sees {len(leaks)} pages of {name} the frontmatter hides from it: {leaks[:20]}"
    assert not other, f"{reader} on {name}: entries that are neither files nor directories: {other[:20]}"
    unknown = sorted(set(files) - set(site.files))
    missing = sorted(expected - set(files))
    assert not unknown and not missing, f"{reader} on {name}: not in the source {unknown[:20]}, missing {missing[:20]}"
    hidden_dirs = parents(set(site.files)) - parents(expected)
    assert not dirs & hidden_dirs, (
        f"LEAK: {reader} sees folders of {name} holding only hidden pages: {dirs & hidden_dirs}"
    )
    assert dirs == parents(expected), f"{reader} on {name}: folders {sorted(dirs ^ parents(expected))[:20]}"

    wrong_size = sorted(k for k, size in files.items() if size != site.files[k].stat().st_size)
    assert not wrong_size, f"{reader} on {name}: sizes differ from the source: {wrong_size[:20]}"
    for key, data in cat_files(mountpoint, sorted(files), files):
        assert data == site.files[key].read_bytes(), f"{reader} on {name}: {key} differs from its source"

    # a hidden path answers exactly as a name that never existed does
    ghosts = sorted(hidden | hidden_dirs)
    for key in ghosts:
        assert not os.path.exists(site.source / made_up(key))
        seen, never = syscall_errno(mountpoint / key), syscall_errno(mountpoint / made_up(key))
        assert seen == never == (errno.ENOENT, errno.ENOENT), f"LEAK: {reader} on {name}: {key} gives {seen}"
    sample = ghosts[:40] if len(ghosts) > 40 else ghosts  # the tools, on the first few of them
    for tool in ("stat", "cat"):
        said, never = tool_errors(tool, mountpoint, sample), tool_errors(tool, mountpoint, [made_up(k) for k in sample])
        differ = [(k, s) for k, s, n in zip(sample, said, never, strict=True) if s != n]
        assert not differ, f"LEAK: {tool} tells a hidden page of {name} from a made-up name for {reader}: {differ[:5]}"

    words = hidden_only_words(site, hidden, expected) if hidden else []
    if name.startswith("gen-") and hidden:
        assert words, f"the generated pages of {name} hidden from {reader} should hold words of their own"
    if words:
        grep = ["grep", "-rlF", *(f"-e{word}" for word in words), "."]
        found = subprocess.run(grep, cwd=mountpoint, capture_output=True, timeout=300)
        assert (found.returncode, found.stdout) == (1, b""), (
            f"LEAK: {reader} on {name}: grep for words of hidden pages only ({words}) found {found.stdout[:500]!r}"
            f" {found.stderr[:500]!r}"
        )
        in_source = subprocess.run([*grep[:-1], *sorted(hidden)], cwd=site.source, capture_output=True, timeout=300)
        assert in_source.stdout, f"the words {words} are not in the hidden pages of {name}: the grep proves nothing"


def test_the_generated_sites_are_what_they_claim(deployment: Deployment) -> None:
    """The known-bad cases are there: a page of more chunks than one batch of the server, pages stored
    in the blob store, and a site of over 16 MiB for every reader."""
    batch = deployment.sites["gen-batch-bound"]
    assert batch.report["chunks_written"] > deployment.bound + 400, batch.report
    assert deployment.sites["gen-odd-bytes"].report["lazy_files"] >= 5  # the non-UTF-8 pages and the binary
    big = deployment.sites["gen-big"]
    for reader, visible in big.visible.items():
        assert sum(big.files[k].stat().st_size for k in visible) > 16 * 1024 * 1024, reader
