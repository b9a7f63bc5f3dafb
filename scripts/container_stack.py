"""scripts/containers: chromafs's container stack, run for real with podman or docker.

1. An engine: docker if its daemon answers, else rootful podman (installed from apt if
   missing, configured for a host without systemd: cgroupfs, runc, a file event log, ulimits
   no higher than this machine allows). `--engine docker` where no daemon answers: Debian's
   docker.io from apt, and dockerd started under systemd, or else as a child of this script
   that it stops at the end, putting iptables, ip_forward and the bridge back as they were.
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
6. Teardown, then a check that no container, volume, network, mount or process is left.
7. docker/compose.yaml as a user runs it: `docker compose` (v2), else Debian's docker-compose
   1.29 (v1, from apt), or podman-compose (PyPI) with podman.
With --tests, the integration tests then run inside a container with /dev/fuse.
Every build gets this machine's CA bundle as a file of its context (docker/build-ca/), so pip
passes a TLS-inspecting proxy with docker or podman, BuildKit on or off. A run killed halfway
leaves containers that the next run removes first (and a dockerd of its own that it adopts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
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
# where the builds find HOST_CA: a file of their context (docker/build-ca/README.md)
BUILD_CA = REPO / "docker" / "build-ca" / "host-ca-bundle.crt"
# Debian's docker: dockerd, containerd, runc, tini (docker-init), iptables; mmdebstrap for the base
DOCKER_PACKAGES = ["docker.io", "mmdebstrap"]
# dockerd started by this script: its pid file and what the firewall was before it started. In
# /run, like dockerd itself: a run killed halfway leaves them for the next run, which adopts the
# daemon, stops it at its end and restores the firewall from the snapshot.
STATE = Path("/run/chromafs-containers")
DOCKERD_PID = STATE / "dockerd.pid"
FIREWALL = STATE / "firewall.json"
LABEL = "org.chromafs.containers"  # on every container this script starts
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


def apt_install(packages: list[str]) -> None:
    log(f"installing {' '.join(packages)} from apt")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def answers(argv: list[str], timeout: float = 20) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# The firewall dockerd changes: the nat and filter tables (its DOCKER* chains, MASQUERADE,
# FORWARD's policy), ip_forward, and the docker0 bridge. Snapshot before it starts, put back
# after it stops.
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables")
BUILTIN_CHAINS = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}


def iptables_tables(text: str) -> dict[str, str]:
    """iptables-save's output, table by table (each from `*table` to `COMMIT`)."""
    tables: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:].strip(), [])
        if current is not None and line.strip() and not line.startswith("#"):
            current.append(line.strip())
        if line.strip() == "COMMIT":
            current = None
    return {name: "\n".join(lines) + "\n" for name, lines in tables.items()}


def iptables_rules(text: str) -> dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]:
    """The rules of iptables-save's output, without counters: table -> (chains with their
    policies, rules). A table with only its built-in chains, accepting, and no rule counts as
    no table (iptables-restore cannot delete a table)."""
    out = {}
    for name, section in iptables_tables(text).items():
        chains = tuple(sorted(tuple(line[1:].split()[:2]) for line in section.splitlines() if line.startswith(":")))
        rules = tuple(line for line in section.splitlines() if line.startswith("-"))
        builtin = BUILTIN_CHAINS.get(name, ())
        if rules or any(chain not in builtin or policy != "ACCEPT" for chain, policy in chains):
            out[name] = (chains, rules)
    return out


def empty_table(name: str) -> str:
    return f"*{name}\n" + "".join(f":{chain} ACCEPT [0:0]\n" for chain in BUILTIN_CHAINS.get(name, ())) + "COMMIT\n"


def firewall_snapshot() -> dict[str, object]:
    tables = {tool: sh([f"{tool}-save"], check=False, quiet=True) for tool in ("iptables", "ip6tables")
              if shutil.which(f"{tool}-save")}  # fmt: skip
    proc = Path("/proc/sys")
    sysctls = {key: (proc / key).read_text().strip() for key in SYSCTLS if (proc / key).exists()}
    links = sorted(os.listdir("/sys/class/net"))
    # (os.path.ismount misses /run/netns: CNI binds it onto itself, on the same filesystem)
    return {"tables": tables, "sysctls": sysctls, "links": links, "netns_mount": bool(mounts_under(("/run/netns",)))}


