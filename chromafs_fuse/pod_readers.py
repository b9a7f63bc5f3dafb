"""Pods that sign in as themselves (chromafs-csi --sa-*): a pod's service-account token, as kubelet
hands it to a CSI driver that asks for one (`CSIDriver.spec.tokenRequests`), turned into a reader
with the operator's mapping from service accounts to readers (a ConfigMap). Pure: the mapping's
text and the token's verified claims are given.

The mapping, YAML:

    readers:
      - serviceAccount: agents/doc-agent   # <namespace>/<name>
        site: acme
        groups: [billing]
      - serviceAccount: docs/*             # every service account of the namespace `docs`
        site: acme                         # groups: none (an authenticated reader of no group)

A service account's entry for a site is its own (`ns/name`) if there is one, else its namespace's
(`ns/*`); with neither it is no reader of that site. Two entries for the same account (or the same
namespace's `*`) and site are refused, as is any key the format does not name: a mapping that
could be read two ways is not read at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import AccessDenied, UsageError

TOKENS_ATTRIBUTE = "csi.storage.k8s.io/serviceAccount.tokens"  # kubelet's, with tokenRequests
POD_NAMESPACE_ATTRIBUTE = "csi.storage.k8s.io/pod.namespace"  # kubelet's, with podInfoOnMount
SUBJECT_PREFIX = "system:serviceaccount:"
ANY = "*"
# a Kubernetes namespace or service account name: a DNS label (namespaces), a DNS subdomain (accounts)
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
ENTRY_KEYS = frozenset({"serviceAccount", "site", "groups"})


class MappingError(UsageError):
    """The mapping cannot be read; the message names the entry and what is wrong with it."""


class PodTokenError(AccessDenied):
    """The pod's token cannot be used: missing, not for this audience, not a service account's."""


class NotMapped(AccessDenied):
    """A valid service-account token whose account the mapping gives no reader of the site: its
    holder is known, but not allowed here."""


@dataclass(frozen=True)
class ReaderEntry:
    namespace: str
    name: str  # ANY: every service account of the namespace
    site: str
    groups: frozenset[str]


@dataclass(frozen=True)
class ReaderMap:
    entries: Mapping[tuple[str, str, str], ReaderEntry]  # by (namespace, name, site)

    def reader(self, namespace: str, name: str, site: str) -> ReaderEntry | None:
        """The account's own entry for `site`, else its namespace's, else None."""
        return self.entries.get((namespace, name, site)) or self.entries.get((namespace, ANY, site))

    def __len__(self) -> int:
        return len(self.entries)


def parse_map(text: str, where: str) -> ReaderMap:
    """The mapping in `text` (YAML, from `where`: a file's path, for the messages); MappingError."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise MappingError(f"{where} is not YAML{at}") from None
    if document is None:
        document = {"readers": []}
    if not isinstance(document, dict) or set(document) != {"readers"} or not isinstance(document["readers"], list):
        raise MappingError(f"{where}: the mapping is one key, `readers`, a list of entries")
    entries: dict[tuple[str, str, str], ReaderEntry] = {}
    for index, item in enumerate(document["readers"], 1):
        entry = _entry(item, f"{where}: entry {index}")
        key = (entry.namespace, entry.name, entry.site)
        if key in entries:
            raise MappingError(
                f"{where}: entry {index} maps {entry.namespace}/{entry.name} on site '{entry.site}' again: "
                "keep one entry per service account and site"
            )
        entries[key] = entry
    return ReaderMap(entries)


def _entry(item: object, where: str) -> ReaderEntry:
    if not isinstance(item, dict):
        raise MappingError(f"{where} is not a mapping of serviceAccount, site and groups")
    unknown = sorted(str(k) for k in set(item) - ENTRY_KEYS)
    if unknown:
        raise MappingError(f"{where} has unknown keys {', '.join(unknown)} (it takes serviceAccount, site, groups)")
    account, site, groups = item.get("serviceAccount"), item.get("site"), item.get("groups", [])
    if not isinstance(account, str) or account.count("/") != 1:
        raise MappingError(f"{where}: serviceAccount is <namespace>/<name> or <namespace>/*, not {account!r}")
    namespace, name = account.split("/")
    if not NAME.fullmatch(namespace) or not (name == ANY or NAME.fullmatch(name)):
        raise MappingError(f"{where}: serviceAccount {account!r} is not a Kubernetes namespace/name")
    if not isinstance(site, str) or not site:
        raise MappingError(f"{where}: site is the name of a docs site, not {site!r}")
    if groups is None:
        groups = []
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise MappingError(f"{where}: groups is a list of group names")
    return ReaderEntry(namespace, name, site, frozenset(groups))


def pod_token(attributes: Mapping[str, str], audience: str) -> str | None:
    """The token kubelet handed over for `audience` in a NodePublishVolume's volume_context; None
    when it handed none at all (the CSIDriver asks for no token); PodTokenError when it handed some
    but none for this audience."""
    raw = attributes.get(TOKENS_ATTRIBUTE)
    if raw is None:
        return None
    try:
        tokens = json.loads(raw)
    except ValueError:
        raise PodTokenError(f"{TOKENS_ATTRIBUTE} is not JSON") from None
    if not isinstance(tokens, dict):
        raise PodTokenError(f"{TOKENS_ATTRIBUTE} is not a JSON object")
    found = tokens.get(audience)
    token = found.get("token") if isinstance(found, dict) else None
    if not isinstance(token, str) or not token:
        given = ", ".join(sorted(repr(str(a)) for a in tokens)[:8]) or "none"
        raise PodTokenError(
            f"kubelet handed over no service-account token for the audience '{audience}' (audiences: {given}): "
            f"the CSIDriver's tokenRequests must ask for audience '{audience}'"
        )
    return token


def service_account(claims: Mapping[str, object]) -> tuple[str, str]:
    """The (namespace, name) a verified service-account token is for: its `sub`, which its
    `kubernetes.io` claim, when there, must agree with."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject.startswith(SUBJECT_PREFIX):
        raise PodTokenError("the token is not a service account's: its 'sub' is not system:serviceaccount:<ns>:<name>")
    namespace, _, name = subject.removeprefix(SUBJECT_PREFIX).partition(":")
    if not NAME.fullmatch(namespace) or not NAME.fullmatch(name):
        raise PodTokenError("the token is not a service account's: its 'sub' is not system:serviceaccount:<ns>:<name>")
    kubernetes = claims.get("kubernetes.io")
    if kubernetes is not None:
        said = None
        if isinstance(kubernetes, dict) and isinstance(kubernetes.get("serviceaccount"), dict):
            said = (kubernetes.get("namespace"), kubernetes["serviceaccount"].get("name"))
        if said != (namespace, name):
            raise PodTokenError("the token's 'kubernetes.io' claim names another service account than its 'sub'")
    return namespace, name


def pod_reader(claims: Mapping[str, object], site: str, readers: ReaderMap, pod_namespace: str | None) -> Principal:
    """The reader of `site` a pod's verified token maps to; PodTokenError for a token that is no
    service account's (or of another namespace than the pod's), NotMapped for an account the
    mapping gives no reader of `site`."""
    namespace, name = service_account(claims)
    if pod_namespace is not None and pod_namespace != namespace:
        raise PodTokenError(f"the token is of namespace '{namespace}', the pod of '{pod_namespace}'")
    entry = readers.reader(namespace, name, site)
    if entry is None:
        raise NotMapped(
            f"service account {namespace}/{name} is no reader of site '{site}': "
            f"the operator's mapping (chromafs-csi --sa-readers) has no entry for it or {namespace}/*"
        )
    expires_at = claims["exp"]
    assert isinstance(expires_at, (int, float))  # verified: a number
    token_id, issued_at = claims.get("jti"), claims.get("iat")
    return Principal.of(
        entry.groups,
        f"{SUBJECT_PREFIX}{namespace}:{name}",
        float(expires_at),
        token_id if isinstance(token_id, str) and token_id else None,
        float(issued_at) if isinstance(issued_at, (int, float)) and not isinstance(issued_at, bool) else None,
    )
