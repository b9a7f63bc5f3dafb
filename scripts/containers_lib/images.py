"""The base and the images: whether a registry answers, else a Debian bookworm base made with
mmdebstrap and imported (cached); every image of IMAGES built from it, with this machine's CA
bundle as a file of the build context; `image`, an image's local name."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from containers_lib.common import CACHE, REPO, StackError, log, sh
from containers_lib.engine import apt_install

LOCAL_BASE = "localhost/chromafs-base:bookworm"
REGISTRY_PROBE = "docker.io/library/debian:bookworm-slim"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# where the builds find HOST_CA: a file of their context (docker/build-ca/README.md)
BUILD_CA = REPO / "docker" / "build-ca" / "host-ca-bundle.crt"
# name -> (Dockerfile, build context)
IMAGES = {
    "chromafs": ("docker/Dockerfile", "."),
    "agent": ("docker/Dockerfile.agent", "docker"),
    "chroma": ("docker/Dockerfile.chroma", "docker"),
    "redis": ("docker/Dockerfile.redis", "docker"),
    "s3": ("docker/Dockerfile.s3", "docker"),
    "test": ("docker/Dockerfile.test", "."),
}


def image_exists(engine: str, image: str) -> bool:
    return subprocess.run([engine, "image", "inspect", image], capture_output=True, check=False).returncode == 0


def registry_answers(engine: str) -> bool:
    if image_exists(engine, REGISTRY_PROBE):
        return True
    try:
        sh([engine, "pull", "-q", REGISTRY_PROBE], timeout=60)
    except StackError:
        return False
    return True


def local_base(engine: str) -> str:
    """A Debian bookworm base from the distribution's mirror (about 20 s, once)."""
    if image_exists(engine, LOCAL_BASE):
        return LOCAL_BASE
    CACHE.mkdir(parents=True, exist_ok=True)
    rootfs = CACHE / "rootfs-bookworm.tar"
    if not rootfs.exists():
        if not shutil.which("mmdebstrap"):
            apt_install(["mmdebstrap"])
        log("no registry answers: making a Debian bookworm base with mmdebstrap")
        partial = rootfs.with_suffix(".partial")
        sh(
            ["mmdebstrap", "--variant=minbase", "--format=tar", "--include=ca-certificates", "bookworm", str(partial)],
            timeout=900,
        )
        partial.rename(rootfs)
    sh([engine, "import", str(rootfs), LOCAL_BASE], timeout=300)
    return LOCAL_BASE


def build_images(engine: str, names: list[str], base: str | None) -> dict[str, float]:
    """Each image, from `base` when given. This machine's CA bundle (a TLS-inspecting proxy's CA
    may be in it) goes to the builds as a file of their context, docker/build-ca/, which the
    Dockerfiles that run pip add to the image's bundle: the same with docker and podman, with
    BuildKit on or off (a build volume is podman's alone, a build secret BuildKit's alone)."""
    took: dict[str, float] = {}
    if HOST_CA.exists():
        shutil.copyfile(HOST_CA, BUILD_CA)
    try:
        for name in names:
            dockerfile, context = IMAGES[name]
            argv = [engine, "build", "-q", "-f", dockerfile, "-t", f"localhost/chromafs-{name}:local"]
            if base:
                argv += ["--build-arg", f"BASE={base}"]
            if engine == "podman":
                argv += ["--format", "docker"]  # keeps HEALTHCHECK
            started = time.monotonic()
            sh([*argv, context], timeout=1800)
            took[name] = round(time.monotonic() - started, 1)
            log(f"built chromafs-{name} in {took[name]:.0f}s")
    finally:
        BUILD_CA.unlink(missing_ok=True)
    return took


def image(name: str) -> str:
    return f"localhost/chromafs-{name}:local"
