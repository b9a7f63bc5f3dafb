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
and every target gone after NodeUnpublishVolume.
"""

from __future__ import annotations

import contextlib
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
    for name in ("pods", "run", "plugin-dir"):
        dirs[name].mkdir(parents=True)
    shared_mount_point(dirs["pods"])
    started: list[str] = []
    try:
        for name in ("mountd", "csi"):
            container = _node_container(name)
            stack.run(f"csi-{name}", _run_argv(container, dirs, name == "mountd"))
            started.append(f"{P}-csi-{name}")
        return _rehearse(stack, dirs)
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


def _rehearse(stack: Any, dirs: dict[str, Path]) -> tuple[dict[str, float], list[str]]:
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

        def publish(uid: str, token: str) -> tuple[Path, float]:
            (dirs["pods"] / uid / "volumes" / "kubernetes.io~csi" / "docs").mkdir(parents=True, exist_ok=True)
            target = f"{PODS}/{uid}/volumes/kubernetes.io~csi/docs/mount"
            mode = pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
            request = pb.NodePublishVolumeRequest(
                volume_id=f"csi-{uid}", target_path=target, readonly=True, secrets={"token": token},
                volume_capability=pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(), access_mode=mode),
                volume_context={**attributes, "csi.storage.k8s.io/pod.uid": uid},
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
        host_target, _ = publish("pod-restart", (stack.secrets / "alice.jwt").read_text())
        sh([stack.engine, "restart", "-t", "10", f"{P}-csi-csi"], timeout=120)
        _wait_ready(identity, pb)
        unpublish("pod-restart")
        if os.path.ismount(host_target) or host_target.exists():
            problems.append("a restarted plugin did not unpublish what it published")
        log(f"kubelet rehearsal: expired token refused, a restarted plugin unpublished; {len(problems)} problems")
    return figures, problems


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
