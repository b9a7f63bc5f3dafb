"""Pods that sign in as themselves (issue 48, item 3): chromafs-csi driven as kubelet drives it
with `tokenRequests` and `requiresRepublish` in the CSIDriver, over its real unix socket, against
a real chromafs-mountd, `chroma run` and redis-server, the cluster's service-account keys served by
an RS256 identity provider on 127.0.0.1. A pod's token is verified through that JWKS and mapped
to a reader by the operator's mapping; what the pod gets is checked as a user would: the exact
files and bytes of its reader, the gRPC code of each refusal with nothing mounted after it, a
session renewed by a republish that reads on past its first token's expiry, a shell inside
included, and the Secret-held token beside it."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_csi import channel, mounts_at, pod, publish_request, refused, unpublish

from chromafs_fuse.access import Principal
from chromafs_fuse.csi.mountd import open_session
from chromafs_fuse.errors import ChromafsError
from chromafs_fuse.serving.protocol import OpenPodSession, RenewSession, reader_fields
from chromafs_fuse.serving.status import session_status_path
from infra import (
    BIN,
    SAMPLE_SITE,
    ChromaServer,
    CsiPlugin,
    IdentityProvider,
    RedisServer,
    copy_subset,
    expected_visible,
    ingest,
    run,
    running_mount_server,
    tree_listing,
    wait_until,
)

SITE = "acme"
AUDIENCE = "chromafs.dev/docs"  # what the CSIDriver's tokenRequests asks for
MAPPING = f"""
readers:
  - serviceAccount: agents/doc-agent
    site: {SITE}
    groups: [billing]
  - serviceAccount: research/*
    site: {SITE}
"""


class Cluster:
    """The node (Chroma, Redis, the mount server, the plugin) and the cluster's token issuer."""

    def __init__(
        self,
        root: Path,
        chroma: ChromaServer,
        redis: RedisServer,
        idp: IdentityProvider,
        plugin: CsiPlugin,
        mountd: Any,
    ) -> None:
        self.root = root
        self.mountd = mountd
        self.chroma = chroma
        self.redis = redis
        self.idp = idp
        self.plugin = plugin
        self.count = 0

    def token(self, namespace: str = "agents", name: str = "doc-agent", **claims: object) -> str:
        """A projected service-account token as the API server signs it for a pod."""
        now = int(time.time())
        payload: dict[str, object] = {
            "sub": f"system:serviceaccount:{namespace}:{name}",
            "aud": [AUDIENCE],
            "iat": now,
            "nbf": now,
            "jti": f"jti-{now}-{self.count}",
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": "0c5d1f7e"},
                "pod": {"name": "agent", "uid": "8a2b"},
            },
            "site": None,
            **claims,
        }
        return self.idp.token("k1", **payload)

    def attributes(self, token: str | None, namespace: str = "agents", audience: str = AUDIENCE, **more: str) -> dict:
        """volume_context as kubelet sends it: the volume's attributes, the pod's info
        (podInfoOnMount) and its token for each audience of tokenRequests."""
        pod = {
            "csi.storage.k8s.io/pod.name": "agent",
            "csi.storage.k8s.io/pod.namespace": namespace,
            "csi.storage.k8s.io/serviceAccount.name": "doc-agent",
            "csi.storage.k8s.io/ephemeral": "true",
        }
        if token is not None:
            handed = {audience: {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
            pod["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(handed)
        return {"site": SITE, "chroma-url": self.chroma.url, "redis-url": self.redis.url, **pod, **more}

    def target(self) -> Path:
        self.count += 1
        parent = self.root / "pods" / f"uid-{self.count}" / "volumes" / "kubernetes.io~csi" / "docs"
        parent.mkdir(parents=True)
        return parent / "mount"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, secret_file: Path) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("csi-pods")
    for folder in ("mountd", "pods"):
        (root / folder).mkdir()
    mapping = root / "readers.yaml"
    mapping.write_text(MAPPING)
    with contextlib.ExitStack() as parts:
        chroma = parts.enter_context(ChromaServer(root / "chroma-data"))
        redis = parts.enter_context(RedisServer(root / "redis"))
        ingest(SAMPLE_SITE, "--site", SITE, "--chroma-url", chroma.url, "--quiet")
        idp = parts.enter_context(IdentityProvider())
        idp.add_key("k1")
        mountd = parts.enter_context(running_mount_server(root / "mountd", root / "pods"))
        flags = [
            *("--jwt-secret-file", str(secret_file)),  # the Secret-held token stays an option
            *("--sa-jwks-url", idp.url, "--sa-issuer", idp.ISSUER, "--sa-audience", AUDIENCE),
            *("--sa-readers", str(mapping), "--jwks-cooldown", "0"),
        ]
        plugin = parts.enter_context(CsiPlugin(root / "plugin", mountd.socket, *flags))
        yield Cluster(root, chroma, redis, idp, plugin, mountd)


def status_of(target: Path) -> dict[str, Any]:
    path = session_status_path(str(target))
    assert path
    return json.loads(Path(path).read_text())


def reads_exactly(target: Path, groups: set[str] | None, scratch: Path) -> None:
    visible = expected_visible(SAMPLE_SITE, "public", groups)
    assert {p for p in tree_listing(target) if (target / p).is_file()} == visible
    diff = run(["diff", "-r", str(copy_subset(SAMPLE_SITE, visible, scratch)), str(target)])
    assert diff.returncode == 0, diff.stdout + diff.stderr


@pytest.mark.parametrize(
    ("namespace", "name", "groups"),
    [("agents", "doc-agent", {"billing"}), ("research", "indexer", set())],
    ids=["own-entry", "namespace-wildcard"],
)
def test_a_pod_reads_exactly_what_its_service_account_maps_to(
    cluster: Cluster, tmp_path: Path, namespace: str, name: str, groups: set[str]
) -> None:
    target = cluster.target()
    attributes = cluster.attributes(cluster.token(namespace, name), namespace)
    with channel(cluster.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(target, attributes), timeout=60)
        try:
            assert mounts_at(target) == 1
            reads_exactly(target, groups, tmp_path / "expected")
            assert not (target / "internal" / "runbooks" / "incident-response.md").exists()  # admin's
            groups_text = ",".join(sorted(groups)) or "-"
            assert status_of(target)["reader"] == f"user=system:serviceaccount:{namespace}:{name} groups={groups_text}"
        finally:
            unpublish(node, target)
    assert mounts_at(target) == 0 and not target.exists()


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("another-audience", grpc.StatusCode.UNAUTHENTICATED, "without the audience --sa-audience expects"),
        ("no-token-for-the-audience", grpc.StatusCode.UNAUTHENTICATED, "no service-account token for the audience"),
        ("another-issuer", grpc.StatusCode.UNAUTHENTICATED, "not the issuer --sa-issuer expects"),
        ("expired", grpc.StatusCode.UNAUTHENTICATED, "expired"),
        ("unknown-key", grpc.StatusCode.UNAUTHENTICATED, "signature is invalid"),
        ("not-a-service-account", grpc.StatusCode.UNAUTHENTICATED, "not a service account's"),
        ("another-pods-namespace", grpc.StatusCode.UNAUTHENTICATED, "the pod of 'research'"),
        ("unmapped", grpc.StatusCode.PERMISSION_DENIED, "agents/intruder is no reader of site 'acme'"),
        ("isolated", grpc.StatusCode.INVALID_ARGUMENT, "drop `isolated`"),
    ],
)
def test_a_pod_token_that_cannot_be_used_is_refused_and_nothing_is_mounted(
    cluster: Cluster, case: str, code: grpc.StatusCode, words: str
) -> None:
    token, namespace, audience, more = cluster.token(), "agents", AUDIENCE, {}
    if case == "another-audience":  # handed over under chromafs's audience, but made for another
        token = cluster.token(aud=["vault"])
    elif case == "no-token-for-the-audience":  # the CSIDriver asks for another audience only
        audience = "vault"
    elif case == "another-issuer":
        token = cluster.token(iss="https://another-cluster.test")
    elif case == "expired":
        token = cluster.token(exp=int(time.time()) - 60, iat=int(time.time()) - 4000, nbf=int(time.time()) - 4000)
    elif case == "unknown-key":  # signed by a key the cluster never published, under its kid
        from cryptography.hazmat.primitives.asymmetric import rsa

        forged = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = cluster.idp.token("k1", forged, sub="system:serviceaccount:agents:doc-agent", aud=[AUDIENCE])
    elif case == "not-a-service-account":
        token = cluster.token(sub="alice", **{"kubernetes.io": None})
    elif case == "another-pods-namespace":
        namespace = "research"
    elif case == "unmapped":
        token = cluster.token(name="intruder")
    elif case == "isolated":
        more = {"isolated": "true"}
    target = cluster.target()
    with channel(cluster.plugin) as (_identity, node):
        request = publish_request(target, cluster.attributes(token, namespace, audience, **more))
        got, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
    assert (got, words in details) == (code, True), details
    assert "Traceback" not in details and "eyJ" not in details  # no token in the message
    assert mounts_at(target) == 0 and not target.exists()


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_a_republish_renews_the_session_past_its_first_tokens_expiry(cluster: Cluster, tmp_path: Path) -> None:
    """requiresRepublish: kubelet publishes the target again with a fresh token; the session then
    lasts until that token's expiry, the pod's mount untouched (a shell inside reads on past the
    first token's expiry); a republish with a token that cannot be used extends nothing."""
    first_exp = int(time.time()) + 15  # room for two publishes and a pod on a loaded machine
    target, lapsing = cluster.target(), cluster.target()
    with channel(cluster.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(target, cluster.attributes(cluster.token(exp=first_exp))), timeout=60)
        node.NodePublishVolume(publish_request(lapsing, cluster.attributes(cluster.token(exp=first_exp))), timeout=60)
        try:
            assert status_of(target)["expires_at"] == first_exp
            with pod(target, tmp_path / "pod") as shell:
                page = "api-reference/payments.mdx"
                assert shell(f"cat {page}") == (SAMPLE_SITE / page).read_text()
                fresh = cluster.token(exp=first_exp + 3600)
                node.NodePublishVolume(publish_request(target, cluster.attributes(fresh)), timeout=60)
                assert mounts_at(target) == 1 and status_of(target)["expires_at"] == first_exp + 3600
                # the other one: a republish with a token for another audience is refused, extends nothing
                wrong = publish_request(lapsing, cluster.attributes(cluster.token(exp=first_exp + 3600, aud=["x"])))
                code, _ = refused(lambda: node.NodePublishVolume(wrong, timeout=60))
                assert code == grpc.StatusCode.UNAUTHENTICATED and status_of(lapsing)["expires_at"] == first_exp
                wait_until(lambda: mounts_at(lapsing) == 0, 45, "the unrenewed session to end at its token's expiry")
                assert time.time() > first_exp
                assert mounts_at(target) == 1
                assert shell(f"cat {page}") == (SAMPLE_SITE / page).read_text()  # cwd inside: reads on
                assert "payments.mdx" in shell("ls api-reference") and "No such file" in shell("ls internal/runbooks")
                node.NodePublishVolume(publish_request(target, cluster.attributes(cluster.token(exp=first_exp + 60))),
                                       timeout=60)  # fmt: skip  # an older token: the expiry stays
                assert status_of(target)["expires_at"] == first_exp + 3600
        finally:
            unpublish(node, target)
            with contextlib.suppress(grpc.RpcError):
                unpublish(node, lapsing)
    assert mounts_at(target) == 0 and not target.exists()


def test_the_secret_held_token_stays_an_option_and_comes_first(
    cluster: Cluster, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """A volume with a token in its Secret is that token's reader (admin here), whatever service
    account the pod runs as (billing's); one without is its service account's."""
    target = cluster.target()
    request = publish_request(target, cluster.attributes(cluster.token()), make_token(["admin"]))
    with channel(cluster.plugin) as (_identity, node):
        node.NodePublishVolume(request, timeout=60)
        try:
            reads_exactly(target, {"admin"}, tmp_path / "expected")
            assert status_of(target)["reader"] == "user=tester groups=admin"
        finally:
            unpublish(node, target)
    assert mounts_at(target) == 0 and not target.exists()


def test_the_mapping_is_read_again_when_the_operator_changes_it(cluster: Cluster) -> None:
    """A ConfigMap update: an entry removed refuses the account's next publish; a mapping that
    could be read two ways refuses every pod (FAILED_PRECONDITION), never serving the old one."""
    mapping = cluster.root / "readers.yaml"
    with channel(cluster.plugin) as (_identity, node):
        try:
            mapping.write_text(MAPPING.replace("research/*", "research/indexer"))
            target = cluster.target()
            request = publish_request(target, cluster.attributes(cluster.token("research", "writer"), "research"))
            code, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
            assert (code, "research/writer is no reader" in details) == (grpc.StatusCode.PERMISSION_DENIED, True)
            mapping.write_text(MAPPING + MAPPING.split("readers:", 1)[1])  # every entry twice
            again = publish_request(target, cluster.attributes(cluster.token()))
            code, details = refused(lambda: node.NodePublishVolume(again, timeout=60))
            assert (code, "again: keep one entry" in details) == (grpc.StatusCode.FAILED_PRECONDITION, True)
            assert mounts_at(target) == 0 and not target.exists()
        finally:
            mapping.write_text(MAPPING)


@pytest.mark.expect_log(r"WARNING .*session on .* revoked")
def test_chromafs_revoke_ends_a_pods_session_by_its_service_account(cluster: Cluster) -> None:
    """`chromafs revoke --subject system:serviceaccount:<ns>:<name>`: the pod's session ends within
    a second or so, and a publish again with the token it held is refused."""
    target = cluster.target()
    token = cluster.token("research", "revoked-agent")
    request = publish_request(target, cluster.attributes(token, "research"))
    with channel(cluster.plugin) as (_identity, node):
        node.NodePublishVolume(request, timeout=60)
        try:
            assert (target / "index.mdx").read_bytes() == (SAMPLE_SITE / "index.mdx").read_bytes()
            subject = "system:serviceaccount:research:revoked-agent"
            revoke = [str(BIN / "chromafs"), "revoke", "--subject", subject, "--site", SITE]
            done = run([*revoke, "--redis-url", cluster.redis.url])
            assert done.returncode == 0, done.stderr
            wait_until(lambda: mounts_at(target) == 0, 5, "the revoked session's bind detached")
            code, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
            assert (code, "revoked" in details) == (grpc.StatusCode.UNAUTHENTICATED, True), details
            assert mounts_at(target) == 0
        finally:
            unpublish(node, target)
    assert not target.exists()


@pytest.mark.expect_log(r"WARNING .*renewal on .* refused: no live session")
def test_the_mount_server_takes_a_reader_only_with_a_future_expiry_and_renews_only_a_live_session(
    cluster: Cluster,
) -> None:
    """The mount server's side of OpenPodSession and RenewSession, asked on its socket as the
    plugin asks it: a reader whose token has expired is refused, and so is a renewal of a
    mountpoint that holds no session; nothing is mounted."""
    target = cluster.target()
    target.mkdir()
    options = {"--site": SITE, "--chroma-url": cluster.chroma.url, "-o": ["allow_other"]}
    late = reader_fields(Principal.of(["billing"], "system:serviceaccount:agents:doc-agent", time.time() - 5))
    with pytest.raises(ChromafsError) as expired:
        open_session(str(cluster.mountd.socket), OpenPodSession(str(target), options, late), 30)
    assert (expired.value.kind, "expired" in str(expired.value)) == ("denied", True)
    fresh = reader_fields(Principal.of(["billing"], "system:serviceaccount:agents:doc-agent", time.time() + 600))
    with pytest.raises(ChromafsError) as nothing:
        open_session(str(cluster.mountd.socket), RenewSession(str(target), options, fresh), 30)
    assert "no live session" in str(nothing.value)
    assert mounts_at(target) == 0
    target.rmdir()


def test_no_leftover_sessions(cluster: Cluster) -> None:
    prefix = str((cluster.root / "pods").resolve()) + "/"
    with open("/proc/self/mountinfo") as table:
        assert [line for line in table if line.split()[4].startswith(prefix)] == []
