"""deploy/kubernetes/ as kubelet and the API server would read it: every file parses, the names
agree with what chromafs-csi says of itself, the flags parse with the commands' own parsers, the
pod example is what the plugin accepts, and every image is one `scripts/containers` builds."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from chromafs_fuse.cli.csi import build_parser as csi_parser
from chromafs_fuse.cli.mountd import build_parser as mountd_parser
from chromafs_fuse.csi.pod_identity import PodKeys
from chromafs_fuse.csi.servicer import DRIVER_NAME
from chromafs_fuse.csi.volume import PublishRequest, mount_options
from chromafs_fuse.pod_readers import parse_map

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
KUBELET_PODS = "/var/lib/kubelet/pods"
# kubelet's own sidecar, the one image no Dockerfile here builds: it registers the plugin's socket
UPSTREAM = {"registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0"}


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def built_images() -> set[str]:
    """scripts/containers_lib/images.py's images, as scripts/containers names them."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    images = importlib.import_module("containers_lib.images")
    return {images.image(name) for name in images.IMAGES}


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def test_every_manifest_parses_and_names_the_driver() -> None:
    found = objects()
    assert {kind for kind, _ in found} >= {"CSIDriver", "DaemonSet", "ServiceAccount", "ClusterRole", "Secret", "Pod"}
    driver = found[("CSIDriver", DRIVER_NAME)]["spec"]
    assert driver == {
        "attachRequired": False,
        "podInfoOnMount": True,
        "volumeLifecycleModes": ["Ephemeral"],
        "fsGroupPolicy": "None",
        "tokenRequests": [{"audience": "chromafs.dev/docs", "expirationSeconds": 3600}],
        "requiresRepublish": True,
    }


