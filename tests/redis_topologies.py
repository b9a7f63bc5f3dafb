"""Redis as platforms run it, for the tests and scripts/rehearse-hosts: a Redis Cluster (redis-server
in cluster mode, masters with replicas), a master and replica behind a Sentinel, and a TLS-only
server with its own CA. Every process on a free loopback port, stopped by its PID."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Self

from infra import HOST, RedisServer, Server, free_port, wait_until


class RedisClusterServers:
    """`masters` masters with `replicas` replicas each; a node is declared failed after `node_timeout_ms`."""

    def __init__(
        self, folder: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000, *more: str
    ) -> None:
        options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        options += ("--cluster-node-timeout", str(node_timeout_ms), "--cluster-require-full-coverage", "no")
        options += ("--cluster-replica-validity-factor", "0", *more)  # a cache: a replica may always take over
        self.masters, self.replicas = masters, replicas
        count = masters * (1 + replicas)  # the bus on a port of its own: the default, port + 10000, may be taken
        self.nodes = [
            RedisServer(folder / f"node{i}", *options, "--cluster-port", str(free_port())) for i in range(count)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes[:3])

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"{HOST}:{node.port}" for node in self.nodes]
            create = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas)]
            done = subprocess.run([*create, "--cluster-yes"], capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            wait_until(self.healthy, 30, "the cluster to agree on its slots")
        except BaseException:
            self.stop()
            raise

    def live(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.proc is not None]

    def healthy(self) -> bool:
        """Every live node sees the slots covered, and every replica has synced with its master."""
        for node in self.live():
            if "cluster_state:ok" not in node.cli("cluster", "info"):
                return False
            replication = node.cli("info", "replication")
            if "role:slave" in replication and "master_link_status:up" not in replication:
                return False
        return True

    def master_of(self, key: str) -> RedisServer:
        """The node serving `key`'s slot now, as the live nodes see it."""
        slot = int(self.live()[0].cli("cluster", "keyslot", key))
        for line in self.live()[0].cli("cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return next(node for node in self.nodes if node.port == port)
        raise RuntimeError(f"no master serves slot {slot}")

    def keys_per_node(self) -> dict[int, list[str]]:
        return {node.port: node.cli("--scan").split() for node in self.live()}

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SentinelServer(Server):
    """`redis-server --sentinel` watching `service` at `master_port`, quorum 1."""

    name = "redis-sentinel"
    wait_s = 20.0

    def __init__(self, folder: Path, service: str, master_port: int, down_after_ms: int = 1000) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder / "sentinel.log")
        self.port = free_port()
        self.service = service
        self.config = folder / "sentinel.conf"  # Sentinel rewrites it: its own file, writable
        self.config.write_text(
            f"port {self.port}\nbind {HOST}\ndir {folder}\n"
            f"sentinel monitor {service} {HOST} {master_port} 1\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} 5000\n"
            f"sentinel parallel-syncs {service} 1\n"
        )

    def argv(self) -> list[str]:
        return ["redis-server", str(self.config), "--sentinel"]

    def cli(self, *args: str) -> str:
        argv = ["redis-cli", "-h", HOST, "-p", str(self.port), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

    def ready(self) -> bool:
        return self.cli("ping") == "PONG"

    def master_port(self) -> int:
        return int(self.cli("sentinel", "get-master-addr-by-name", self.service).split()[-1])

    def knows_replica(self) -> bool:
        return "slave" in self.cli("sentinel", "replicas", self.service)


class RedisSentinelServers:
    """A master, its replica, and one Sentinel that promotes the replica when the master is lost."""

    service = "docs-cache"

    def __init__(self, folder: Path) -> None:
        self.master = RedisServer(folder / "master")
        self.replica = RedisServer(folder / "replica", "--replicaof", HOST, str(self.master.port))
        self.sentinel = SentinelServer(folder / "sentinel", self.service, self.master.port)

    @property
    def url(self) -> str:
        return f"redis+sentinel://{HOST}:{self.sentinel.port}/{self.service}"

    def start(self) -> None:
        try:
            for server in (self.master, self.replica, self.sentinel):
                server.start()
            wait_until(lambda: "master_link_status:up" in self.replica.cli("info", "replication"), 30, "replication")
            wait_until(self.sentinel.knows_replica, 30, "the Sentinel to find the replica")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.master):
            server.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    ext = folder / "san.ext"
    ext.write_text(f"subjectAltName=IP:{HOST}\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    subj = ("-subj", "/CN=chromafs test CA", "-days", "2")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), *subj)
    openssl("x509", "-in", str(ca), "-noout")  # readable
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={HOST}")
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    return ca, cert, key


class TlsRedisServer(RedisServer):
    """redis-server speaking only TLS, with a certificate from `make_tls_files`."""

    def __init__(self, folder: Path, ca: Path, cert: Path, key: Path) -> None:
        super().__init__(folder, cli_options=("--tls", "--cacert", str(ca)))
        self.tls = ("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca))
        self.url = f"rediss://{HOST}:{self.port}/0"

    def argv(self) -> list[str]:
        argv = ["redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", HOST, "--save", ""]
        return [*argv, "--dir", str(self.folder), *self.tls, "--tls-auth-clients", "no"]
