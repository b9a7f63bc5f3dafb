"""Revoked tokens (`chromafs revoke`): what a revocation names, and which readers it ends (pure).

A revocation names a site and either a subject (`sub`) or one token (`jti`). A subject's
revocation covers the tokens of that subject issued at or before it (`iat`; a token without
`iat` counts as issued before): the tokens that exist when it is made, not those the identity
provider issues afterwards (a user moved to other groups gets a new token and reads on with it).
A token's revocation covers that token. A revocation lasts `--for` seconds, which must reach past
the `exp` of the tokens it revokes (the default, DEFAULT_FOR_S, covers any token a provider
issues for a day or less).

It is kept where every host of the site sees it: under the site's Redis prefix
(backends/redis_revocations.py), or, without Redis, in the host's mount server (`Revocations`,
saved in its class root). A reader it covers is refused a new session, and a session it covers
ends as at its token's expiry.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from chromafs_fuse.tokens import TokenError

DEFAULT_FOR_S = 24 * 3600
KINDS = ("sub", "jti")  # what a revocation names: a subject, or one token


class TokenRevoked(TokenError):
    """The token was revoked (`chromafs revoke`): refused like a token that cannot be used."""


@dataclass(frozen=True)
class Revocation:
    site: str
    kind: str  # "sub" or "jti"
    name: str  # the subject, or the token's id
    at: float  # when it was made (seconds since the epoch)
    until: float  # when it is forgotten

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a revocation names a subject or a token id, not {self.kind!r}")
        if not self.name:
            raise ValueError("a revocation names a subject or a token id: empty")
        if not (math.isfinite(self.at) and math.isfinite(self.until)):
            raise ValueError("a revocation's times must be finite")

    def covers(self, subject: str | None, token_id: str | None, issued_at: float | None) -> bool:
        """Whether a token of `subject`, with id `token_id`, issued at `issued_at`, is revoked."""
        if self.kind == "jti":
            return token_id is not None and token_id == self.name
        return subject is not None and subject == self.name and (issued_at is None or issued_at <= self.at)

    def describe(self) -> str:
        return f"subject '{self.name}'" if self.kind == "sub" else f"token id '{self.name}'"


def refusal(revocation: Revocation) -> TokenRevoked:
    """What a reader whose token `revocation` covers is told."""
    more = " (one issued after the revocation)" if revocation.kind == "sub" else ""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(revocation.at))
    return TokenRevoked(f"this token was revoked ({revocation.describe()}, at {at}): ask for a new token{more}")


def covering(
    revocations: Iterable[Revocation | None], subject: str | None, token_id: str | None, issued_at: float | None
) -> Revocation | None:
    """The first of `revocations` that covers the token, or None."""
    for revocation in revocations:
        if revocation is not None and revocation.covers(subject, token_id, issued_at):
            return revocation
    return None


def names_of(subject: str | None, token_id: str | None) -> list[tuple[str, str]]:
    """The (kind, name) pairs under which a token's revocations are kept."""
    return [(kind, name) for kind, name in (("sub", subject), ("jti", token_id)) if name]


class Revocations:
    """The revocations a mount server keeps itself (no Redis), by (site, kind, name); the newest of
    each is kept, and each is forgotten at its `until`. Saved as JSON (`to_json`)."""

    def __init__(self, revocations: Iterable[Revocation] = ()) -> None:
        self._by_name: dict[tuple[str, str, str], Revocation] = {}
        for revocation in revocations:
            self.add(revocation)

    def add(self, revocation: Revocation) -> None:
        key = (revocation.site, revocation.kind, revocation.name)
        old = self._by_name.get(key)
        # a later revocation revokes more (a subject's: the tokens issued until then); both last
        # as long as the longer of the two asks
        until = max(revocation.until, old.until) if old else revocation.until
        at = max(revocation.at, old.at) if old else revocation.at
        self._by_name[key] = Revocation(revocation.site, revocation.kind, revocation.name, at, until)

    def prune(self, now: float) -> bool:
        """Forget the revocations that ended; whether any did."""
        ended = [key for key, r in self._by_name.items() if r.until <= now]
        for key in ended:
            del self._by_name[key]
        return bool(ended)

    def find(
        self, site: str, subject: str | None, token_id: str | None, issued_at: float | None, now: float
    ) -> Revocation | None:
        """The revocation that covers this token of `site` now, or None."""
        kept = (self._by_name.get((site, kind, name)) for kind, name in names_of(subject, token_id))
        return covering((r for r in kept if r is not None and r.until > now), subject, token_id, issued_at)

    def __len__(self) -> int:
        return len(self._by_name)

    def to_json(self) -> list[dict[str, object]]:
        return [asdict(r) for r in self._by_name.values()]

    @classmethod
    def from_json(cls, data: object) -> Revocations:
        if not isinstance(data, list):
            raise ValueError("not a list of revocations")
        return cls(Revocation(**item) for item in data)


def encode_value(revocation: Revocation) -> bytes:
    """A revocation as its Redis value (the key names its site, kind and name; its TTL its end)."""
    return json.dumps({"at": revocation.at}).encode()


def decode_value(site: str, kind: str, name: str, value: bytes | None, until: float) -> Revocation | None:
    """A Redis value back as a revocation (None: none, or a value this version cannot read)."""
    if value is None:
        return None
    try:
        at = float(json.loads(value)["at"])
        return Revocation(site, kind, name, at, until)
    except (ValueError, TypeError, KeyError):
        return None