def test_daemonset_runs_mountd_and_the_plugin_side_by_side() -> None:
    found = objects()
    spec = found[("DaemonSet", "chromafs-csi-node")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mountd, csi, registrar = (container(spec, n) for n in ("mountd", "csi", "node-driver-registrar"))
    mountd_args = mountd_parser().parse_args(mountd["args"])
    csi_args = csi_parser().parse_args([a.replace("$(NODE_NAME)", "node-1") for a in csi["args"]])
    assert csi_args.mountd == mountd_args.socket  # the plugin asks the server beside it
    assert mounts(csi)["run"]["mountPath"] == mounts(mountd)["run"]["mountPath"] == "/run/chromafs"
    assert csi_args.endpoint == "unix:///csi/csi.sock" and mounts(csi)["plugin-dir"]["mountPath"] == "/csi"
    plugin_dir = volumes["plugin-dir"]["hostPath"]["path"]
    assert plugin_dir == f"/var/lib/kubelet/plugins/{DRIVER_NAME}"
    assert f"--kubelet-registration-path={plugin_dir}/csi.sock" in registrar["args"]
    assert "--csi-address=/csi/csi.sock" in registrar["args"]
    assert volumes["pods"]["hostPath"]["path"] == KUBELET_PODS
    for c in (mountd, csi):  # targets at kubelet's own paths, mounts reaching the host
        assert mounts(c)["pods"] == {"name": "pods", "mountPath": KUBELET_PODS, "mountPropagation": "Bidirectional"}
        assert c["securityContext"] == {"privileged": True}
        assert csi_args.jwt_secret_file.startswith(mounts(c)["jwt-key"]["mountPath"] + "/")
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert mounts(mountd)["fuse"]["mountPath"] == "/dev/fuse"
    key_secret = found[("Secret", volumes["jwt-key"]["secret"]["secretName"])]
    assert csi_args.jwt_secret_file.rsplit("/", 1)[1] in key_secret["stringData"]
    assert spec["serviceAccountName"] in {name for kind, name in found if kind == "ServiceAccount"}


def test_pods_sign_in_with_the_audience_the_driver_asks_for_and_the_operators_mapping() -> None:
    """The CSIDriver's tokenRequests audience is the plugin's --sa-audience; --sa-readers and
    --sa-jwks-url are the ConfigMap's files; its mapping reads, and maps the example pod's
    service account (which names no token Secret) to a reader of the site its volume asks for."""
    found = objects()
    spec = found[("DaemonSet", "chromafs-csi-node")]["spec"]["template"]["spec"]
    csi = container(spec, "csi")
    args = csi_parser().parse_args([a.replace("$(NODE_NAME)", "node-1") for a in csi["args"]])
    (request,) = found[("CSIDriver", DRIVER_NAME)]["spec"]["tokenRequests"]
    assert args.sa_audience == request["audience"]
    assert PodKeys.from_args(args) is not None  # all four flags, or the plugin refuses to start
    volume = next(v for v in spec["volumes"] if v["name"] == "sa-readers")
    folder = mounts(csi)["sa-readers"]["mountPath"]
    config_map = found[("ConfigMap", volume["configMap"]["name"])]
    assert config_map["metadata"]["namespace"] == found[("DaemonSet", "chromafs-csi-node")]["metadata"]["namespace"]
    for path in (args.sa_readers, args.sa_jwks_url):
        assert path.startswith(folder + "/") and path.rsplit("/", 1)[1] in config_map["data"]
    readers = parse_map(config_map["data"]["readers.yaml"], "readers.yaml")
    pod = found[("Pod", "agent-doc-agent")]
    assert "nodePublishSecretRef" not in pod["spec"]["volumes"][0]["csi"]
    site = pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["site"]
    assert readers.reader(pod["metadata"]["namespace"], pod["spec"]["serviceAccountName"], site) is not None
    assert ("ServiceAccount", pod["spec"]["serviceAccountName"]) in found


def test_the_example_pod_is_unprivileged_and_asks_what_the_plugin_serves() -> None:
    found = objects()
    pod = found[("Pod", "agent-alice")]["spec"]
    (volume,) = pod["volumes"]
    csi = volume["csi"]
    assert (csi["driver"], csi["readOnly"]) == (DRIVER_NAME, True)
    secret = found[("Secret", csi["nodePublishSecretRef"]["name"])]
    assert set(secret["stringData"]) == {"token"}
    assert secret["metadata"]["namespace"] == found[("Pod", "agent-alice")]["metadata"]["namespace"]
    request = PublishRequest("v", "/t", True, 1, False, dict(csi["volumeAttributes"]), None)
    assert mount_options(request)["--site"]  # every attribute is one the plugin takes
    (agent,) = pod["containers"]
    assert mounts(agent)["docs"]["readOnly"] is True
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in agent["securityContext"] and pod["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in pod["volumes"])


def test_the_stubs_are_generated_from_the_spec_and_never_committed(tmp_path: Path) -> None:
    from chromafs_fuse.csi.proto.generate import PROTO, generate

    if shutil.which("git") and (REPO / ".git").exists():  # a checkout (the test image has neither)
        tracked = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "chromafs_fuse/csi"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert "chromafs_fuse/csi/proto/csi.proto" in tracked and "chromafs_fuse/csi/proto/LICENSE" in tracked
        assert not [path for path in tracked if "_generated" in path or path.endswith("_pb2.py")]
    assert Path(PROTO).read_bytes() == (REPO / "chromafs_fuse/csi/proto/csi.proto").read_bytes()
    made = Path(generate(str(tmp_path)))
    assert sorted(p.name for p in made.iterdir()) == ["__init__.py", "csi_pb2.py", "csi_pb2_grpc.py"]
    assert "/csi.v1.Node/NodePublishVolume" in (made / "csi_pb2_grpc.py").read_text()


def test_every_image_is_built_by_scripts_containers() -> None:
    named: set[str] = set()
    for doc in objects().values():
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "DaemonSet" else doc.get("spec", {})
        named |= {c["image"] for c in spec.get("containers", []) if isinstance(spec, dict)}
    assert named, "no image named"
    assert named - UPSTREAM <= built_images(), named - UPSTREAM - built_images()
