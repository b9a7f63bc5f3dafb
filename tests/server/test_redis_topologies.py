"""The shared cache as platforms run Redis: a Redis Cluster (a site's keys in one slot), a master behind
Sentinel, and TLS with a private CA. A failover (a master killed) costs no read: the mount serves from
Chroma meanwhile, with one warning line each way, and follows the new master, announcements included."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import HOST, SAMPLE_SITE, RedisServer, hold_for, ingest, mounted, redis_subscribed, try_mount, wait_until
from redis_topologies import RedisClusterServers, RedisSentinelServers, TlsRedisServer, make_tls_files

SITE = "acme"
GENERATED_PAGES = 150


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    with RedisClusterServers(tmp_path / "cluster") as servers:
        yield servers


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[RedisSentinelServers]:
    with RedisSentinelServers(tmp_path / "sentinel") as servers:
        yield servers


def site_with_many_pages(tmp_path: Path) -> Path:
    """The sample site and GENERATED_PAGES more, so that reads of pages never read before span a failover."""
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    (site / "many").mkdir()
    for n in range(GENERATED_PAGES):
        (site / "many" / f"page-{n:03d}.md").write_text(f"# Page {n}\n\n" + f"Line {n} of the generated pages.\n" * 40)
    return site


def read_during(mnt: Path, site: Path, pages: list[str], pace_s: float) -> tuple[list[str], list[float]]:
    """Read each page once (cold: never read before), `pace_s` apart: the mismatches or errors, and
    every read's seconds."""
    problems: list[str] = []
    latencies: list[float] = []
    for page in pages:
        started = time.perf_counter()
        try:
            if (mnt / page).read_bytes() != (site / page).read_bytes():
                problems.append(f"{page}: bytes differ")
        except OSError as exc:
            problems.append(f"{page}: {exc}")
        latencies.append(time.perf_counter() - started)
        hold_for(pace_s, "the pace of the reads")
    return problems, latencies


