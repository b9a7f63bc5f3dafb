from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest

from chromafs_fuse.serving.mounttable import mounts
from helpers import BIN, SAMPLE_SITE, free_port, ingest, is_mounted, unmount

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


class ChromaServer:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.data.parent / f"chroma-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(BIN / "chroma"), "run", "--path", str(self.data), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/heartbeat", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("chroma run exited") from None
                time.sleep(0.2)
        raise RuntimeError("chroma run did not answer")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    server = ChromaServer(tmp_path_factory.mktemp("chroma-server") / "data")
    server.start()
    yield server
    server.stop()


class RedisServer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ping = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True).stdout


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


class S3Server:
    """moto's S3 server on a loopback port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.folder / f"moto-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("moto_server did not answer")

    def client(self) -> object:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True, scope="session")
def _no_stale_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    base = str(tmp_path_factory.getbasetemp())
    leftovers = [entry.target for entry in mounts() if entry.target.startswith(base)]
    for path in leftovers:
        unmount(Path(path))
    assert not [p for p in leftovers if is_mounted(Path(p))]


@pytest.fixture
def mnt(tmp_path: Path) -> Path:
    path = tmp_path / "mnt"
    path.mkdir()
    return path


os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
