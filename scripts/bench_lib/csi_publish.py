"""The csi figure: NodePublishVolume as kubelet calls it, timed at the caller.

A real `chroma run`, redis-server, chromafs-mountd and chromafs-csi; the sample site. The first
publish of each of two reader classes (billing, signed in with no group) is timed apart, as
`cold_ms`: the mount server serves the class then. Then PUBLISHES publishes alternate between
the two classes, each on a fresh target as kubelet names one, each timed from the gRPC call to
its answer (the token checked, the session bound, the target made); p50 and p90 over them.
Every target is unpublished at the end, and a publish that left no mount is a problem.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import grpc
import jwt

from bench_lib.measure import percentile
from harness.processes import SAMPLE_SITE, ingest
from harness.servers import ChromaServer, CsiPlugin, RedisServer, running_mount_server

PUBLISHES = 20
GOAL_P90_MS = 100.0
SITE = "acme"
SECRET = "bench-csi-secret-0123456789abcdef"
READERS = {"billing": ["billing"], "signed-in": []}


def measure(run: Any) -> dict[str, Any]:
    from chromafs_fuse.csi.stubs import pb, rpc

    root = run.tmp / "csi-figure"
    for folder in ("mountd", "pods", "plugin"):
        (root / folder).mkdir(parents=True)
    secret = root / "jwt_secret"
    secret.write_text(SECRET)
    tokens = {
        name: jwt.encode({"sub": name, "site": SITE, "groups": groups, "exp": int(time.time()) + 3600}, SECRET)
        for name, groups in READERS.items()
    }
    out: dict[str, Any] = {"publishes": PUBLISHES, "classes": list(READERS), "goal_p90_ms": GOAL_P90_MS}
    with contextlib.ExitStack() as parts:
        chroma = parts.enter_context(ChromaServer(root / "chroma-data"))
        redis = parts.enter_context(RedisServer(root / "redis"))
        ingest(SAMPLE_SITE, "--site", SITE, "--chroma-url", chroma.url, "--redis-url", redis.url, "--quiet")
        mountd = parts.enter_context(running_mount_server(root / "mountd", root / "pods"))
        plugin = parts.enter_context(CsiPlugin(root / "plugin", mountd.socket, "--jwt-secret-file", str(secret)))
        channel = parts.enter_context(grpc.insecure_channel(f"unix://{plugin.socket}"))
        node = rpc.NodeStub(channel)
        attributes = {"site": SITE, "chroma-url": chroma.url, "redis-url": redis.url}
        targets: list[Path] = []

        def publish(reader: str) -> float:
            parent = root / "pods" / f"uid-{len(targets)}" / "volumes" / "kubernetes.io~csi" / "docs"
            parent.mkdir(parents=True)
            target = parent / "mount"
            targets.append(target)
            request = pb.NodePublishVolumeRequest(
                volume_id=f"csi-{len(targets)}",
                target_path=str(target),
                volume_capability=pb.VolumeCapability(
                    mount=pb.VolumeCapability.MountVolume(), access_mode=pb.VolumeCapability.AccessMode(mode=1)
                ),
                readonly=True,
                secrets={"token": tokens[reader]},
                volume_context={**attributes, "csi.storage.k8s.io/ephemeral": "true"},
            )
            started = time.perf_counter()
            node.NodePublishVolume(request, timeout=120)
            took = (time.perf_counter() - started) * 1000
            if not target.is_mount():
                run.problems.append(f"csi: publish {len(targets)} returned OK with nothing mounted")
            return took

        try:
            out["cold_ms"] = {reader: round(publish(reader), 1) for reader in READERS}
            names = list(READERS)
            times = [publish(names[i % len(names)]) for i in range(PUBLISHES)]
        finally:
            for target in targets:
                with contextlib.suppress(grpc.RpcError):
                    node.NodeUnpublishVolume(
                        pb.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(target)), timeout=30
                    )
        left = [t for t in targets if t.exists()]
        if left:
            run.problems.append(f"csi: {len(left)} targets left after NodeUnpublishVolume")
    out["ms"] = [round(t, 1) for t in times]
    out["p50_ms"] = round(percentile(times, 50), 1)
    out["p90_ms"] = round(percentile(times, 90), 1)
    out["met"] = out["p90_ms"] <= GOAL_P90_MS
    for line in text_lines(out):
        run.say(f"csi:{line}")
    return out


def text_lines(out: dict[str, Any]) -> list[str]:
    cold = ", ".join(f"{k} {v} ms" for k, v in out.get("cold_ms", {}).items())
    return [
        f" NodePublishVolume over {out['publishes']} publishes of {len(out['classes'])} reader classes: "
        f"p50 {out['p50_ms']} ms, p90 {out['p90_ms']} ms (goal p90 <= {out['goal_p90_ms']:.0f} ms: "
        f"{'met' if out['met'] else 'NOT met'})",
        f" first publish of each class (the class served then): {cold}",
    ]
