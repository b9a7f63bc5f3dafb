"""scripts/containers: chromafs's container stack, run for real with podman or docker.

1. An engine: docker if its daemon answers, else rootful podman (installed from apt if
   missing, configured for a host without systemd: cgroupfs, runc, a file event log, ulimits
   no higher than this machine allows).
2. A base: the Dockerfiles' public defaults when a registry answers; else a Debian bookworm
   base made here with mmdebstrap and imported (cached in /var/tmp/chromafs-containers).
3. Every image: chromafs, the agent, Chroma (`chroma run`), Redis, S3 (moto) [, the tests].
4. The stack of docker/compose.yaml, service by service, health polled by this script: the
   services share one network namespace and talk on 127.0.0.1 (no DNS plugin is needed).
   The bundled sample site is ingested; `chromafs-mountd` (root, /dev/fuse, SYS_ADMIN) serves
   a session for each of two tokens on a host directory shared into the agents.
5. A bash agent container per session (non-root, no network, read-only root, the docs
   read-only): a scripted agent session whose file list must be exactly its token's pages,
   and whose write must fail.
6. Teardown, then a check that no container, mount or process is left.
With --tests, the integration tests then run inside a container with /dev/fuse.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # re-run with the repository's .venv Python before importing from it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from repo_venv import use_repo_venv

    use_repo_venv()

import jwt

REPO = Path(__file__).resolve().parent.parent
SAMPLE_SITE = REPO / "chromafs_fuse" / "sample_site"
CACHE = Path("/var/tmp/chromafs-containers")
LOCAL_BASE = "localhost/chromafs-base:bookworm"
REGISTRY_PROBE = "docker.io/library/debian:bookworm-slim"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# dnsname: compose's service names resolve on podman's CNI networks; catatonit: `init: true`
PODMAN_PACKAGES = [
    "podman", "runc", "fuse-overlayfs", "slirp4netns", "uidmap", "mmdebstrap",
    "golang-github-containernetworking-plugin-dnsname", "catatonit",
]  # fmt: skip
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONF_MARK = "# written by chromafs scripts/containers"
P = "chromafs-demo"  # every container this script starts is named P-...
SITE = "acme"
SECRET = "containers-demo-secret-0123456789abcdef"
USERS = {"alice": ["billing"], "bob": []}  # bob: signed in, in no group
# name -> (Dockerfile, build context)
IMAGES = {
    "chromafs": ("docker/Dockerfile", "."),
    "agent": ("docker/Dockerfile.agent", "docker"),
    "chroma": ("docker/Dockerfile.chroma", "docker"),
    "redis": ("docker/Dockerfile.redis", "docker"),
    "s3": ("docker/Dockerfile.s3", "docker"),
    "test": ("docker/Dockerfile.test", "."),
}
BACKEND = [
    "--chroma-url", "http://127.0.0.1:8000", "--redis-url", "redis://127.0.0.1:6379/0",
    "--s3-endpoint-url", "http://127.0.0.1:5000",
]  # fmt: skip
S3_ENV = [
    "-e", "AWS_ENDPOINT_URL=http://127.0.0.1:5000", "-e", "AWS_ACCESS_KEY_ID=test",
    "-e", "AWS_SECRET_ACCESS_KEY=test", "-e", "AWS_DEFAULT_REGION=us-east-1",
]  # fmt: skip
STARTED = time.monotonic()


class StackError(Exception):
    pass


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


def sh(argv: list[str], check: bool = True, timeout: float | None = None, quiet: bool = False) -> str:
    """Run a command; its stdout. A failure raises StackError with its stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{' '.join(argv[:4])} ...: no answer in {timeout:.0f}s") from exc
    if check and done.returncode != 0:
        raise StackError(f"{' '.join(argv)}: exit {done.returncode}\n{(done.stderr or done.stdout)[-3000:]}")
    if not quiet and done.returncode != 0:
        log(f"({' '.join(argv[:3])} ...: exit {done.returncode})")
    return done.stdout


# -- 1. the engine -----------------------------------------------------------------------