# the bridges engines make: docker's, and podman's CNI networks (one per network, cni-podmanN)
ENGINE_LINKS = ("docker0", "br-", "veth", "cni-podman")


def restore_firewall(before: dict[str, object], who: str = "dockerd started") -> list[str]:
    """Put the firewall back as `before` had it (iptables, ip6tables, the engines' bridges,
    ip_forward, and the /run/netns mount CNI makes); what could not be."""
    problems = []
    for tool, text in before["tables"].items():  # type: ignore[attr-defined]
        now = sh([f"{tool}-save"], check=False, quiet=True)
        if iptables_rules(now) == iptables_rules(text):
            continue
        was = iptables_tables(text)
        script = "".join(was.get(name) or empty_table(name) for name in sorted(set(iptables_tables(now)) | set(was)))
        done = subprocess.run([f"{tool}-restore"], input=script, capture_output=True, text=True, check=False)
        after = sh([f"{tool}-save"], check=False, quiet=True)
        if done.returncode != 0 or iptables_rules(after) != iptables_rules(text):
            problems.append(f"{tool} is not as it was before {who}: {done.stderr.strip()[-300:]}")
        else:
            log(f"{tool}: the rules are as they were before {who}")
    for link in sorted(set(os.listdir("/sys/class/net")) - set(before["links"])):  # type: ignore[arg-type]
        if link.startswith(ENGINE_LINKS):
            sh(["ip", "link", "delete", link], check=False)
    if before.get("netns_mount") is False and mounts_under(("/run/netns",)) and not os.listdir("/run/netns"):
        sh(["umount", "/run/netns"], check=False)
    for key, value in before["sysctls"].items():  # type: ignore[attr-defined]
        path = Path("/proc/sys") / key
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value + "\n")
    left = sorted(set(os.listdir("/sys/class/net")) - set(before["links"]))  # type: ignore[arg-type]
    problems += [f"network interface {link} is left" for link in left]
    return problems


def pid_alive(pid: int) -> bool:
    try:
        return "dockerd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


