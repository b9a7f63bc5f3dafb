#!/usr/bin/env python3
"""Write the two Docker secrets docker/compose.yaml needs, for a demo: an HS256 shared
secret (docker/secrets/jwt_secret) and one user's session token signed with it
(docker/secrets/token.jwt).

    python3 docker/make_demo_secrets.py                      # groups: billing
    python3 docker/make_demo_secrets.py --groups admin       # sees internal/ and admin/ too
    python3 docker/make_demo_secrets.py --groups ""          # an authenticated user in no group

Standard library only, so it runs on any host with Python 3. A real platform gets the
token from its identity provider for each agent session, and the verification key (a
shared secret, or better a public key) from its own configuration; see docs/CONTAINERS.md.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

SECRETS = Path(__file__).resolve().parent / "secrets"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def hs256_jwt(claims: dict[str, object], key: bytes) -> str:
    header = {"alg": "HS256", "typ": "JWT"}
    signing_input = ".".join(
        b64url(json.dumps(part, separators=(",", ":")).encode("utf-8")) for part in (header, claims)
    )
    signature = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (root in the container)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default=os.environ.get("CHROMAFS_SITE", "acme"), help="the token's site claim")
    parser.add_argument("--sub", default="demo-user", help="the token's subject")
    parser.add_argument("--groups", default="billing", help="comma-separated groups (empty: none)")
    parser.add_argument("--hours", type=float, default=24.0, help="lifetime of the token")
    parser.add_argument("--out", type=Path, default=SECRETS, help="folder to write into")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    secret_path = args.out / "jwt_secret"
    if not secret_path.exists():  # keep an existing secret: tokens made before stay valid
        write_private(secret_path, base64.b64encode(secrets.token_bytes(32)).decode("ascii") + "\n")
    key = secret_path.read_bytes().strip()  # chromafs strips the file the same way

    now = int(time.time())
    claims: dict[str, object] = {
        "sub": args.sub,
        "site": args.site,
        "groups": [g.strip() for g in args.groups.split(",") if g.strip()],
        "iat": now,
        "exp": now + int(args.hours * 3600),
    }
    write_private(args.out / "token.jwt", hs256_jwt(claims, key) + "\n")
    print(f"wrote {secret_path} and {args.out / 'token.jwt'} ({json.dumps(claims)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
