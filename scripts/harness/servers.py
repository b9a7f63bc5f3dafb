"""The servers a test or a benchmark starts: `chroma run` (ChromaServer), `redis-server`
(RedisServer), moto's S3 server (S3Server), chromafs-csi (CsiPlugin) and chromafs-mountd
(MountServer, running_mount_server), each on a free loopback port or a socket of its own. A server
that exits or does not answer in time is stopped, and the error carries the tail of its log."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from harness.processes import BIN, HOST, child_env, free_port, log_tail, mounts_under, stop_pid, unmount, watch_log


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


class Server(ABC):
    """A server process we start, wait for until it answers, and stop by its PID."""

    name: str
    wait_s: float

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env: dict[str, str] = {}  # on top of child_env(): an S3 endpoint's credentials

    @abstractmethod
    def argv(self) -> list[str]: ...

    @abstractmethod
    def ready(self) -> bool: ...

    def start(self) -> None:
        self.watch_logs()
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # logs name pages and groups
        try:
            env = {**child_env(), **self.extra_env}
            self.proc = subprocess.Popen(
                self.argv(), stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        finally:
            os.close(fd)
        deadline = time.monotonic() + self.wait_s
        while not self.ready():
            if self.proc.poll() is not None:
                failure = f"exited with {self.proc.returncode}"
            elif time.monotonic() > deadline:
                failure = f"did not answer within {self.wait_s:.0f}s"
            else:
                time.sleep(0.1)
                continue
            self.stop()
            raise RuntimeError(f"{self.name} {failure}; {self.log}:\n    {log_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)

    def watch_logs(self) -> None:
        """Which of its logs the tests check (`watch_log`): none of a server that is not chromafs's."""
        return None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ChromaServer(Server):
    """`chroma run` on its data directory `data`; it logs to `data` + ".log"."""

    name = "chroma run"
    wait_s = 60.0

    def __init__(self, data: Path) -> None:
        super().__init__(data.with_name(f"{data.name}.log"))
        self.data = data
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [str(BIN / "chroma"), "run", "--path", str(self.data), "--host", HOST, "--port", str(self.port)]

    def ready(self) -> bool:
        return _answers(f"{self.url}/api/v2/heartbeat")


class RedisServer(Server):
    """`redis-server` without persistence, its files in `folder`."""

    name = "redis-server"
    wait_s = 20.0

    def __init__(self, folder: Path, *options: str, cli_options: tuple[str, ...] = ()) -> None:
        """`options`: more of redis-server's own (cluster mode, TLS); `cli_options`: what redis-cli
        then needs to reach it."""
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder / "redis.log")
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self.options = options
        self.cli_options = cli_options

    def argv(self) -> list[str]:
        argv = ["redis-server", "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        return [*argv, "--dir", str(self.folder), *self.options]

    def ready(self) -> bool:
        return self.cli("ping") == "PONG"

    def kill(self) -> None:
        """SIGKILL, as a crashed or lost node."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def cli(self, *args: str) -> str:
        argv = ["redis-cli", "-h", HOST, "-p", str(self.port), *self.cli_options, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

    def flushall(self) -> None:
        if self.cli("flushall") != "OK":
            raise RuntimeError("redis-cli flushall failed")


class S3Server(Server):
    """moto's S3 server; `env` points the AWS SDK of a child at it."""

    name = "moto_server"
    wait_s = 30.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "moto.log")
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }

    def argv(self) -> list[str]:
        return [str(BIN / "moto_server"), "-H", HOST, "-p", str(self.port)]

    def ready(self) -> bool:
        return _answers(f"{self.url}/moto-api/")

    def client(self) -> object:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )


class CsiPlugin(Server):
    """chromafs-csi on the unix socket `folder`/csi.sock, asking the mount server on `mountd`."""

    name = "chromafs-csi"
    wait_s = 30.0

    def __init__(self, folder: Path, mountd: Path, *flags: str, node_id: str = "node-1") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder / "csi.log")
        self.socket = folder / "csi.sock"
        self.mountd = mountd
        self.flags = flags
        self.node_id = node_id

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "chromafs_fuse.cli.csi", "--endpoint", f"unix://{self.socket}"]
        return [*argv, "--mountd", str(self.mountd), "--node-id", self.node_id, *self.flags]

    def ready(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True


class MountServer(Server):
    """chromafs-mountd on the Unix socket `folder`/mountd.sock, its class mounts in
    `folder`/classes (as root; `isolated`: a daemon per mount instead)."""

    name = "chromafs-mountd"
    wait_s = 60.0

    def __init__(
        self, folder: Path, isolated: bool = False, class_idle_s: float = 300.0, metrics_port: int | None = None
    ) -> None:
        super().__init__(folder / "mountd.log")
        self.socket = folder / "mountd.sock"
        self.class_root = folder / "classes"
        self.isolated = isolated
        self.class_idle_s = class_idle_s
        self.metrics_port = metrics_port

    def watch_logs(self) -> None:
        watch_log(self.log)
        watch_log(self.class_root)  # the serving processes'

    def argv(self) -> list[str]:
        argv = [str(BIN / "chromafs-mountd"), "--socket", str(self.socket), "--log-file", str(self.log)]
        argv += ["--class-root", str(self.class_root), "--class-idle", str(self.class_idle_s)]
        if self.metrics_port is not None:
            argv += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        return [*argv, "--isolated-only"] if self.isolated else argv

    def ready(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))  # not just the file: a killed server leaves it
            except OSError:
                return False
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would: class mounts and sessions stay."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def unmount_classes(self) -> None:
        """Unmount what the server's class mounts left (sessions are the test's own)."""
        for path in mounts_under(self.class_root):
            unmount(path)


@contextlib.contextmanager
def running_mount_server(
    folder: Path,
    *also: Path,
    isolated: bool = False,
    class_idle_s: float = 300.0,
    metrics_port: int | None = None,
) -> Iterator[MountServer]:
    """chromafs-mountd in `folder` (options as MountServer's); afterwards every mount under `folder` and
    `also` is unmounted, the test's sessions and the server's class mounts alike."""
    server = MountServer(folder, isolated=isolated, class_idle_s=class_idle_s, metrics_port=metrics_port)
    try:
        with server:
            yield server
    finally:
        for root in (*also, folder):
            for path in mounts_under(root):
                unmount(path)