@pytest.mark.parametrize("topology", ["cluster", "sentinel"])
@pytest.mark.expect_log(r"WARNING .*Redis \(.*\) (unavailable, reading from the backend instead|is reachable again)")
def test_a_failover_costs_no_read_and_the_mount_follows_the_new_master(
    topology: str, tmp_path: Path, mnt: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue(topology)
    site = site_with_many_pages(tmp_path)
    backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma"), "--redis-url", redis.url]
    ingest(site, *backend, "--quiet")
    # a poll a minute away: only an announcement on the new master can switch the mount in time
    options = ["--refresh-interval", "60", "--preload", "off", "--readahead-pages", "0", "--backend-timeout", "5"]
    with mounted(mnt, *backend, *options):
        pages = [f"many/page-{n:03d}.md" for n in range(GENERATED_PAGES)]
        problems, _ = read_during(mnt, site, pages[:10], 0)
        assert problems == []
        if topology == "cluster":
            holders = {port: keys for port, keys in redis.keys_per_node().items() if keys}
            masters = {port for port in holders if "role:master" in redis_node(redis, port).cli("info", "replication")}
            assert len(masters) == 1, f"the site's keys are spread over masters {sorted(masters)}"
            lost = redis.master_of(f"chromafs:{{{SITE}}}:x")
        else:
            lost = redis.master

        outcome: list[tuple[list[str], list[float]]] = []
        reader = threading.Thread(target=lambda: outcome.append(read_during(mnt, site, pages[10:], 0.07)))
        reader.start()
        hold_for(1.0, "the master is lost in the middle of the paced reads")
        lost.kill()
        reader.join(120)
        problems, latencies = outcome[0]
        assert problems == [], "reads failed through the failover"
        slowest = max(latencies)
        assert slowest < 5.0, f"a read waited {slowest:.2f}s"

        log = (tmp_path / "mnt.log").read_text()
        assert log.count("unavailable, reading from the backend instead") == 1, log
        assert log.count("is reachable again") == 1, "the mount did not return to Redis after the failover"

        page = "quickstart.mdx"
        assert (mnt / page).read_bytes() == (site / page).read_bytes()
        (site / page).write_bytes((site / page).read_bytes() + b"\nAfter the failover.\n")
        ingest(site, *backend, "--quiet")
        wait_until(
            lambda: (mnt / page).read_bytes() == (site / page).read_bytes(),
            3.0,
            "the announcement on the new master reaching the mount",
            0.05,
        )


def test_a_cluster_without_sharded_pubsub_still_announces(tmp_path: Path, mnt: Path) -> None:
    """Redis before 7.0 has no SPUBLISH/SSUBSCRIBE (here: renamed away): the ingest falls back to
    PUBLISH, the mount to SUBSCRIBE, and a mount whose poll is a minute away still switches at once."""
    no_sharding = ("--rename-command", "SPUBLISH", "", "--rename-command", "SSUBSCRIBE", "")
    with RedisClusterServers(tmp_path / "cluster", 3, 0, 1000, *no_sharding) as cluster:
        site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
        backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma"), "--redis-url", cluster.url]
        ingest(site, *backend, "--quiet")
        with mounted(mnt, *backend, "--refresh-interval", "60"):
            page = "quickstart.mdx"
            assert (mnt / page).read_bytes() == (site / page).read_bytes()
            wait_until(lambda: redis_subscribed(*cluster.nodes), 10, "the mount subscribed", 0.05)
            (site / page).write_bytes((site / page).read_bytes() + b"\nAnnounced without sharding.\n")
            done = ingest(site, *backend, "--quiet", "--log-level", "warning")
            assert "no sharded pub/sub" in done.stderr
            wait_until(
                lambda: (mnt / page).read_bytes() == (site / page).read_bytes(),
                2.0,
                "the switch after the ingest",
                0.05,
            )


def redis_node(cluster: RedisClusterServers, port: int) -> RedisServer:
    return next(node for node in cluster.nodes if node.port == port)


def test_a_cluster_serves_a_second_mount_with_chroma_gone(
    cluster: RedisClusterServers, tmp_path: Path, mnt: Path
) -> None:
    chroma = tmp_path / "chroma"
    backend = ["--site", SITE, "--chroma-path", str(chroma), "--redis-url", cluster.url]
    ingest(SAMPLE_SITE, *backend, "--quiet")
    with mounted(mnt, *backend, "--preload", "on"):
        subprocess.run(["grep", "-rq", "never-matches-anything", str(mnt)], check=False, timeout=60)
    shutil.rmtree(chroma)
    second = tmp_path / "second"
    with mounted(second, *backend):
        for page in ("quickstart.mdx", "guides/troubleshooting.md"):
            assert (second / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()
        assert "loaded from Redis" in (tmp_path / "second.log").read_text()


@pytest.mark.expect_log(r"WARNING .*Redis \(rediss://.*\) unavailable, .*CERTIFICATE_VERIFY_FAILED")
def test_tls_with_a_private_ca(tmp_path: Path, mnt: Path) -> None:
    ca, cert, key = make_tls_files(tmp_path / "tls")
    with TlsRedisServer(tmp_path / "redis", ca, cert, key) as redis:
        backend = ["--site", SITE, "--chroma-path", str(tmp_path / "chroma"), "--redis-url", redis.url]
        ingest(SAMPLE_SITE, *backend, "--redis-ca", str(ca), "--quiet")
        assert redis.cli("exists", f"chromafs:{{{SITE}}}:{SITE}:tree") == "1", "the ingest did not publish over TLS"
        with mounted(mnt, *backend, "--redis-ca", str(ca)):
            assert (mnt / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
            assert "loaded from Redis" in (tmp_path / "mnt.log").read_text()
        # without the CA the server's certificate is refused: one clear line, and the mount serves from Chroma
        other = tmp_path / "no-ca"
        with mounted(other, *backend):
            assert (other / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
            log = (tmp_path / "no-ca.log").read_text()
            assert log.count("CERTIFICATE_VERIFY_FAILED") == 1, log


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://", "no host:port given"),
        ("redis+sentinel://127.0.0.1:26379", "give the master's service name"),
        ("memcached://127.0.0.1:11211", "unknown scheme 'memcached'"),
        (f"redis+cluster://{HOST}:port", "port 'port' is not a number"),
    ],
)
def test_a_bad_redis_url_is_a_flag_error(url: str, message: str, mnt: Path, tmp_path: Path) -> None:
    proc = try_mount(mnt, "--site", SITE, "--chroma-path", str(tmp_path / "none"), "--redis-url", url)
    assert proc.returncode != 0
    assert "--redis-url" in proc.stderr and message in proc.stderr, proc.stderr
