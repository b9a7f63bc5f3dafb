"""revocation.py (pure): what a revocation covers (a subject's tokens issued until it, or one
token), the mount server's own table of them (the newest kept, forgotten at their end, saved as
JSON), the refusal's words and kind; tokens.py carrying `jti` and `iat` through verification;
the mount server's Revoke request on its socket."""

from __future__ import annotations

import time

import jwt
import pytest

from chromafs_fuse.errors import AccessDenied, kind_of
from chromafs_fuse.revocation import Revocation, Revocations, TokenRevoked, decode_value, encode_value, refusal
from chromafs_fuse.serving.protocol import MOUNT_SERVER_REQUESTS, BadRequest, Revoke, decode, encode
from chromafs_fuse.tokens import principal_from_token, verification_key

SECRET = b"a-secret-of-thirty-two-bytes-or-more"
AT = 1_800_000_000.0


def subject(name: str = "alice", at: float = AT, until: float = AT + 3600) -> Revocation:
    return Revocation("acme", "sub", name, at, until)


def test_a_subject_revocation_covers_its_tokens_issued_until_it() -> None:
    revocation = subject()
    assert revocation.covers("alice", None, AT - 100)
    assert revocation.covers("alice", None, AT)  # the same second: revoked
    assert revocation.covers("alice", "any-jti", None)  # no iat: counted as issued before
    assert not revocation.covers("alice", None, AT + 1)  # a token the provider issued afterwards
    assert not revocation.covers("bob", None, AT - 100)
    assert not revocation.covers(None, None, None)


def test_a_token_revocation_covers_that_token_only() -> None:
    revocation = Revocation("acme", "jti", "t-1", AT, AT + 60)
    assert revocation.covers("alice", "t-1", AT + 999)  # whenever issued
    assert not revocation.covers("alice", "t-2", AT - 1)
    assert not revocation.covers("alice", None, AT - 1)


@pytest.mark.parametrize(
    ("kind", "name", "at"), [("group", "x", AT), ("sub", "", AT), ("jti", "x", float("nan"))]
)  # fmt: skip
def test_a_revocation_names_a_subject_or_a_token(kind: str, name: str, at: float) -> None:
    with pytest.raises(ValueError):
        Revocation("acme", kind, name, at, AT + 1)


def test_the_servers_table_finds_by_site_and_forgets_at_the_end() -> None:
    table = Revocations([subject(until=AT + 10), Revocation("acme", "jti", "t-9", AT, AT + 100)])
    assert table.find("acme", "alice", None, AT - 1, now=AT + 5) == subject(until=AT + 10)
    assert table.find("other-site", "alice", None, AT - 1, now=AT + 5) is None
    assert table.find("acme", "alice", None, AT - 1, now=AT + 10) is None  # ended
    assert table.find("acme", "carol", "t-9", AT + 50, now=AT + 20) is not None
    assert table.prune(AT + 10) and len(table) == 1 and not table.prune(AT + 10)


def test_a_later_revocation_of_a_subject_revokes_more_and_lasts_the_longer() -> None:
    table = Revocations([subject(at=AT, until=AT + 1000)])
    table.add(subject(at=AT + 50, until=AT + 100))
    assert table.find("acme", "alice", None, AT + 40, now=AT + 500) is not None  # issued before the second
    assert table.find("acme", "alice", None, AT + 60, now=AT + 500) is None
    assert Revocations.from_json(table.to_json()).to_json() == table.to_json()
    with pytest.raises(ValueError):
        Revocations.from_json({"not": "a list"})


def test_a_redis_value_reads_back_and_a_foreign_one_is_none() -> None:
    revocation = subject()
    assert decode_value("acme", "sub", "alice", encode_value(revocation), AT + 3600) == revocation
    assert decode_value("acme", "sub", "alice", None, AT) is None
    assert decode_value("acme", "sub", "alice", b"garbage", AT) is None


def test_a_revoked_reader_is_told_so_and_refused_as_a_token_that_cannot_be_used() -> None:
    error = refusal(subject())
    assert isinstance(error, TokenRevoked) and isinstance(error, AccessDenied)
    assert kind_of(error) == "denied"  # chromafs-csi: UNAUTHENTICATED
    assert error.message.startswith("this token was revoked (subject 'alice', at 2027-01-15T08:00:00Z)")
    assert "token id 't-1'" in refusal(Revocation("acme", "jti", "t-1", AT, AT + 1)).message


def test_verification_carries_the_token_id_and_when_it_was_issued() -> None:
    now = int(time.time())
    claims = {"sub": "alice", "site": "acme", "exp": now + 60, "iat": now - 5, "jti": "t-1"}
    principal = principal_from_token(jwt.encode(claims, SECRET, "HS256"), verification_key(SECRET, None), "acme")
    assert (principal.subject, principal.token_id, principal.issued_at) == ("alice", "t-1", float(now - 5))
    bare = {"sub": "alice", "site": "acme", "exp": now + 60}
    principal = principal_from_token(jwt.encode(bare, SECRET, "HS256"), verification_key(SECRET, None), "acme")
    assert (principal.token_id, principal.issued_at) == (None, None)


def test_the_revoke_request_travels_on_the_mount_servers_socket() -> None:
    request = Revoke("acme", "sub", "alice", 86400.0)
    assert decode(encode(request), MOUNT_SERVER_REQUESTS) == request
    with pytest.raises(BadRequest):
        decode(b'{"op": "revoke", "site": "acme", "kind": "sub", "name": "alice"}', MOUNT_SERVER_REQUESTS)