def machine_limits() -> tuple[int, int]:
    """The highest nofile and nproc a container may ask for here: the hard limits, and no more
    processes than there are pids."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    cap = 1 << 20
    nofile = cap if nofile == resource.RLIM_INFINITY else min(nofile, cap)
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    return nofile, nproc


def configure_podman() -> None:
    """Rootful podman without systemd on a hybrid cgroup layout needs cgroupfs, runc (crun
    refuses the layout), a file event log, and ulimits it is allowed to set. An existing
    configuration that this script did not write is left alone."""
    if CONTAINERS_CONF.exists() and CONF_MARK not in CONTAINERS_CONF.read_text():
        log(f"keeping {CONTAINERS_CONF} as it is")
        return
    nofile, nproc = machine_limits()
    CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
    CONTAINERS_CONF.write_text(
        f"{CONF_MARK}\n[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n\n'
        '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n'
    )


def pick_engine(wanted: str | None) -> str:
    if wanted in (None, "docker") and shutil.which("docker"):
        with contextlib.suppress(StackError):
            sh(["docker", "info"], timeout=20)
            return "docker"
    if wanted == "docker":
        raise StackError("docker was asked for, but its daemon does not answer")
    if (
        not shutil.which("podman")
        or not shutil.which("mmdebstrap")
        or not Path("/usr/libexec/podman/catatonit").exists()
        or not Path("/usr/lib/cni/dnsname").exists()
    ):
        log(f"installing {' '.join(PODMAN_PACKAGES)} from apt")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PODMAN_PACKAGES],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    configure_podman()
    sh(["podman", "info"], timeout=60)
    return "podman"


# -- 2. the base and 3. the images ----------------------------------------------------------


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
    took: dict[str, float] = {}
    for name in names:
        dockerfile, context = IMAGES[name]
        argv = [engine, "build", "-q", "-f", dockerfile, "-t", f"localhost/chromafs-{name}:local"]
        if base:
            argv += ["--build-arg", f"BASE={base}"]
        if engine == "podman":
            argv += ["--format", "docker"]  # keeps HEALTHCHECK
            if base and HOST_CA.exists():
                # this machine's CA bundle (a TLS-inspecting proxy's CA may be in it) for apt and pip
                argv += ["--volume", f"{HOST_CA}:{HOST_CA}:ro"]
        started = time.monotonic()
        sh([*argv, context], timeout=1800)
        took[name] = round(time.monotonic() - started, 1)
        log(f"built chromafs-{name} in {took[name]:.0f}s")
    return took


# -- 4. the stack --------------------------------------------------------------------------


def image(name: str) -> str:
    return f"localhost/chromafs-{name}:local"


def wait_for(what: str, check: list[str], timeout_s: float = 120) -> float:
    started = time.monotonic()
    while True:
        if subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise StackError(f"{what} did not become healthy in {timeout_s:.0f}s")
        time.sleep(0.5)


def visible_files(groups: list[str] | None) -> set[str]:
    """The sample site's files a reader with these groups may read, by the ingest's own scan
    (None: anonymous)."""
    from chromafs_fuse.ingest.scan import ScanOptions, scan_site

    files = scan_site(ScanOptions(SAMPLE_SITE)).files
    return {
        f.key
        for f in files
        if f.access.is_public or (groups is not None and (not f.access.groups or set(f.access.groups) & set(groups)))
    }


def shared_mount_point(path: Path) -> None:
    """Make `path` a shared mount point of its own: a mount the daemon's container makes under
    it then reaches the host and every container that binds it (a bind of a directory that is
    not on a shared mount silently stays private)."""
    sh(["mount", "--bind", str(path), str(path)])
    sh(["mount", "--make-rshared", str(path)])


def write_token(path: Path, user: str) -> None:
    """A session token of one of USERS, valid for an hour, signed with SECRET."""
    claims = {"sub": user, "site": SITE, "groups": USERS[user], "exp": int(time.time()) + 3600}
    path.write_text(jwt.encode(claims, SECRET, algorithm="HS256"))


AGENT_SESSION = r"""
set -u
cd /docs
echo "== ls"; ls
echo "== files"; find . -type f | sed 's|^\./||' | sort | sed 's/^/FILE /'
echo "== cd, grep -rn"; cd guides && grep -rn "deploy" . | head -3; cd /docs
echo "== rg"; rg -l -i "token" . | head -5
echo "== cat, head"; head -5 index.mdx; cat quickstart.mdx | wc -l
echo "== jq"; jq -r '.paths | keys[]' openapi/openapi.json | head -5
echo "== an image (a lazy file, from the blob store)"; echo "IMAGE-BYTES $(wc -c < images/logo.png)"
echo "== write"
if touch /docs/new.md 2>/tmp/write-error; then echo "WRITE-ALLOWED"
else echo "WRITE-REFUSED $(cat /tmp/write-error)"; fi
echo "== reach"
if ls /run/chromafs 2>/dev/null; then echo "SEES-RUN-CHROMAFS"; fi
if (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null; then echo "REACHES-CHROMA"; fi
echo "DONE"
"""


def check_agent(user: str, output: str, expected: set[str]) -> list[str]:
    problems = []
    seen = {line[5:] for line in output.splitlines() if line.startswith("FILE ")}
    if seen != expected:
        problems.append(f"{user}: saw {len(seen)} files, expected {len(expected)}: "
                        f"extra {sorted(seen - expected)[:5]}, missing {sorted(expected - seen)[:5]}")  # fmt: skip
    image = (SAMPLE_SITE / "images" / "logo.png").stat().st_size
    if f"IMAGE-BYTES {image}" not in output:
        problems.append(f"{user}: images/logo.png did not read whole ({image} bytes)")
    if "WRITE-REFUSED" not in output or "Read-only file system" not in output:
        problems.append(f"{user}: a write was not refused with EROFS")
    for leak in ("SEES-RUN-CHROMAFS", "REACHES-CHROMA"):
        if leak in output:
            problems.append(f"{user}: {leak}")
    if "DONE" not in output:
        problems.append(f"{user}: the agent session did not finish")
    return problems


class Stack:
    def __init__(self, engine: str, work: Path) -> None:
        self.engine = engine
        self.work = work
        self.sessions = work / "sessions"  # shared: the daemon's binds reach the agents through it
        self.secrets = work / "secrets"
        self.started: list[str] = []
        self.figures: dict[str, float] = {}

    def run(self, name: str, argv: list[str], detach: bool = True) -> str:
        full = [self.engine, "run", "--name", f"{P}-{name}", *(["-d"] if detach else ["--rm"]), *argv]
        if detach:
            self.started.append(f"{P}-{name}")
        return sh(full, timeout=600)

    def exec(self, name: str, *argv: str) -> str:
        return sh([self.engine, "exec", f"{P}-{name}", *argv], timeout=300)

    def up(self) -> None:
        self.secrets.mkdir(parents=True)
        (self.secrets / "jwt_secret").write_text(SECRET)
        for user in USERS:
            write_token(self.secrets / f"{user}.jwt", user)
        self.sessions.mkdir()
        shared_mount_point(self.sessions)
        started = time.monotonic()
        net = ["--network", f"container:{P}-net"]
        # The stack's network namespace: loopback only. The services talk on 127.0.0.1 and
        # nothing outside the stack reaches them (publish Chroma's port only to trusted hosts).
        self.run("net", ["--network", "none", "--entrypoint", "sleep", image("redis"), "infinity"])
        self.run("chroma", [*net, image("chroma")])
        self.run("redis", [*net, "--entrypoint", "redis-server", image("redis"), "--bind", "127.0.0.1",
                           "--save", "", "--appendonly", "no"])  # fmt: skip
        self.run("s3", [*net, image("s3")])
        py = "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)"
        for name, check in (
            ("chroma", ["/opt/chroma/bin/python", "-c", py, "http://127.0.0.1:8000/api/v2/heartbeat"]),
            ("redis", ["redis-cli", "ping"]),
            ("s3", ["/opt/moto/bin/python", "-c", py, "http://127.0.0.1:5000/moto-api/"]),
        ):
            waited = wait_for(name, [self.engine, "exec", f"{P}-{name}", *check])
            log(f"{name} healthy after {waited:.1f}s")
        self.figures["backends_up_s"] = round(time.monotonic() - started, 1)
        ingest = (
            "import boto3, os, sys; boto3.client('s3').create_bucket(Bucket='docs'); "
            "os.execvp('chromafs-ingest', ['chromafs-ingest', *sys.argv[1:]])"
        )
        started = time.monotonic()
        self.run("ingest", [*net, *S3_ENV, "-v", f"{SAMPLE_SITE}:/site:ro", "--entrypoint", "/opt/chromafs/bin/python",
                            image("chromafs"), "-c", ingest, "/site", "--site", SITE, *BACKEND,
                            "--blob-store", f"s3://docs/{SITE}"], detach=False)  # fmt: skip
        self.figures["ingest_s"] = round(time.monotonic() - started, 1)
        log(f"sample site ingested in {self.figures['ingest_s']:.1f}s")
        self.run("mountd", [*net, *S3_ENV, "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
                            "--security-opt", "apparmor=unconfined",
                            "-v", f"{self.sessions}:/sessions:rshared", "-v", f"{self.secrets}:/run/secrets:ro",
                            "--entrypoint", "chromafs-mountd", image("chromafs"), "--socket",
                            "/run/chromafs/mountd.sock", "--class-root", "/run/chromafs/classes"])  # fmt: skip
        wait_for("chromafs-mountd", [self.engine, "exec", f"{P}-mountd", "test", "-S", "/run/chromafs/mountd.sock"])

    def open_session(self, user: str) -> float:
        started = time.monotonic()
        self.exec("mountd", "mkdir", "-p", f"/sessions/{user}")
        self.exec("mountd", "chromafs-mount", f"/sessions/{user}", "--site", SITE, *BACKEND,
                  "--mountd", "/run/chromafs/mountd.sock", "--token-file", f"/run/secrets/{user}.jwt",
                  "--jwt-secret-file", "/run/secrets/jwt_secret", "-o", "allow_other")  # fmt: skip
        took = time.monotonic() - started
        if not os.path.ismount(self.sessions / user):
            raise StackError(f"{user}'s session did not reach the host at {self.sessions / user}")
        return took

    def agent(self, user: str) -> str:
        return self.run(f"agent-{user}", ["--network", "none", "--user", "65534:65534", "--read-only",
                                          "--tmpfs", "/tmp", "--cap-drop", "ALL",
                                          "-v", f"{self.sessions / user}:/docs:ro,rslave",
                                          image("agent"), "bash", "-c", AGENT_SESSION], detach=False)  # fmt: skip

    def down(self) -> list[str]:
        """Tear everything down; what was left behind, if anything."""
        for user in USERS:
            path = self.sessions / user
            if os.path.ismount(path):
                sh(["umount", str(path)], check=False)
        for name in reversed(self.started):
            sh([self.engine, "rm", "-f", "-t", "10", name], check=False, timeout=120, quiet=True)
        with contextlib.suppress(StackError):
            sh(["umount", "-R", str(self.sessions)], check=False, quiet=True)
        left = [f"container {name}" for name in sh([self.engine, "ps", "-a", "--format", "{{.Names}}"]).split()
                if name.startswith(P)]  # fmt: skip
        mounts = Path("/proc/self/mountinfo").read_text()
        left += [f"mount {line.split()[4]}" for line in mounts.splitlines() if str(self.work) in line.split()[4]]
        stray = sh(["pgrep", "-af", "chromafs-mount|chroma run|moto_server"], check=False, quiet=True)
        left += [f"process {line}" for line in stray.splitlines() if "/sessions/" in line or "127.0.0.1" in line]
        return left


def run_stack(engine: str) -> dict[str, object]:
    work = CACHE / f"run-{os.getpid()}"
    stack = Stack(engine, work)
    problems: list[str] = []
    try:
        stack.up()
        for user in USERS:
            took = stack.open_session(user)
            log(f"{user}'s session mounted in {took * 1000:.0f} ms")
            stack.figures[f"session_{user}_s"] = round(took, 3)
        for user, groups in USERS.items():
            started = time.monotonic()
            output = stack.agent(user)
            stack.figures[f"agent_{user}_s"] = round(time.monotonic() - started, 1)
            expected = visible_files(groups)
            found = check_agent(user, output, expected)
            problems += found
            log(f"{user}'s agent: {len(expected)} files expected; {'ok' if not found else '; '.join(found)}")
        if visible_files(USERS["alice"]) == visible_files(USERS["bob"]):
            problems.append("the two tokens see the same files: the check proves nothing")
    finally:
        left = stack.down()
        shutil.rmtree(work, ignore_errors=True)
    problems += [f"left behind: {item}" for item in left]
    return {"figures": stack.figures, "problems": problems}


def compose_cli(engine: str) -> list[str]:
    """`docker compose`, or podman-compose (PyPI) in a venv of its own: podman 4.3 has no compose."""
    if engine == "docker":
        return ["docker", "compose"]
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
               CHROMAFS_HOST_JWT_SECRET_FILE=str(secret), COMPOSE_PROJECT_NAME=f"{P}-compose")  # fmt: skip
    compose = [*compose_cli(engine), "-f", str(REPO / "docker" / "compose.yaml")]
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
        with contextlib.suppress(StackError, subprocess.TimeoutExpired):
            step("down", "-v", "-t", "20", timeout=300)
        if os.path.ismount(root / "docs"):
            problems.append("compose: the daemon left its mount behind")
            sh(["umount", "-l", str(root / "docs")], check=False)
        sh(["umount", "-R", str(root)], check=False, quiet=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"compose_s": round(time.monotonic() - started, 1), "problems": problems}


def run_tests(engine: str) -> dict[str, object]:
    """The integration tests inside a container with /dev/fuse (root, SYS_ADMIN)."""
    started = time.monotonic()
    # this machine's CA bundle: a few tests install an old chromadb with pip
    trust = ["-v", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
    done = subprocess.run(
        [engine, "run", "--rm", "--name", f"{P}-tests", "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
         "--security-opt", "apparmor=unconfined", *trust, image("test"), "scripts/test"],
        check=False,
    )  # fmt: skip
    took = round(time.monotonic() - started, 1)
    return {"tests_in_container_s": took, "problems": [] if done.returncode == 0 else [f"tests failed ({took}s)"]}


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/containers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["docker", "podman"], help="default: docker if it answers, else podman")
    parser.add_argument("--tests", action="store_true", help="also run the integration tests in a container")
    parser.add_argument("--no-stack", action="store_true", help="only the images (and --tests)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--if-possible", action="store_true", help="exit 0 with a note when no engine or base image can be set up"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("scripts/containers: run as root (FUSE mounts, mount propagation, rootful containers)", file=sys.stderr)
        return 1
    result: dict[str, object] = {"problems": []}
    try:
        try:
            engine = pick_engine(args.engine)
            log(f"engine: {sh([engine, '--version']).strip()}")
            base = None if registry_answers(engine) else local_base(engine)
        except (StackError, subprocess.CalledProcessError, OSError) as exc:
            if not args.if_possible:
                raise StackError(f"no container engine and base image: {exc}") from exc
            log(f"skipping the containers: no engine and base image can be set up here: {exc}")
            return 0
        log(f"base: {base or 'the Dockerfiles defaults (a registry answers)'}")
        names = [n for n in IMAGES if n != "test" or args.tests]
        if args.no_stack:
            names = ["test"] if args.tests else []
        result["build_s"] = build_images(engine, names, base)
        if not args.no_stack:
            result.update(run_stack(engine))
            compose = run_compose(engine)
            result["compose_s"] = compose["compose_s"]
            result["problems"] = [*result.get("problems", []), *compose["problems"]]  # type: ignore[misc]
        if args.tests:
            tests = run_tests(engine)
            result["tests_in_container_s"] = tests["tests_in_container_s"]
            result["problems"] = [*result.get("problems", []), *tests["problems"]]  # type: ignore[misc]
    except StackError as exc:
        result["problems"] = [*result.get("problems", []), str(exc)]  # type: ignore[misc]
    result["total_s"] = round(time.monotonic() - STARTED, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    problems = result.get("problems") or []
    for problem in problems:  # type: ignore[union-attr]
        log(f"PROBLEM: {problem}")
    log(f"{'failed' if problems else 'all checks passed'} in {result['total_s']:.0f}s: {json.dumps(result)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
