"""docker/compose.yaml as a user runs it (run_compose): `docker compose` (v2), Debian's
docker-compose (v1) or podman-compose, stage by stage with health polled here; and the compose
project's leftovers, listed and removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from containers_lib.common import CACHE, REPO, P, StackError, answers, log, sh
from containers_lib.engine import apt_install
from containers_lib.images import image
from containers_lib.stack import SECRET, shared_mount_point, wait_for, write_token

COMPOSE_PROJECT = f"{P}-compose"


def compose_cli(engine: str) -> list[str]:
    """`docker compose` (v2) where the plugin is, else Debian's docker-compose (v1, 1.29: it
    reads the same file); podman-compose (PyPI) in a venv of its own: podman 4.3 has no compose."""
    if engine == "docker":
        if answers(["docker", "compose", "version"]):
            return ["docker", "compose"]
        if not shutil.which("docker-compose"):
            apt_install(["docker-compose"])
        return ["docker-compose"]
    venv = CACHE / "podman-compose"
    tool = venv / "bin" / "podman-compose"
    if not tool.exists():
        log("installing podman-compose from PyPI")
        sh([sys.executable, "-m", "venv", str(venv)])
        sh([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "podman-compose"], timeout=600)
    return [str(tool)]


def run_compose(engine: str) -> dict[str, object]:
    """docker/compose.yaml as a user runs it: backends, ingest, the daemon, the agent. Health is
    polled here (podman runs no HEALTHCHECK without systemd: `depends_on: service_healthy`
    would wait for ever), so each stage is started on its own, as the workflow's compose job does."""
    work = CACHE / f"compose-{os.getpid()}"
    root = work / "mnt"
    root.mkdir(parents=True)
    secret = work / "jwt_secret"
    secret.write_text(SECRET)
    token = work / "token.jwt"
    write_token(token, "alice")
    env = dict(os.environ, CHROMAFS_MOUNT_ROOT=str(root), CHROMAFS_HOST_TOKEN_FILE=str(token),
               CHROMAFS_HOST_JWT_SECRET_FILE=str(secret), COMPOSE_PROJECT_NAME=COMPOSE_PROJECT)  # fmt: skip
    cli = compose_cli(engine)
    log(f"compose: {sh([*cli, 'version'], check=False).splitlines()[0] if cli else ''}")
    compose = [*cli, "-f", str(REPO / "docker" / "compose.yaml")]
    for name in ("agent", "chroma", "redis", "s3"):  # compose names them without the registry part
        sh([engine, "tag", image(name), f"chromafs-{name}:local"])
    sh([engine, "tag", image("chromafs"), "chromafs:local"])

    def step(*argv: str, timeout: float = 300) -> str:
        done = subprocess.run([*compose, *argv], env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise StackError(
                f"compose {' '.join(argv)}: exit {done.returncode}\n{(done.stderr or done.stdout)[-2000:]}"
            )
        return done.stdout

    def healthy(service: str) -> None:
        names = sh([engine, "ps", "--filter", f"label=com.docker.compose.service={service}", "--format", "{{.Names}}"])
        name = names.split()[0] if names.split() else service
        probe = [engine, "healthcheck", "run", name] if engine == "podman" else [
            "sh", "-c", f"test \"$(docker inspect -f '{{{{.State.Health.Status}}}}' {name})\" = healthy"]  # fmt: skip
        wait_for(service, probe, timeout_s=180)

    problems: list[str] = []
    started = time.monotonic()
    shared_mount_point(root)
    try:
        step("up", "-d", "--no-build", "chroma", "redis", "s3")
        for service in ("chroma", "redis", "s3"):
            healthy(service)
        step("run", "--rm", "ingest")
        step("up", "-d", "--no-build", "--no-deps", "chromafs")
        healthy("chromafs")
        if not os.path.ismount(root / "docs"):
            problems.append("compose: the daemon's mount did not reach the host")
        agent = step("run", "--rm", "--no-deps", "agent")
        if "refresh token" not in agent.lower() or "files this token can read:" not in agent:
            problems.append(f"compose: the agent did not read the docs: {agent[-500:]}")
        log(f"compose stack: ingest, mount and agent ok in {time.monotonic() - started:.0f}s")
    except StackError as exc:
        problems.append(str(exc))
    finally:
        try:
            step("down", "-v", "-t", "20", timeout=300)
        except (StackError, subprocess.TimeoutExpired) as exc:
            problems.append(f"compose down: {exc}")
        if os.path.ismount(root / "docs"):
            problems.append("compose: the daemon left its mount behind")
            sh(["umount", "-l", str(root / "docs")], check=False)
        sh(["umount", "-R", str(root)], check=False, quiet=True)
        left = compose_leftovers(engine)
        problems += [f"compose down left {item}" for item in left]
        remove_compose_leftovers(engine)
        problems += [f"compose: still left after removing it: {item}" for item in compose_leftovers(engine)]
        shutil.rmtree(work, ignore_errors=True)
    return {"compose_s": round(time.monotonic() - started, 1), "problems": problems}


def compose_leftovers(engine: str) -> list[str]:
    """The compose project's containers, networks and volumes (all named after the project)."""
    prefix = f"{COMPOSE_PROJECT}_"
    containers = sh([engine, "ps", "-a", "--filter", f"label=com.docker.compose.project={COMPOSE_PROJECT}",
                     "--format", "{{.Names}}"], check=False).split()  # fmt: skip
    containers += [n for n in sh([engine, "ps", "-a", "--format", "{{.Names}}"], check=False).split()
                   if n.startswith(prefix) and n not in containers]  # fmt: skip
    networks = [n for n in sh([engine, "network", "ls", "--format", "{{.Name}}"], check=False).split()
                if n.startswith(prefix)]  # fmt: skip
    volumes = [n for n in sh([engine, "volume", "ls", "--format", "{{.Name}}"], check=False).split()
               if n.startswith(prefix)]  # fmt: skip
    return [*(f"container {n}" for n in containers), *(f"network {n}" for n in networks),
            *(f"volume {n}" for n in volumes)]  # fmt: skip


def remove_compose_leftovers(engine: str) -> None:
    for item in compose_leftovers(engine):
        kind, name = item.split(" ", 1)
        if kind == "container":
            sh([engine, "rm", "-f", "-v", name], check=False, quiet=True)
    for item in compose_leftovers(engine):
        kind, name = item.split(" ", 1)
        if kind in ("network", "volume"):
            sh([engine, kind, "rm", name], check=False, quiet=True)
