"""--redis-url's forms, parsed without a server: one server, a cluster, Sentinel, TLS, and errors that name the URL."""

from __future__ import annotations

import pytest

from chromafs_fuse.backends.redis_topology import RedisTarget, RedisURLError, parse_redis_url


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("redis://127.0.0.1:6379/2", RedisTarget("single", "redis://127.0.0.1:6379/2")),
        ("rediss://cache.example:6380/0", RedisTarget("single", "rediss://cache.example:6380/0", tls=True)),
        ("unix:///run/redis.sock?db=1", RedisTarget("single", "unix:///run/redis.sock?db=1")),
        (
            "redis+cluster://a:7000,b:7001,[::1]:7002",
            RedisTarget(
                "cluster", "redis+cluster://a:7000,b:7001,[::1]:7002", nodes=(("a", 7000), ("b", 7001), ("::1", 7002))
            ),
        ),
        (
            "rediss+cluster://user:p%40ss@a:7000/",
            RedisTarget(
                "cluster",
                "rediss+cluster://user:p%40ss@a:7000/",
                True,
                (("a", 7000),),
                username="user",
                password="p@ss",
            ),
        ),
        (
            "redis+sentinel://s1,s2:26380/docs-cache/3",
            RedisTarget(
                "sentinel",
                "redis+sentinel://s1,s2:26380/docs-cache/3",
                False,
                (("s1", 26379), ("s2", 26380)),
                "docs-cache",
                3,
            ),
        ),
        (
            "rediss+sentinel://:secret@s1:26379/main",
            RedisTarget(
                "sentinel", "rediss+sentinel://:secret@s1:26379/main", True, (("s1", 26379),), "main", 0, None, "secret"
            ),
        ),
    ],
)
def test_the_forms(url: str, target: RedisTarget) -> None:
    assert parse_redis_url(url) == target


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:6379", "not a Redis URL"),
        ("http://127.0.0.1:6379", "unknown scheme 'http'"),
        ("redis+replica://a:1", "unknown scheme 'redis+replica'"),
        ("redis+cluster://a:1/2", "only database 0"),
        ("redis+sentinel://a:1", "service name"),
        ("redis+sentinel://a:1/svc/x", "database 'x' is not a number"),
        ("redis+cluster://:7000", "has no host"),
    ],
)
def test_errors_name_the_url(url: str, message: str) -> None:
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url(url)
    assert url in str(caught.value) and message in str(caught.value)


def test_shown_without_the_password() -> None:
    assert "secret" not in parse_redis_url("redis+sentinel://u:secret@s1:26379/main").describe()
    assert "secret" not in parse_redis_url("rediss://u:secret@cache:6380/0").describe()


def test_an_error_never_shows_the_password() -> None:
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url("redis+sentinel://u:hunter2@s1:26379")
    assert "hunter2" not in str(caught.value) and "u:***@s1" in str(caught.value)
