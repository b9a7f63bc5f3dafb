"""Identity from an identity provider: tokens verified with the keys it publishes as a JWKS
(--jwks-url), their issuer and audience checked (--jwt-issuer, --jwt-audience), its key rotations
followed by a running mount server. The provider is a stand-in on 127.0.0.1 (infra's
IdentityProvider: RS256 keys made here, each with its `kid`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chromafs_fuse.backends.jwks import RemoteKeys
from chromafs_fuse.tokens import KeysUnavailable, TokenError, principal_from_token
from infra import SAMPLE_SITE, Backend, IdentityProvider, MountServer, free_port, is_mounted, try_mount, wait_until


@pytest.fixture
def provider() -> Iterator[IdentityProvider]:
    with IdentityProvider() as idp:
        yield idp


# -- the key set, as a verifying process keeps it ----------------------------------------------


def test_keys_are_cached_and_an_unknown_kid_fetches_at_most_once_per_cooldown(provider: IdentityProvider) -> None:
    provider.add_key("k1")
    keys = RemoteKeys(provider.url, cooldown_s=60.0, refresh_s=300.0, timeout_s=5.0)
    for _ in range(5):
        assert principal_from_token(provider.token("k1"), keys, "acme").subject == "tester"
    assert provider.fetches == 1  # cached
    forger = provider.add_key("forged")
    provider.withdraw("forged")
    for _ in range(50):  # a flood of tokens naming keys the provider never published
        with pytest.raises(TokenError, match=r"signing key \(kid 'made-up'\) is not in the JWKS at http://127"):
            principal_from_token(provider.token("made-up", forger), keys, "acme")
    assert provider.fetches == 1  # within the cooldown of the last fetch: none


def test_a_rotation_is_followed_at_once_after_the_cooldown_and_on_schedule(provider: IdentityProvider) -> None:
    provider.add_key("k1")
    keys = RemoteKeys(provider.url, cooldown_s=0.0, refresh_s=1.0, timeout_s=5.0)
    assert principal_from_token(provider.token("k1"), keys, "acme").subject == "tester"
    old = provider.withdraw("k1")
    provider.add_key("k2")
    # a token of the new key: the set is fetched again at once (no cooldown here)
    assert principal_from_token(provider.token("k2"), keys, "acme").subject == "tester"
    assert provider.fetches == 2
    with pytest.raises(TokenError, match="kid 'k1'"):  # withdrawn: refused
        principal_from_token(provider.token("k1", old), keys, "acme")
    # on schedule: after --jwks-refresh the set is fetched again even for a known kid
    fetched = provider.fetches
    wait_until(
        lambda: principal_from_token(provider.token("k2"), keys, "acme") and provider.fetches > fetched,
        10.0,
        "the JWKS fetched again after its refresh interval",
    )


def test_a_provider_that_cannot_be_reached_refuses_tokens_naming_its_url(provider: IdentityProvider) -> None:
    provider.add_key("k1")
    token = provider.token("k1")
    provider.status = 503
    keys = RemoteKeys(provider.url, cooldown_s=0.0, refresh_s=300.0, timeout_s=5.0)
    with pytest.raises(KeysUnavailable) as refused:
        principal_from_token(token, keys, "acme")
    assert str(refused.value) == f"cannot fetch the JWKS at {provider.url}: HTTP 503 Service Unavailable"
    nobody = f"http://127.0.0.1:{free_port()}/jwks"
    with pytest.raises(KeysUnavailable) as refused:
        principal_from_token(token, RemoteKeys(nobody, 0.0, 300.0, 5.0), "acme")
    assert str(refused.value) == f"cannot fetch the JWKS at {nobody}: Connection refused"


# -- through chromafs-mountd, as a deployment runs it --------------------------------------------


def test_sessions_of_the_mount_server_verify_with_the_providers_keys_and_follow_its_rotation(
    provider: IdentityProvider,
    start_mount_server: Callable[..., MountServer],
    sample_backend: Callable[..., Backend],
    tmp_path: Path,
) -> None:
    server = start_mount_server()
    provider.add_key("k1")
    identity = ["--jwks-url", provider.url, "--jwt-issuer", provider.ISSUER, "--jwt-audience", provider.AUDIENCE]
    identity += ["--jwks-cooldown", "0"]
    counter = iter(range(100))

    def session(token: str) -> tuple[Path, str]:
        """A session for `token` through the server: (its mountpoint, chromafs-mount's stderr)."""
        mountpoint = tmp_path / f"s{next(counter)}"
        mountpoint.mkdir()
        token_file = tmp_path / f"{mountpoint.name}.jwt"
        token_file.write_text(token)
        args = [*sample_backend().args, "--mountd", str(server.socket), "--token-file", str(token_file), *identity]
        done = try_mount(mountpoint, *args)
        assert (done.returncode == 0) == is_mounted(mountpoint), done.stderr
        return mountpoint, done.stderr.strip()

    billing = SAMPLE_SITE / "api-reference" / "payments.mdx"  # the billing group's page
    opened, _ = session(provider.token("k1", groups=["billing"]))
    assert (opened / "api-reference" / "payments.mdx").read_bytes() == billing.read_bytes()

    other_issuer, said = session(provider.token("k1", iss="https://evil.test"))
    assert not is_mounted(other_issuer)
    assert said == (
        "chromafs-mount: token's 'iss' claim is 'https://evil.test', not the issuer --jwt-issuer expects, "
        "'https://idp.test'"
    )
    other_audience, said = session(provider.token("k1", aud="another-service"))
    assert not is_mounted(other_audience)
    assert said == (
        "chromafs-mount: token's 'aud' claim is 'another-service', without the audience --jwt-audience "
        "expects, 'chromafs'"
    )

    # the provider rotates: a new key published, the old one withdrawn; the same server follows
    old = provider.withdraw("k1")
    provider.add_key("k2")
    rotated, said = session(provider.token("k2", groups=["billing"]))
    assert is_mounted(rotated), said
    assert (rotated / "api-reference" / "payments.mdx").read_bytes() == billing.read_bytes()
    withdrawn, said = session(provider.token("k1", old, groups=["billing"]))
    assert not is_mounted(withdrawn)
    assert said == f"chromafs-mount: token's signing key (kid 'k1') is not in the JWKS at {provider.url}"
    assert (opened / "quickstart.mdx").read_bytes()  # a session opened before the rotation reads on

    # the provider down: refused (fail closed), one line naming the URL
    provider.status = 500
    down, said = session(provider.token("k3", old))  # a kid not in the cached set: the provider is asked
    assert not is_mounted(down)
    assert said == f"chromafs-mount: cannot fetch the JWKS at {provider.url}: HTTP 500 Internal Server Error"


def test_a_mount_of_its_own_verifies_with_a_jwks_file_named_relative_to_the_caller(
    provider: IdentityProvider, sample_backend: Callable[..., Backend], tmp_path: Path, mnt: Path
) -> None:
    import json
    import os

    provider.add_key("k1")
    (tmp_path / "jwks.json").write_text(json.dumps(provider.document()))
    (tmp_path / "token.jwt").write_text(provider.token("k1", groups=["billing"]))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        done = try_mount(
            mnt, *sample_backend().args, "--no-mountd", "--token-file", "token.jwt", "--jwks-url", "jwks.json"
        )
    finally:
        os.chdir(cwd)
    try:
        assert done.returncode == 0, done.stderr
        page = SAMPLE_SITE / "api-reference" / "payments.mdx"
        assert (mnt / "api-reference" / "payments.mdx").read_bytes() == page.read_bytes()
    finally:
        from infra import unmount

        unmount(mnt)
