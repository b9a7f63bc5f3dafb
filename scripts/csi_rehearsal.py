"""What kubelet does with chromafs-csi, rehearsed in the container stack of `scripts/containers`.

The node plugin's two containers start as deploy/kubernetes/daemonset.yaml says (its commands,
arguments, mounts and Bidirectional propagation, read from the file), privileged, on the stack's
backends; kubelet's pods directory is a shared directory of this run. Then, for each token of
the stack, what kubelet does for a pod like deploy/kubernetes/example-pod.yaml: NodePublishVolume
on a target under the pods directory (as kubelet asks for an inline volume: ReadWriteOnce with
readonly set, the pod's attributes, the Secret's token), the target bound read-only into the
agent's container (as the pod mounts it: unprivileged, no capability), whose bash must see
exactly the reader's files and fail to write; a publish again (nothing stacked), an expired
token (UNAUTHENTICATED, nothing mounted), a plugin container restarted that still unpublishes,
and every target gone after NodeUnpublishVolume. And a pod that signs in as itself (the
CSIDriver's tokenRequests): no Secret, its service-account token (signed here as the cluster's
key, published as the JWKS of the DaemonSet's ConfigMap, with the mapping beside it) handed over
for the driver's audience: its agent sees exactly its mapped reader's files; a publish again with
a fresh token (requiresRepublish) renews it; a token for another audience is UNAUTHENTICATED.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import jwt
import yaml

from containers_lib.common import P, StackError, log, sh
from containers_lib.images import image
from containers_lib.stack import (
    AGENT_SESSION,
    S3_ENV,
    SECRET,
    SITE,
    USERS,
    check_agent,
    remove_containers,
    shared_mount_point,
    visible_files,
)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
PODS = "/var/lib/kubelet/pods"
SA_ACCOUNT = ("agents", "doc-agent")  # the pod that signs in as itself: deploy/kubernetes/example-pod.yaml's
NODE = "rehearsal-node"
# the example pod's servers, as the stack reaches them (its backends share one loopback)
BACKENDS = {
    "chroma-url": "http://127.0.0.1:8000",
    "redis-url": "redis://127.0.0.1:6379/0",
    "s3-endpoint-url": "http://127.0.0.1:5000",
}


def _manifest(name: str, kind: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((DEPLOY / name).read_text())
    return next(d for d in docs if d["kind"] == kind)


def rehearse_kubelet(stack: Any) -> tuple[dict[str, float], list[str]]:
    """(figures, problems) of the rehearsal on `stack` (containers_lib.stack.Stack, up)."""
    root = stack.work / "kubelet"
    dirs = {"pods": root / "pods", "run": root / "run", "plugin-dir": root / "plugin", "jwt-key": stack.secrets}
    dirs["sa-readers"] = root / "sa"
    for name in ("pods", "run", "plugin-dir", "sa-readers"):
        dirs[name].mkdir(parents=True)
    cluster = Cluster(dirs["sa-readers"])
    shared_mount_point(dirs["pods"])
    started: list[str] = []
    try:
        for name in ("mountd", "csi"):
            container = _node_container(name)
            stack.run(f"csi-{name}", _run_argv(container, dirs, name == "mountd"))
            started.append(f"{P}-csi-{name}")
        return _rehearse(stack, dirs, cluster)
    except (StackError, grpc.RpcError, OSError) as exc:
        return {}, [f"kubelet rehearsal: {_words(exc)}"]
    finally:
        remove_containers(stack.engine, started, [])
        with contextlib.suppress(StackError):
            sh(["umount", "-R", str(dirs["pods"])], check=False, quiet=True)


def _node_container(name: str) -> dict[str, Any]:
    spec = _manifest("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def _run_argv(container: dict[str, Any], dirs: dict[str, Path], backends: bool) -> list[str]:
    """`engine run` arguments for a DaemonSet container: its mounts (Bidirectional: rshared),
    its environment and arguments ($(NODE_NAME) as kubelet expands it)."""
    argv = [
        # What the manifest's `privileged: true` is used for, as the stack's mount server gets it:
        # Docker on some hosts cannot apply a privileged container's whole capability set.
        *("--device", "/dev/fuse", "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined"),
        *(["--network", f"container:{P}-net", *S3_ENV] if backends else ["--network", "none"]),
    ]
    for mount in container.get("volumeMounts", []):
        if mount["name"] == "fuse":
            continue  # --device gives /dev/fuse
        flags = (
            "rshared" if mount.get("mountPropagation") == "Bidirectional" else ("ro" if mount.get("readOnly") else "")
        )
        argv += ["-v", f"{dirs[mount['name']]}:{mount['mountPath']}" + (f":{flags}" if flags else "")]
    for env in container.get("env", []):
        argv += ["-e", f"{env['name']}={env.get('value', NODE)}"]
    command, *rest = container["command"]
    args = [a.replace("$(NODE_NAME)", NODE) for a in [*rest, *container.get("args", [])]]
    return [*argv, "--entrypoint", command, image("chromafs"), *args]


class Cluster:
    """The cluster's service-account token issuer, as the DaemonSet's chromafs-csi is told of it
    (its --sa-* flags): an RSA key published as the ConfigMap's jwks.json, and the operator's
    mapping in its readers.yaml (the service account SA_ACCOUNT is alice's reader class)."""

    def __init__(self, folder: Path) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa
        from jwt.algorithms import RSAAlgorithm

        args = _node_container("csi")["args"]
        flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--sa-")}
        self.issuer, self.audience = flag["--sa-issuer"], flag["--sa-audience"]
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        (folder / Path(flag["--sa-jwks-url"]).name).write_text(
            json.dumps({"keys": [{**jwk, "kid": "cluster-1", "use": "sig", "alg": "RS256"}]})
        )
        namespace, name = SA_ACCOUNT
        readers = {"readers": [{"serviceAccount": f"{namespace}/{name}", "site": SITE, "groups": USERS["alice"]}]}
        (folder / Path(flag["--sa-readers"]).name).write_text(yaml.safe_dump(readers))

    def token(self, expires_in: int = 3600, audience: str | None = None) -> str:
        """The pod's projected token, as the API server signs it for the pod's service account."""
        namespace, name = SA_ACCOUNT
        now = int(time.time())
        claims = {
            "sub": f"system:serviceaccount:{namespace}:{name}", "iss": self.issuer,
            "aud": [audience or self.audience], "iat": now, "nbf": now, "exp": now + expires_in,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": "5f3c"}},
        }  # fmt: skip
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "cluster-1"})

    def context(self, token: str) -> dict[str, str]:
        """What kubelet adds to volume_context for the CSIDriver's tokenRequests and podInfoOnMount."""
        handed = {self.audience: {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
        return {
            "csi.storage.k8s.io/serviceAccount.tokens": json.dumps(handed),
            "csi.storage.k8s.io/pod.namespace": SA_ACCOUNT[0],
            "csi.storage.k8s.io/serviceAccount.name": SA_ACCOUNT[1],
        }


def _rehearse(stack: Any, dirs: dict[str, Path], cluster: Cluster) -> tuple[dict[str, float], list[str]]:
    from chromafs_fuse.csi.stubs import pb, rpc

    pod = _manifest("example-pod.yaml", "Pod")
    attributes = {**pod["spec"]["volumes"][0]["csi"]["volumeAttributes"], **BACKENDS}
    attributes["csi.storage.k8s.io/ephemeral"] = "true"
    figures: dict[str, float] = {}
    problems: list[str] = []
    socket = dirs["plugin-dir"] / "csi.sock"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        identity, node = rpc.IdentityStub(channel), rpc.NodeStub(channel)
        _wait_ready(identity, pb)

        def publish(uid: str, token: str | None, pod_token: str | None = None) -> tuple[Path, float]:
            (dirs["pods"] / uid / "volumes" / "kubernetes.io~csi" / "docs").mkdir(parents=True, exist_ok=True)
            target = f"{PODS}/{uid}/volumes/kubernetes.io~csi/docs/mount"
            mode = pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
            context = {**attributes, "csi.storage.k8s.io/pod.uid": uid}
            if pod_token is not None:
                context.update(cluster.context(pod_token))
            request = pb.NodePublishVolumeRequest(
                volume_id=f"csi-{uid}", target_path=target, readonly=True,
                secrets={"token": token} if token is not None else {},
                volume_capability=pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(), access_mode=mode),
                volume_context=context,
            )  # fmt: skip
            began = time.monotonic()
            node.NodePublishVolume(request, timeout=120)
            return dirs["pods"] / uid / "volumes" / "kubernetes.io~csi" / "docs" / "mount", time.monotonic() - began

        def unpublish(uid: str) -> None:
            target = f"{PODS}/{uid}/volumes/kubernetes.io~csi/docs/mount"
            node.NodeUnpublishVolume(
                pb.NodeUnpublishVolumeRequest(volume_id=f"csi-{uid}", target_path=target), timeout=60
            )

        for user, groups in USERS.items():
            token = (stack.secrets / f"{user}.jwt").read_text()
            host_target, took = publish(f"pod-{user}", token)
            figures[f"csi_publish_{user}_s"] = round(took, 3)
            publish(f"pod-{user}", token)  # kubelet retrying
            stacked = _mounts_at(host_target)
            if stacked != 1:
                problems.append(f"{user}: {stacked} mounts at the pod's target after two publishes (1 expected)")
            output = _agent(stack, pod, user, host_target)
            found = check_agent(f"{user} (csi)", output, visible_files(groups))
            problems += found
            log(f"kubelet rehearsal: {user}'s pod published in {took * 1000:.0f} ms; {found or 'ok'}")
            unpublish(f"pod-{user}")
            unpublish(f"pod-{user}")  # again: OK
            if host_target.exists():
                problems.append(f"{user}: the pod's target is still there after NodeUnpublishVolume")
        expired = jwt.encode({"sub": "late", "site": SITE, "exp": int(time.time()) - 5}, SECRET)
        try:
            publish("pod-expired", expired)
            problems.append("an expired token was published")
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
                problems.append(f"an expired token: {exc.code()} (UNAUTHENTICATED expected)")  # type: ignore[attr-defined]
        if (dirs["pods"] / "pod-expired" / "volumes" / "kubernetes.io~csi" / "docs" / "mount").exists():
            problems.append("an expired token left a target behind")
        problems += _signed_in_as_itself(stack, pod, cluster, publish, unpublish)
        host_target, _ = publish("pod-restart", (stack.secrets / "alice.jwt").read_text())
        sh([stack.engine, "restart", "-t", "10", f"{P}-csi-csi"], timeout=120)
        _wait_ready(identity, pb)
        unpublish("pod-restart")
        if os.path.ismount(host_target) or host_target.exists():
            problems.append("a restarted plugin did not unpublish what it published")
        log(f"kubelet rehearsal: expired token refused, a restarted plugin unpublished; {len(problems)} problems")
    return figures, problems


def _signed_in_as_itself(stack: Any, pod: dict[str, Any], cluster: Cluster, publish: Any, unpublish: Any) -> list[str]:
    """A pod with no Secret, signed in with its service-account token (tokenRequests)."""
    problems: list[str] = []
    uid = "pod-doc-agent"
    host_target, took = publish(uid, None, cluster.token(expires_in=600))
    publish(uid, None, cluster.token(expires_in=3600))  # requiresRepublish: a fresh token renews it
    if _mounts_at(host_target) != 1:
        problems.append(f"doc-agent: {_mounts_at(host_target)} mounts at the pod's target after a republish")
    found = check_agent("doc-agent (csi, service account)", _agent(stack, pod, "doc-agent", host_target),
                        visible_files(USERS["alice"]))  # fmt: skip
    problems += found
    log(f"kubelet rehearsal: doc-agent's pod signed in as itself in {took * 1000:.0f} ms; {found or 'ok'}")
    unpublish(uid)
    try:
        publish("pod-other-audience", None, cluster.token(audience="vault"))
        problems.append("a service-account token for another audience was published")
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
            problems.append(f"a token for another audience: {exc.code()} (UNAUTHENTICATED expected)")  # type: ignore[attr-defined]
    for left in (
        host_target,
        host_target.parents[3].parent / "pod-other-audience" / "volumes" / "kubernetes.io~csi" / "docs" / "mount",
    ):
        if left.exists():
            problems.append(f"{left} is still there after a service-account pod's refusal or unpublish")
    return problems


def _wait_ready(identity: Any, pb: ModuleType) -> None:
    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(grpc.RpcError):
            if identity.Probe(pb.ProbeRequest(), timeout=5).ready.value:
                return
        if time.monotonic() > deadline:
            raise StackError("chromafs-csi did not answer Probe ready within 90 s (its container's logs say why)")
        time.sleep(0.3)


def _agent(stack: Any, pod: dict[str, Any], user: str, host_target: Path) -> str:
    """The example pod's agent container, as kubelet would run it, with the stack's agent script."""
    (agent,) = pod["spec"]["containers"]
    (mount,) = agent["volumeMounts"]
    user_flag = f"{pod['spec']['securityContext']['runAsUser']}:{pod['spec']['securityContext']['runAsGroup']}"
    argv = ["--network", "none", "--user", user_flag, "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "-v", f"{host_target}:{mount['mountPath']}:ro",
            agent["image"], "bash", "-c", AGENT_SESSION]  # fmt: skip
    return str(stack.run(f"csi-agent-{user}", argv, detach=False))


def _mounts_at(path: Path) -> int:
    with open("/proc/self/mountinfo") as table:
        return sum(1 for line in table if line.split()[4] == str(path))


def _words(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    return str(exc)
