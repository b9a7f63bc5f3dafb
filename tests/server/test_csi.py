"""chromafs-csi, the Kubernetes node plugin, driven as kubelet drives it: over its real unix
socket with a gRPC client built from csi.proto, against a real chromafs-mountd, `chroma run` and
redis-server. What a pod would get is checked as a user would: the exact files and bytes of its
reader, the gRPC status code of each refusal, nothing mounted after one, and a restarted plugin."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from chromafs_fuse.csi.servicer import DRIVER_NAME
from chromafs_fuse.csi.stubs import pb, rpc
from infra import (
    SAMPLE_SITE,
    ChromaServer,
    CsiPlugin,
    IdentityProvider,
    RedisServer,
    copy_subset,
    expected_visible,
    free_port,
    ingest,
    run,
    running_mount_server,
    tree_listing,
    wait_until,
)

SITE = "acme"
READ_ONLY = 2  # VolumeCapability.AccessMode.Mode.SINGLE_NODE_READER_ONLY
SINGLE_NODE_WRITER = 1  # what kubelet asks for an inline volume (ReadWriteOnce), with readonly set
MULTI_NODE_MULTI_WRITER = 5


class Stack:
    """Chroma, Redis, the mount server and the plugin of one node; `pods`: where targets go."""

    def __init__(self, root: Path, chroma: ChromaServer, redis: RedisServer, mountd: Any, plugin: CsiPlugin) -> None:
        self.root = root
        self.pods = root / "pods"
        self.chroma = chroma
        self.redis = redis
        self.mountd = mountd
        self.plugin = plugin
        self.count = 0

    def attributes(self, **more: str) -> dict[str, str]:
        pod = {"csi.storage.k8s.io/pod.name": "agent", "csi.storage.k8s.io/ephemeral": "true"}
        return {"site": SITE, "chroma-url": self.chroma.url, "redis-url": self.redis.url, **pod, **more}

    def target(self) -> Path:
        """A fresh target path as kubelet names one; its parent exists, the target does not."""
        self.count += 1
        parent = self.pods / f"uid-{self.count}" / "volumes" / "kubernetes.io~csi" / "docs"
        parent.mkdir(parents=True)
        return parent / "mount"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, secret_file: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("csi")
    for folder in ("mountd", "pods"):
        (root / folder).mkdir()
    with contextlib.ExitStack() as parts:
        chroma = parts.enter_context(ChromaServer(root / "chroma-data"))
        redis = parts.enter_context(RedisServer(root / "redis"))
        ingest(SAMPLE_SITE, "--site", SITE, "--chroma-url", chroma.url, "--quiet")
        mountd = parts.enter_context(running_mount_server(root / "mountd", root / "pods"))
        plugin = parts.enter_context(CsiPlugin(root / "plugin", mountd.socket, "--jwt-secret-file", str(secret_file)))
        yield Stack(root, chroma, redis, mountd, plugin)


@contextlib.contextmanager
def channel(plugin: CsiPlugin) -> Iterator[tuple[Any, Any]]:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as chan:
        yield rpc.IdentityStub(chan), rpc.NodeStub(chan)


def publish_request(
    target: Path,
    attributes: dict[str, str],
    token: str | None = None,
    readonly: bool = True,
    mode: int = READ_ONLY,
) -> Any:
    return pb.NodePublishVolumeRequest(
        volume_id=f"csi-{target.parents[3].name}",
        target_path=str(target),
        volume_capability=pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(), access_mode=pb.VolumeCapability.AccessMode(mode=mode)
        ),
        readonly=readonly,
        secrets={"token": token} if token is not None else {},
        volume_context=attributes,
    )


def unpublish(node: Any, target: Path) -> None:
    node.NodeUnpublishVolume(
        pb.NodeUnpublishVolumeRequest(volume_id=f"csi-{target.parents[3].name}", target_path=str(target)),
        timeout=30,
    )


def mounts_at(target: Path) -> int:
    """How many mounts are stacked at `target` (the kernel's table, not Python's view)."""
    with open("/proc/self/mountinfo") as table:
        return sum(1 for line in table if line.split()[4] == str(target))


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    return error.code(), error.details()


def test_identity_and_node_info(stack: Stack) -> None:
    with channel(stack.plugin) as (identity, node):
        info = identity.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10)
        assert (info.name, info.vendor_version) == (DRIVER_NAME, "0.1.0")
        assert list(identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=10).capabilities) == []
        assert identity.Probe(pb.ProbeRequest(), timeout=10).ready.value is True
        assert node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=10).node_id == "node-1"
        assert list(node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(), timeout=10).capabilities) == []


@pytest.mark.parametrize(
    ("groups", "mode"),
    [(None, READ_ONLY), (["billing"], SINGLE_NODE_WRITER), (["admin"], READ_ONLY)],
    ids=["anonymous", "billing-as-kubelet-asks", "admin"],
)
def test_each_reader_gets_exactly_its_files(
    stack: Stack, make_token: Callable[..., str], tmp_path: Path, groups: list[str] | None, mode: int
) -> None:
    target = stack.target()
    token = None if groups is None else make_token(groups)
    request = publish_request(target, stack.attributes(), token, mode=mode)
    visible = expected_visible(SAMPLE_SITE, "public", None if groups is None else set(groups))
    with channel(stack.plugin) as (_identity, node):
        node.NodePublishVolume(request, timeout=60)
        try:
            assert mounts_at(target) == 1
            files = {p for p in tree_listing(target) if (target / p).is_file()}
            assert files == visible
            diff = run(["diff", "-r", str(copy_subset(SAMPLE_SITE, visible, tmp_path / "expected")), str(target)])
            assert diff.returncode == 0, diff.stdout + diff.stderr
            with pytest.raises(OSError, match="Read-only file system"):
                (target / "new.md").write_text("x")
            node.NodePublishVolume(request, timeout=60)  # kubelet retrying: OK, nothing stacked
            assert mounts_at(target) == 1
        finally:
            unpublish(node, target)
        assert mounts_at(target) == 0 and not target.exists()
        unpublish(node, target)  # again: OK
        assert not target.exists()


def test_a_plugin_verifies_with_an_identity_providers_keys(stack: Stack, tmp_path: Path) -> None:
    """--jwks-url, --jwt-issuer and --jwt-audience on the plugin: it checks the token with them and
    hands them to the mount server with the request, which checks it again the same way."""
    with contextlib.ExitStack() as parts:
        idp = parts.enter_context(IdentityProvider())
        idp.add_key("k1")
        keys = [
            "--jwks-url",
            idp.url,
            "--jwt-issuer",
            idp.ISSUER,
            "--jwt-audience",
            idp.AUDIENCE,
            "--jwks-cooldown",
            "0",
        ]
        plugin = parts.enter_context(CsiPlugin(tmp_path / "plugin", stack.mountd.socket, *keys))
        with channel(plugin) as (_identity, node):
            target = stack.target()
            node.NodePublishVolume(publish_request(target, stack.attributes(), idp.token("k1", groups=["billing"])),
                                   timeout=60)  # fmt: skip
            try:
                page = SAMPLE_SITE / "api-reference" / "payments.mdx"  # billing's
                assert (target / "api-reference" / "payments.mdx").read_bytes() == page.read_bytes()
            finally:
                unpublish(node, target)
            other = publish_request(stack.target(), stack.attributes(), idp.token("k1", aud="another-service"))
            code, details = refused(lambda: node.NodePublishVolume(other, timeout=60))
            assert (code, "'aud' claim is 'another-service'" in details) == (grpc.StatusCode.UNAUTHENTICATED, True)
            idp.status = 503  # the provider down, a key not kept: refused, for kubelet to ask again
            unknown = publish_request(stack.target(), stack.attributes(), idp.token("k2", idp.keys["k1"]))
            code, details = refused(lambda: node.NodePublishVolume(unknown, timeout=60))
            assert (code, details) == (
                grpc.StatusCode.UNAVAILABLE,
                f"cannot fetch the JWKS at {idp.url}: HTTP 503 Service Unavailable",
            )


def test_another_reader_on_a_published_target_is_refused(stack: Stack, make_token: Callable[..., str]) -> None:
    target = stack.target()
    with channel(stack.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(target, stack.attributes(), make_token(["billing"])), timeout=60)
        try:
            code, _ = refused(lambda: node.NodePublishVolume(publish_request(target, stack.attributes()), timeout=60))
            assert code == grpc.StatusCode.ALREADY_EXISTS
            assert mounts_at(target) == 1
        finally:
            unpublish(node, target)


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("writable", grpc.StatusCode.INVALID_ARGUMENT, "readOnly: true"),
        ("multi-writer", grpc.StatusCode.INVALID_ARGUMENT, "MULTI_NODE_MULTI_WRITER"),
        ("no-site", grpc.StatusCode.INVALID_ARGUMENT, "no `site`"),
        ("unknown-attribute", grpc.StatusCode.INVALID_ARGUMENT, "chroma-path"),
        ("bad-signature", grpc.StatusCode.UNAUTHENTICATED, "signature is invalid"),
        ("expired", grpc.StatusCode.UNAUTHENTICATED, "expired"),
        ("not-a-jwt", grpc.StatusCode.UNAUTHENTICATED, "not a JWT"),
        ("other-site", grpc.StatusCode.PERMISSION_DENIED, "token is for site"),
    ],
)
def test_refusals_leave_nothing_mounted(
    stack: Stack, make_token: Callable[..., str], case: str, code: grpc.StatusCode, words: str
) -> None:
    import jwt

    attributes, token, readonly, mode = stack.attributes(), make_token(["billing"]), True, READ_ONLY
    if case == "writable":
        readonly, mode = False, SINGLE_NODE_WRITER
    elif case == "multi-writer":
        mode = MULTI_NODE_MULTI_WRITER
    elif case == "no-site":
        del attributes["site"]
    elif case == "unknown-attribute":
        attributes["chroma-path"] = "/etc"
    elif case == "bad-signature":
        forger = "another-secret-0123456789abcdef0123456789"
        token = jwt.encode({"site": SITE, "exp": int(time.time()) + 60}, forger, algorithm="HS256")
    elif case == "expired":
        token = make_token(["billing"], exp=int(time.time()) - 10)
    elif case == "not-a-jwt":
        token = "not-a-token"
    elif case == "other-site":
        token = make_token(["billing"], site="other")
    target = stack.target()
    with channel(stack.plugin) as (_identity, node):
        request = publish_request(target, attributes, token, readonly=readonly, mode=mode)
        got, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
    assert (got, words in details) == (code, True), details
    assert "Traceback" not in details and "Error" not in details
    assert mounts_at(target) == 0 and not target.exists()


@pytest.mark.expect_log(r"WARNING .*(control request|session on .*) refused: .*nosuchsite")
def test_a_site_that_does_not_exist_is_not_found(stack: Stack, make_token: Callable[..., str]) -> None:
    """The serving process's refusal keeps its kind through the mount server to kubelet:
    NOT_FOUND, which kubelet does not retry as it would UNAVAILABLE."""
    target = stack.target()
    attributes = stack.attributes(site="nosuchsite")
    with channel(stack.plugin) as (_identity, node):
        request = publish_request(target, attributes, make_token(["billing"], site="nosuchsite"))
        got, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
    assert (got, "nosuchsite" in details) == (grpc.StatusCode.NOT_FOUND, True), details
    assert mounts_at(target) == 0 and not target.exists()


@pytest.mark.expect_log(r"(ERROR|WARNING) .*cannot open Chroma at .*: no answer")
def test_backend_down_is_unavailable_with_the_servers_message(stack: Stack, make_token: Callable[..., str]) -> None:
    target = stack.target()
    dead = f"http://127.0.0.1:{free_port()}"
    attributes = stack.attributes(**{"chroma-url": dead, "site": SITE, "collection": "elsewhere"})
    del attributes["redis-url"]
    attributes["backend-timeout"] = "2"
    with channel(stack.plugin) as (_identity, node):
        request = publish_request(target, attributes, make_token(["billing"]))
        got, details = refused(lambda: node.NodePublishVolume(request, timeout=60))
    assert got == grpc.StatusCode.UNAVAILABLE, details
    assert dead.split("//")[1] in details or "Chroma" in details, details
    assert mounts_at(target) == 0 and not target.exists()


def test_a_restarted_plugin_unpublishes_what_it_published(stack: Stack, make_token: Callable[..., str]) -> None:
    targets = [stack.target(), stack.target()]
    with channel(stack.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(targets[0], stack.attributes(), make_token(["billing"])), timeout=60)
        node.NodePublishVolume(publish_request(targets[1], stack.attributes()), timeout=60)
    stack.plugin.stop()
    stack.plugin.start()  # a new process: it knows only the mount table and the mount server
    with channel(stack.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(targets[0], stack.attributes(), make_token(["billing"])), timeout=60)
        assert [mounts_at(t) for t in targets] == [1, 1]
        for target in targets:
            unpublish(node, target)
    assert [mounts_at(t) for t in targets] == [0, 0]
    assert not any(t.exists() for t in targets)


def test_mount_server_down(stack: Stack, tmp_path: Path) -> None:
    with CsiPlugin(tmp_path / "lonely", tmp_path / "no-mountd.sock") as plugin, channel(plugin) as (identity, node):
        assert identity.Probe(pb.ProbeRequest(), timeout=10).ready.value is False
        target = stack.target()
        got, details = refused(lambda: node.NodePublishVolume(publish_request(target, stack.attributes()), timeout=30))
        assert got == grpc.StatusCode.UNAVAILABLE and "chromafs-mountd" in details, details
        assert mounts_at(target) == 0 and not target.exists()


@contextlib.contextmanager
def pod(target: Path, folder: Path) -> Iterator[Callable[..., str]]:
    """A process in a mount namespace of its own that holds the target as a container runtime binds
    a pod's volume (an rbind, then rslave: kubelet's HostToContainer); `shell(cmd)` runs `cmd` there."""
    inside = folder / "docs"
    inside.mkdir(parents=True)
    script = f"mount --rbind {target} {inside} && mount --make-rslave {inside} && echo ready && exec sleep 300"
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "slave", "sh", "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"

        def shell(command: str, cd: bool = True) -> str:
            argv = ["nsenter", "-t", str(proc.pid), "-m", "sh", "-c", f"cd {inside} && {command}" if cd else command]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return done.stdout + done.stderr

        yield shell
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
@pytest.mark.parametrize("isolated", [False, True], ids=["class-session", "isolated"])
def test_token_expiry(stack: Stack, make_token: Callable[..., str], tmp_path: Path, isolated: bool) -> None:
    """What docs/KUBERNETES.md says a pod sees when its token expires: the node's session ends
    (the target is unmounted), and the pod keeps the copy its runtime bound, through which every
    path fails, the kernel's caches included: a class session's serving process refuses it
    (EACCES); an isolated session's daemon refuses, has the kernel forget its directories and
    exits (ENOTCONN)."""
    target = stack.target()
    attributes = stack.attributes(isolated="true") if isolated else stack.attributes()
    token = make_token(["billing"], exp=int(time.time()) + 4)
    with channel(stack.plugin) as (_identity, node):
        node.NodePublishVolume(publish_request(target, attributes, token), timeout=60)
        try:
            with pod(target, tmp_path / "pod") as shell:
                assert shell("cat index.mdx") == (SAMPLE_SITE / "index.mdx").read_text()
                wait_until(lambda: mounts_at(target) == 0, 20, "the session to end at the token's expiry")
                inside = tmp_path / "pod" / "docs"
                refused = "not connected" if isolated else "Permission denied"
                wait_until(lambda: refused in shell(f"stat -f {inside}", cd=False), 20, f"statfs: {refused}")
                pages = [f"cat {inside}/{page}" for page in ("index.mdx", "quickstart.mdx")]  # read, warmed
                for command in (f"ls {inside}", *pages, f"cd {inside}"):
                    answer = shell(command, cd=False)
                    assert refused in answer or "can't cd" in answer, (command, answer)
        finally:
            unpublish(node, target)
        assert mounts_at(target) == 0 and not target.exists()


def test_a_bad_flag_or_path_is_one_line(tmp_path: Path) -> None:
    def run_csi(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "chromafs_fuse.cli.csi", "--node-id", "n", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    cases = {
        "not a unix endpoint": (run_csi("--endpoint", "tcp://0.0.0.0:10000"), "give a unix socket"),
        "an endpoint it cannot make": (run_csi("--endpoint", "unix:///proc/no-such-dir/csi.sock"), "/proc/no-such"),
        "a key it cannot read": (run_csi("--jwt-secret-file", str(tmp_path / "none")), "cannot read its token key"),
        "no node id": (subprocess.run([sys.executable, "-m", "chromafs_fuse.cli.csi"], capture_output=True,
                                      text=True, timeout=60), "--node-id"),
    }  # fmt: skip
    for what, (done, words) in cases.items():
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and words in done.stderr and "Traceback" not in done.stderr, (what, done.stderr)
        assert lines[-1].startswith("chromafs-csi") and words in lines[-1], (what, lines)  # after argparse's usage


def test_no_leftover_sessions(stack: Stack) -> None:
    """Last: every target this module published is gone from the mount table."""
    prefix = os.path.realpath(stack.pods) + "/"
    with open("/proc/self/mountinfo") as table:
        assert [line for line in table if line.split()[4].startswith(prefix)] == []