class DockerDaemon:
    """A dockerd this script started (a child, or a docker.service it started under systemd):
    stopped at the end of the run, with the firewall put back as it was before."""

    def __init__(self, pid: int | None, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid  # None: systemd's docker.service
        self.proc = proc

    @classmethod
    def adopt(cls) -> DockerDaemon | None:
        """The dockerd of a run killed halfway, if it still runs: this run stops it."""
        try:
            text = DOCKERD_PID.read_text().strip()
        except OSError:
            return None
        if not FIREWALL.exists() or not (text.isdigit() or text == "systemd"):
            return None
        if text == "systemd":
            log("a previous run started docker.service: this run stops it at its end")
            return cls(None)
        pid = int(text)
        if not pid_alive(pid):
            return cls(pid)  # gone: only the firewall is left to restore (stop() does)
        log(f"a previous run's dockerd (pid {pid}) still runs: this run stops it at its end")
        return cls(pid)

    @classmethod
    def start(cls) -> DockerDaemon | None:
        """dockerd, under systemd or as a child; None when installing docker.io started its own
        service (an init script), which is then left running."""
        if not shutil.which("dockerd"):
            apt_install(DOCKER_PACKAGES)
            if answers(["docker", "info"]):
                log("docker.io's own service started dockerd: using it, and leaving it running")
                return None
        STATE.mkdir(parents=True, exist_ok=True)
        if not FIREWALL.exists():
            FIREWALL.write_text(json.dumps(firewall_snapshot()))
        if Path("/run/systemd/system").is_dir():
            log("starting docker.service (systemd)")
            sh(["systemctl", "start", "docker.service"], timeout=120)
            DOCKERD_PID.write_text("systemd\n")
            daemon = cls(None)
        else:
            CACHE.mkdir(parents=True, exist_ok=True)
            log_file = (CACHE / "dockerd.log").open("ab")
            proc = subprocess.Popen(  # its own session: a ^C to this script does not reach it
                ["dockerd", "--pidfile", str(DOCKERD_PID)], stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            log_file.close()
            daemon = cls(proc.pid, proc)
            log(f"started dockerd as a child (pid {proc.pid}, log {CACHE / 'dockerd.log'})")
        started = time.monotonic()
        while not answers(["docker", "info"], timeout=10):
            if daemon.proc is not None and daemon.proc.poll() is not None:
                tail = (CACHE / "dockerd.log").read_text(errors="replace")[-1500:]
                daemon.stop()
                raise StackError(f"dockerd exited {daemon.proc.returncode}:\n{tail}")
            if time.monotonic() - started > 90:
                daemon.stop()
                raise StackError("dockerd did not answer in 90 s")
            time.sleep(0.5)
        log(f"dockerd answers after {time.monotonic() - started:.1f}s")
        return daemon

    def stop(self) -> list[str]:
        """Stop it, put the firewall back; what is left that should not be."""
        problems: list[str] = []
        if self.pid is None:
            sh(["systemctl", "stop", "docker.service", "docker.socket"], check=False, timeout=120)
        elif pid_alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while pid_alive(self.pid) and time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    break
                time.sleep(0.2)
            if pid_alive(self.pid):
                problems.append(f"dockerd (pid {self.pid}) did not stop in 60 s: killed")
                os.kill(self.pid, signal.SIGKILL)
            if self.proc is not None:
                self.proc.wait(timeout=30)
            log("dockerd stopped")
        # its containerd (dockerd starts one of its own without systemd) and shims end with it
        deadline = time.monotonic() + 30
        while (stray := docker_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        problems += [f"process {line}" for line in stray]
        for mount in mounts_under(("/run/docker", "/var/run/docker", "/var/lib/docker")):
            sh(["umount", "-l", mount], check=False)
            log(f"unmounted {mount}, which dockerd left")
        try:
            before = json.loads(FIREWALL.read_text())
        except (OSError, ValueError):
            before = None
        if before is not None:
            problems += restore_firewall(before)
        for path in (FIREWALL, DOCKERD_PID):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            STATE.rmdir()
        return problems


def docker_processes() -> list[str]:
    """dockerd, the containerd it starts (its configuration is under /var/run/docker) and the
    shims of its containers (namespace moby)."""
    lines = []
    for pattern in ("^dockerd$", "^containerd$", "^containerd-shim"):
        lines += sh(["pgrep", "-a", pattern], check=False, quiet=True).splitlines()
    return [line for line in lines if "dockerd" in line.split()[1] or "/var/run/docker/" in line or " moby" in line]


def mounts_under(roots: tuple[str, ...]) -> list[str]:
    """Mount points under these directories, deepest first."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if any(p == r or p.startswith(r + "/") for r in roots)), key=len, reverse=True)


DAEMON: DockerDaemon | None = None  # a dockerd this run started or adopted: stopped at its end


def pick_engine(wanted: str | None) -> str:
    """docker when it is asked for (set up here if need be) or answers; else podman."""
    global DAEMON
    if wanted in (None, "auto", "docker"):
        DAEMON = DockerDaemon.adopt()
        if answers(["docker", "info"]):
            return "docker"
        if DAEMON is not None and wanted != "docker":  # a killed run's daemon, gone: tidy up
            for problem in DAEMON.stop():
                log(f"note: {problem}")
            DAEMON = None
    if wanted == "docker":
        if DAEMON is not None:
            DAEMON.stop()
        DAEMON = DockerDaemon.start()
        return "docker"
    if (
        not shutil.which("podman")
        or not shutil.which("mmdebstrap")
        or not Path("/usr/libexec/podman/catatonit").exists()
        or not Path("/usr/lib/cni/dnsname").exists()
    ):
        apt_install(PODMAN_PACKAGES)
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


# An agent living through the crash of the process serving its session. It receives the session
# as platforms that survive such a crash hand it over: a directory above the session's mountpoint
# (here the user's own), bound read-only with rslave propagation, so that the session bound again
# reaches it. Its working directory is inside the session when the serving process is killed;
# once told (/tmp/go), it asks that directory (statfs always reaches the serving process) and
# then the session again by its path.
CRASH_AGENT = r"""
set -u
cd /session/docs/guides
stat -f . >/dev/null && echo "BEFORE-OK"
until [ -e /tmp/go ]; do sleep 0.1; done
if stat -f . >/dev/null 2>/tmp/err; then echo "OLD-CWD-ANSWERS"; else echo "OLD-CWD-FAILS $(cat /tmp/err)"; fi
cd /session/docs && stat -f . >/dev/null && echo "PATH-ANSWERS $(wc -c < quickstart.mdx)"
echo "DONE"
sleep infinity
"""


# (the image has no pkill) every process titled as a serving process, SIGKILL
KILL_SERVING_PROCESSES = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().startswith(b"chromafs-shared "):
                os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
"""


def check_crash_agent(user: str, output: str) -> list[str]:
    """What the crash agent must have seen: its old working directory on the dead mount fails
    with ENOTCONN; /docs by path, a bind propagated to it (rslave), reads the new mount."""
    size = (SAMPLE_SITE / "quickstart.mdx").stat().st_size
    wanted = ["BEFORE-OK", "OLD-CWD-FAILS", "Transport endpoint is not connected", f"PATH-ANSWERS {size}", "DONE"]
    return [f"{user}'s agent through the crash: no {w!r} in {output!r}" for w in wanted if w not in output]


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
        self.volumes: list[str] = []  # the anonymous volumes of the containers (Chroma's /data)
        self.figures: dict[str, float] = {}

    def run(self, name: str, argv: list[str], detach: bool = True) -> str:
        full = [self.engine, "run", "--name", f"{P}-{name}", "--label", f"{LABEL}=stack",
                *(["-d"] if detach else ["--rm"]), *argv]  # fmt: skip
        if detach:
            self.started.append(f"{P}-{name}")
        out = sh(full, timeout=600)
        if detach:
            self.volumes += volumes_of(self.engine, f"{P}-{name}")
        return out

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
        # CHROMAFS_MOUNTD_SOCKET: the image's health check probes mountd's socket (docker/healthcheck.py)
        self.run("mountd", [*net, *S3_ENV, "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
                            "--security-opt", "apparmor=unconfined", "-e", f"CHROMAFS_MOUNTD_SOCKET={MOUNTD_SOCKET}",
                            "-v", f"{self.sessions}:/sessions:rshared", "-v", f"{self.secrets}:/run/secrets:ro",
                            "--entrypoint", "chromafs-mountd", image("chromafs"), "--socket",
                            MOUNTD_SOCKET, "--class-root", "/run/chromafs/classes"])  # fmt: skip
        wait_for("chromafs-mountd", [self.engine, "exec", f"{P}-mountd", *HEALTHCHECK])

    def mountd_health(self) -> str | None:
        """The engine's own view of the mountd container's health: None when healthy. docker
        runs the image's HEALTHCHECK itself; podman without systemd runs it when asked."""
        name = f"{P}-mountd"
        if self.engine == "podman":
            done = subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, text=True, check=False)
            return None if done.returncode == 0 else f"podman healthcheck run {name}: {done.stdout}{done.stderr}"
        deadline = time.monotonic() + 30
        while True:
            status = sh(["docker", "inspect", "-f", "{{.State.Health.Status}}", name], check=False).strip()
            if status == "healthy":
                return None
            if time.monotonic() > deadline:
                log_ = sh(["docker", "inspect", "-f", "{{json .State.Health.Log}}", name], check=False)
                return f"docker says {name} is {status}: {log_[-400:]}"
            time.sleep(1)

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

    def crash(self, user: str) -> tuple[float, list[str]]:
        """Kill (SIGKILL) every serving process of the mount server while an agent of `user`
        works in a session of its own: (seconds until the session answers again at its path,
        problems)."""
        name = f"agent-crash-{user}"
        self.exec("mountd", "mkdir", "-p", f"/sessions/crash-{user}/docs")
        self.exec("mountd", "chromafs-mount", f"/sessions/crash-{user}/docs", "--site", SITE, *BACKEND,
                  "--mountd", MOUNTD_SOCKET, "--token-file", f"/run/secrets/{user}.jwt",
                  "--jwt-secret-file", "/run/secrets/jwt_secret")  # fmt: skip
        self.run(name, ["--network", "none", "--user", "65534:65534", "--read-only", "--tmpfs", "/tmp",
                        "--cap-drop", "ALL", "-v", f"{self.sessions / f'crash-{user}'}:/session:ro,rslave",
                        image("agent"), "bash", "-c", CRASH_AGENT])  # fmt: skip
        logs = [self.engine, "logs", f"{P}-{name}"]
        deadline = time.monotonic() + 60
        while "BEFORE-OK" not in sh(logs, check=False):
            if time.monotonic() > deadline:
                return 0.0, [f"{user}'s crash agent never started: {sh(logs, check=False)[-300:]}"]
            time.sleep(0.2)
        self.exec("mountd", "/opt/chromafs/bin/python", "-c", KILL_SERVING_PROCESSES)
        killed = time.monotonic()
        probe = [self.engine, "exec", f"{P}-mountd", "stat", "-f", f"/sessions/crash-{user}/docs"]
        while subprocess.run(probe, capture_output=True).returncode == 0 and time.monotonic() - killed < 5:
            time.sleep(0.05)  # until the old mount stops answering (a kill that missed: the agent says so)
        while subprocess.run(probe, capture_output=True).returncode != 0:
            if time.monotonic() - killed > 30:
                return 0.0, [f"{user}'s session did not answer again within 30 s of the crash"]
            time.sleep(0.05)
        took = time.monotonic() - killed
        self.exec(name, "touch", "/tmp/go")
        deadline = time.monotonic() + 30
        while "DONE" not in (output := sh(logs, check=False)) and time.monotonic() < deadline:
            time.sleep(0.2)
        # (lazily: the agent's working directory is inside until its container goes)
        self.exec("mountd", "umount", "-l", f"/sessions/crash-{user}/docs")
        return took, check_crash_agent(user, output)

    def down(self) -> list[str]:
        """Tear everything down, say what was removed; what was left behind, if anything."""
        left: list[str] = []
        for user in USERS:
            path = self.sessions / user
            if os.path.ismount(path):
                sh(["umount", str(path)], check=False)
        left += remove_containers(self.engine, list(reversed(self.started)), self.volumes)
        with contextlib.suppress(StackError):
            sh(["umount", "-R", str(self.sessions)], check=False, quiet=True)
        left += [f"container {name}" for name in our_containers(self.engine)]
        left += [f"volume {volume}" for volume in self.volumes if volume_exists(self.engine, volume)]
        left += [f"mount {point}" for point in mounts_under((str(self.work),))]
        left += [f"process {line}" for line in container_processes()]
        return left


def container_processes() -> list[str]:
    """Serving processes still running in a container (docker's or podman's cgroup): this
    script's, once its containers are gone. The same programs run outside any container (a
    test suite on the host) are not its own."""
    stray = sh(["pgrep", "-af", "chromafs-mount|chromafs-mountd|chroma run|moto_server|redis-server"],
               check=False, quiet=True)  # fmt: skip
    left = []
    for line in stray.splitlines():
        try:
            cgroup = Path(f"/proc/{line.split()[0]}/cgroup").read_text()
        except OSError:
            continue
        if "docker" in cgroup or "libpod" in cgroup:
            left.append(line)
    return left


MOUNTD_SOCKET = "/run/chromafs/mountd.sock"
HEALTHCHECK = ["/opt/chromafs/bin/python", "/usr/local/bin/chromafs-healthcheck"]  # the image's (docker/Dockerfile)


def volumes_of(engine: str, container: str) -> list[str]:
    out = sh([engine, "inspect", "-f", '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}', container],
             check=False)  # fmt: skip
    return out.split()


def volume_exists(engine: str, volume: str) -> bool:
    return answers([engine, "volume", "inspect", volume])


def our_containers(engine: str) -> list[str]:
    """Every container of this script's, running or not: labelled, or named P-... (compose's too)."""
    out = sh([engine, "ps", "-a", "--format", "{{.Names}}"], check=False)
    labelled = sh([engine, "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"], check=False)
    return sorted({n for n in out.split() if n.startswith(P)} | set(labelled.split()))


def remove_containers(engine: str, names: list[str], volumes: list[str]) -> list[str]:
    """Stop each container (SIGTERM, then 10 s: chromafs unmounts), remove it with its anonymous
    volumes (-v), then the named `volumes`; log what was removed. What could not be removed."""
    problems = []
    removed = []
    for name in names:
        if not answers([engine, "container", "inspect", name]):
            continue
        volumes += [v for v in volumes_of(engine, name) if v not in volumes]
        sh([engine, "stop", "-t", "10", name], check=False, timeout=120, quiet=True)
        done = subprocess.run([engine, "rm", "-f", "-v", name], capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip
        if done.returncode != 0 and answers([engine, "container", "inspect", name]):
            problems.append(f"container {name}: {engine} rm: {(done.stderr or done.stdout).strip()[-300:]}")
        else:
            removed.append(name)
    gone = []
    for volume in volumes:
        if volume_exists(engine, volume):
            sh([engine, "volume", "rm", "-f", volume], check=False, quiet=True)
        if volume_exists(engine, volume):
            problems.append(f"volume {volume}: could not be removed")
        else:
            gone.append(volume)
    if removed or gone:
        log(f"removed {len(removed)} containers ({', '.join(removed)}) and {len(gone)} volumes")
    return problems


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
        from csi_rehearsal import rehearse_kubelet  # chromafs-csi as kubelet drives it (issue 39)

        figures, found = rehearse_kubelet(stack)
        stack.figures.update(figures)
        problems += found
        user = next(iter(USERS))
        took, found = stack.crash(user)
        stack.figures["crash_to_reading_s"] = round(took, 2)
        problems += found
        log(f"every serving process killed: {user}'s session read again in {took:.2f}s; "
            f"{'ok' if not found else '; '.join(found)}")  # fmt: skip
        health = stack.mountd_health()
        problems += [f"mountd's container is not healthy: {health}"] if health else []
        log(f"mountd's container: {health or 'healthy'}")
    finally:
        left = stack.down()
        shutil.rmtree(work, ignore_errors=True)
    problems += [f"left behind: {item}" for item in left]
    return {"figures": stack.figures, "problems": problems}


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


COMPOSE_PROJECT = f"{P}-compose"


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


def run_tests(engine: str) -> dict[str, object]:
    """The integration tests inside a container with /dev/fuse (root, SYS_ADMIN)."""
    started = time.monotonic()
    # this machine's CA bundle: a few tests install an old chromadb with pip
    trust = ["-v", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
    # what `chromafs shell` needs in a container, so that its tests run here too: no seccomp
    # filter of the engine's (bwrap's unshare, pivot_root) and an unmasked /proc (a new proc
    # mount in a user namespace); docs/CONTAINERS.md, "chromafs shell inside a container"
    shell = ["--security-opt", "seccomp=unconfined",
             "--security-opt", "systempaths=unconfined" if engine == "docker" else "unmask=ALL"]  # fmt: skip
    done = subprocess.run(
        [engine, "run", "--rm", "--name", f"{P}-tests", "--label", f"{LABEL}=tests", "--device", "/dev/fuse",
         "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", *shell, *trust, image("test"),
         "scripts/test"],
        check=False,
    )  # fmt: skip
    took = round(time.monotonic() - started, 1)
    return {"tests_in_container_s": took, "problems": [] if done.returncode == 0 else [f"tests failed ({took}s)"]}


def clean_previous(engine: str) -> None:
    """What a run killed halfway left behind: its containers (with their volumes), the compose
    project, its mounts and work directories. Removed, and said so."""
    names = our_containers(engine)
    if names:
        log(f"a previous run left {len(names)} containers: removing them")
        problems = remove_containers(engine, names, [])
        if problems:
            raise StackError("cannot remove what a previous run left: " + "; ".join(problems))
    if left := compose_leftovers(engine):
        log(f"a previous run left {', '.join(left)}: removing them")
        remove_compose_leftovers(engine)
    works = [str(d) for pattern in ("run-*", "compose-*") for d in CACHE.glob(pattern) if d.is_dir()]
    for mount in mounts_under(tuple(works)):
        sh(["umount", "-l", mount], check=False)
        log(f"unmounted {mount}, left by a previous run")
    for work in works:
        shutil.rmtree(work, ignore_errors=True)


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    global DAEMON
    parser = argparse.ArgumentParser(prog="scripts/containers", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine",
        choices=["auto", "docker", "podman"],
        default="auto",
        help="auto (default): docker if its daemon answers, else podman; docker: set up here if need be",
    )
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
    signal.signal(signal.SIGTERM, _terminated)  # a killed run still tears down (then exits 130)
    signal.signal(signal.SIGHUP, _terminated)
    result: dict[str, object] = {"problems": []}

    def problem(*items: str) -> None:
        result["problems"] = [*result.get("problems", []), *items]  # type: ignore[misc]

    engine = None
    interrupted = False
    podman_firewall = STATE / "podman-firewall.json"  # what it was before this (or a killed) podman run
    try:
        try:
            try:
                engine = pick_engine(None if args.engine == "auto" else args.engine)
                if engine == "podman" and not podman_firewall.exists():
                    STATE.mkdir(parents=True, exist_ok=True)
                    podman_firewall.write_text(json.dumps(firewall_snapshot()))
                version = sh([engine, "--version"]).strip()
                if engine == "docker":
                    version += f"; server {sh(['docker', 'version', '--format', '{{.Server.Version}}']).strip()}"
                log(f"engine: {version}")
                result["engine"] = version
                base = None if registry_answers(engine) else local_base(engine)
            except (StackError, subprocess.CalledProcessError, OSError) as exc:
                if not args.if_possible:
                    raise StackError(f"no container engine and base image: {exc}") from exc
                log(f"skipping the containers: no engine and base image can be set up here: {exc}")
                return 0
            clean_previous(engine)
            log(f"base: {base or 'the Dockerfiles defaults (a registry answers)'}")
            names = [n for n in IMAGES if n != "test" or args.tests]
            if args.no_stack:
                names = ["test"] if args.tests else []
            result["build_s"] = build_images(engine, names, base)
            if not args.no_stack:
                result.update(run_stack(engine))
                compose = run_compose(engine)
                result["compose_s"] = compose["compose_s"]
                problem(*compose["problems"])  # type: ignore[arg-type]
            if args.tests:
                tests = run_tests(engine)
                result["tests_in_container_s"] = tests["tests_in_container_s"]
                problem(*tests["problems"])  # type: ignore[arg-type]
        except StackError as exc:
            problem(str(exc))
        except KeyboardInterrupt as exc:
            interrupted = True
            problem(f"interrupted ({exc or 'SIGINT'}): tearing down")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the teardown runs to its end
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if engine is not None and answers([engine, "info"], timeout=60):
                if left := our_containers(engine):
                    problem(f"left behind: containers {', '.join(left)}")
                    problem(*remove_containers(engine, left, []))
                remove_compose_leftovers(engine)
            if DAEMON is not None:
                problem(*DAEMON.stop())
                DAEMON = None
            # podman's CNI networks (builds, compose) leave their chains, DNS rules, bridges and
            # ip_forward behind: put them back once no podman container runs (none of another's)
            if engine == "podman" and podman_firewall.exists() and not sh(["podman", "ps", "-q"], check=False).strip():
                problem(*restore_firewall(json.loads(podman_firewall.read_text()), "this run"))
                podman_firewall.unlink()
                with contextlib.suppress(OSError):
                    STATE.rmdir()
    except StackError as exc:
        problem(str(exc))
    result["total_s"] = round(time.monotonic() - STARTED, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    problems = result.get("problems") or []
    for item in problems:  # type: ignore[union-attr]
        log(f"PROBLEM: {item}")
    log(f"{'failed' if problems else 'all checks passed'} in {result['total_s']:.0f}s: {json.dumps(result)}")
    return 130 if interrupted else 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
