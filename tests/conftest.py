from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest

from chromafs_fuse.serving.mounttable import is_mounted
from infra import (
    SAMPLE_SITE,
    Backend,
    ChromaServer,
    MountServer,
    RedisServer,
    S3Server,
    ingest,
    log_sizes,
    mounts_under,
    running_mount_server,
    unexpected_log_lines,
    unmount,
)

SITE = "acme"


@pytest.fixture(scope="session")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "secret"
    path.write_text("test-secret-0123456789abcdef0123456789\n")
    return path


@pytest.fixture(scope="session")
def make_token(secret_file: Path) -> Callable[..., str]:
    secret = secret_file.read_text().strip()

    def make(groups: list[str] | None = None, **claims: object) -> str:
        payload: dict[str, object] = {"sub": "tester", "site": SITE, "exp": int(time.time()) + 3600}
        if groups is not None:
            payload["groups"] = groups
        payload.update(claims)
        return jwt.encode(payload, secret, algorithm="HS256")

    return make


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory, make_token: Callable[..., str]) -> Callable[..., Path]:
    folder = tmp_path_factory.mktemp("tokens")
    counter = iter(range(10**6))

    def write(groups: list[str] | None = None, raw: str | None = None, **claims: object) -> Path:
        path = folder / f"token-{next(counter)}.jwt"
        path.write_text(raw if raw is not None else make_token(groups, **claims))
        return path

    return write


@pytest.fixture(scope="session")
def sample_chroma(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The sample site ingested into an embedded Chroma, once per default access."""
    made: dict[str, Path] = {}

    def get(default: str = "public") -> Path:
        if default not in made:
            path = tmp_path_factory.mktemp(f"chroma-{default}")
            ingest(SAMPLE_SITE, "--site", SITE, "--chroma-path", str(path), "--default-access", default, "--quiet")
            made[default] = path
        return made[default]

    return get


@pytest.fixture(scope="session")
def sample_backend(sample_chroma: Callable[[str], Path]) -> Callable[..., Backend]:
    """The sample site of `sample_chroma`, as the flags that name it (`.args`)."""

    def get(default: str = "public") -> Backend:
        return Backend(SITE, sample_chroma(default))

    return get


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    with ChromaServer(tmp_path_factory.mktemp("chroma-server") / "data") as server:
        yield server


@pytest.fixture
def fresh_chroma_server(tmp_path: Path) -> Iterator[Callable[..., ChromaServer]]:
    """Starts a `chroma run` of the test's own (in tmp_path/`name`), for a test that stops, freezes or
    restarts it; each is stopped by its PID when the test ends. A test that only reads and writes its
    own collections uses the session's `chroma_server`."""
    with contextlib.ExitStack() as servers:

        def start(name: str = "chroma-data") -> ChromaServer:
            return servers.enter_context(ChromaServer(tmp_path / name))

        yield start


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    with S3Server(tmp_path) as server:
        yield server


@pytest.fixture
def start_mount_server(tmp_path: Path) -> Iterator[Callable[..., MountServer]]:
    """Starts chromafs-mountd on a socket in tmp_path (or in `folder`), options as MountServer's. When
    the test ends, the server is stopped and every mount under tmp_path and `also` is unmounted: the
    test's sessions and the server's class mounts alike."""
    with contextlib.ExitStack() as servers:

        def start(
            *also: Path,
            folder: Path | None = None,
            isolated: bool = False,
            class_idle_s: float = 300.0,
            metrics_port: int | None = None,
        ) -> MountServer:
            running = running_mount_server(
                folder or tmp_path,
                tmp_path,
                *also,
                isolated=isolated,
                class_idle_s=class_idle_s,
                metrics_port=metrics_port,
            )
            return servers.enter_context(running)

        yield start


@pytest.fixture(autouse=True, scope="session")
def _no_stale_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    leftovers = mounts_under(tmp_path_factory.getbasetemp())
    for path in leftovers:
        unmount(path)
    assert not [p for p in leftovers if is_mounted(p)]


TIERS = {
    "unit": "in-process: no mount, no server (the whole tier under a minute)",
    "mount": "real FUSE mounts of embedded Chroma",
    "server": "Chroma servers, Redis, S3 and the mount server, started for real",
    "containers": "the container files and the container checks",
}
# Test modules share helpers across tiers (a server test probes as a mount test does): each tier's
# folder is importable whichever tier runs alone (module names are unique across tiers).
for _tier in TIERS:
    _folder = str(Path(__file__).resolve().parent / _tier)
    if _folder not in sys.path:
        sys.path.append(_folder)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "expect_log(*patterns): log lines (regexes) a test provokes on purpose in the daemons it starts"
    )
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what} (the tests under tests/{tier})")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its tier, the folder it is in (`-m unit` as `scripts/test --tier unit`)."""
    for item in items:
        tier = item.path.parent.name
        if tier in TIERS:
            item.add_marker(tier)


@pytest.fixture
def expect_log(request: pytest.FixtureRequest) -> Callable[..., None]:
    """`expect_log(r"regex", ...)`: the daemons this test starts may log lines matching these (a
    warning or traceback provoked on purpose); the `expect_log` marker says the same for a module or test."""
    expected: list[re.Pattern[str]] = request.node.stash.setdefault(EXPECTED_LOG, [])

    def expect(*patterns: str) -> None:
        expected.extend(re.compile(p) for p in patterns)

    return expect


EXPECTED_LOG = pytest.StashKey[list[re.Pattern[str]]]()


@pytest.fixture(autouse=True)
def _daemon_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test whose chromafs daemons (mount daemons with a --log-file, chromafs-mountd, serving
    processes; infra's `watch_log`) logged a traceback, a warning or an error it did not expect
    (`expect_log`). Set up before, so torn down after, the test's servers and mounts: their last lines
    count."""
    since = log_sizes()
    yield
    expected = list(request.node.stash.get(EXPECTED_LOG, []))
    for marker in request.node.iter_markers("expect_log"):
        expected += [re.compile(p) for p in marker.args]
    bad = unexpected_log_lines(since, expected)
    if bad:
        pytest.fail("unexpected lines in the logs of the daemons this test started (expect_log if on purpose):\n  "
                    + "\n  ".join(bad[:20]), pytrace=False)  # fmt: skip


@pytest.fixture
def mnt(tmp_path: Path) -> Path:
    path = tmp_path / "mnt"
    path.mkdir()
    return path


os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# Status files and shells of this run in a folder of its own, never the machine's /run/chromafs
# (another test run or a real service there would change what `chromafs status` lists).
RUNTIME_DIR = Path(tempfile.mkdtemp(prefix="chromafs-test-run-"))
os.environ["CHROMAFS_RUNTIME_DIR"] = str(RUNTIME_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's runtime folder goes with it (never while something is mounted inside it)."""
    if not mounts_under(RUNTIME_DIR):
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)
