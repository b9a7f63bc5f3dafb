"""pod_readers.py: the operator's mapping of service accounts to readers, read one way only, and
a pod's verified service-account token turned into the reader of a site (or refused)."""

from __future__ import annotations

import json

import pytest

from chromafs_fuse.access import Principal
from chromafs_fuse.pod_readers import (
    TOKENS_ATTRIBUTE,
    MappingError,
    NotMapped,
    PodTokenError,
    parse_map,
    pod_reader,
    pod_token,
)

pytestmark = pytest.mark.unit

MAPPING = """
readers:
  - serviceAccount: agents/doc-agent
    site: acme
    groups: [billing]
  - serviceAccount: agents/*
    site: acme
  - serviceAccount: agents/doc-agent
    site: globex
    groups: [admin, eng]
"""


def claims(namespace: str = "agents", name: str = "doc-agent", **more: object) -> dict[str, object]:
    return {
        "sub": f"system:serviceaccount:{namespace}:{name}",
        "exp": 2_000_000_000,
        "iat": 1_999_999_000,
        "jti": "j-1",
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": "u"}},
        **more,
    }


def test_an_account_gets_its_own_entry_then_its_namespaces_then_nothing() -> None:
    readers = parse_map(MAPPING, "readers.yaml")
    assert len(readers) == 3
    own = pod_reader(claims(), "acme", readers, "agents")
    assert own == Principal.of(["billing"], "system:serviceaccount:agents:doc-agent", 2e9, "j-1", 1_999_999_000.0)
    assert pod_reader(claims(), "globex", readers, None).groups == {"admin", "eng"}
    other = pod_reader(claims(name="indexer"), "acme", readers, "agents")  # agents/*: no group
    assert (other.authenticated, other.groups, other.subject) == (
        True,
        frozenset(),
        "system:serviceaccount:agents:indexer",
    )
    with pytest.raises(NotMapped, match=r"agents/indexer is no reader of site 'globex'.*agents/\*"):
        pod_reader(claims(name="indexer"), "globex", readers, None)
    with pytest.raises(NotMapped, match="default/doc-agent"):
        pod_reader(claims(namespace="default"), "acme", readers, None)


@pytest.mark.parametrize(
    ("token_claims", "pod_namespace", "says"),
    [
        ({"sub": "alice"}, None, "not a service account's"),
        ({"sub": "system:serviceaccount:agents"}, None, "not a service account's"),
        (
            {"kubernetes.io": {"namespace": "kube-system", "serviceaccount": {"name": "doc-agent"}}},
            None,
            "another service account",
        ),
        ({"kubernetes.io": "agents"}, None, "another service account"),
        ({}, "other", "of namespace 'agents', the pod of 'other'"),
    ],
)
def test_a_token_that_is_no_service_accounts_or_not_the_pods_is_refused(
    token_claims: dict[str, object], pod_namespace: str | None, says: str
) -> None:
    with pytest.raises(PodTokenError, match=says):
        pod_reader({**claims(), **token_claims}, "acme", parse_map(MAPPING, "m"), pod_namespace)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("readers: [", "is not YAML"),
        ("- serviceAccount: a/b", "one key, `readers`"),
        ("readers: []\nextra: 1", "one key, `readers`"),
        ("readers:\n  - serviceAccount: agents\n    site: acme", "entry 1: serviceAccount is <namespace>/<name>"),
        ("readers:\n  - serviceAccount: Agents/x\n    site: acme", "not a Kubernetes namespace/name"),
        ("readers:\n  - serviceAccount: a/b\n    site: ''", "site is the name of a docs site"),
        ("readers:\n  - serviceAccount: a/b\n    site: acme\n    groups: admin", "groups is a list"),
        ("readers:\n  - serviceAccount: a/b\n    site: acme\n    group: [admin]", "unknown keys group"),
        (
            "readers:\n  - {serviceAccount: a/*, site: acme}\n  - {serviceAccount: a/*, site: acme}",
            "entry 2 maps a/\\* on site 'acme' again",
        ),
    ],
)
def test_a_mapping_that_could_be_read_two_ways_is_not_read(text: str, says: str) -> None:
    with pytest.raises(MappingError, match=says):
        parse_map(text, "readers.yaml")


def test_an_empty_mapping_maps_nobody() -> None:
    assert len(parse_map("", "m")) == 0 and len(parse_map("readers: []", "m")) == 0


def test_kubelets_tokens_are_read_for_chromafss_audience_only() -> None:
    handed = {
        TOKENS_ATTRIBUTE: json.dumps({"chromafs": {"token": "a.b.c", "expirationTimestamp": "2026-01-01T00:00:00Z"}})
    }
    assert pod_token(handed, "chromafs") == "a.b.c"
    assert pod_token({}, "chromafs") is None  # no tokenRequests: the CSIDriver asks for none
    with pytest.raises(
        PodTokenError, match="no service-account token for the audience 'chromafs' \\(audiences: 'vault'\\)"
    ):
        pod_token({TOKENS_ATTRIBUTE: json.dumps({"vault": {"token": "x"}})}, "chromafs")
    with pytest.raises(PodTokenError, match="not JSON"):
        pod_token({TOKENS_ATTRIBUTE: "{"}, "chromafs")
