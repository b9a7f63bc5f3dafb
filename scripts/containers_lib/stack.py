"""The stack of docker/compose.yaml, service by service (Stack): the backends on one loopback,
the sample site ingested, chromafs-mountd serving a session per token on a shared host directory,
a bash agent container per session and what it must see (check_agent), an agent living through
the crash of its serving process (check_crash_agent), and the teardown with what it left;
run_stack, which runs it all and the kubelet rehearsal (csi_rehearsal.py). Also the bookkeeping
of this script's containers and volumes (our_containers, remove_containers), which main uses."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import jwt

from containers_lib.common import CACHE, LABEL, SAMPLE_SITE, P, StackError, answers, log, mounts_under, sh
from containers_lib.images import image

SITE = "acme"
SECRET = "containers-demo-secret-0123456789abcdef"
USERS = {"alice": ["billing"], "bob": []}  # bob: signed in, in no group
BACKEND = [
    "--chroma-url", "http://127.0.0.1:8000", "--redis-url", "redis://127.0.0.1:6379/0",
    "--s3-endpoint-url", "http://127.0.0.1:5000",
]  # fmt: skip
S3_ENV = [
    "-e", "AWS_ENDPOINT_URL=http://127.0.0.1:5000", "-e", "AWS_ACCESS_KEY_ID=test",
    "-e", "AWS_SECRET_ACCESS_KEY=test", "-e", "AWS_DEFAULT_REGION=us-east-1",
]  # fmt: skip


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
            if f.read().startswith(b"chromafs-serving "):
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
                  "--jwt-secret-file", "/run/secrets/jwt_secret", "-o", "allow_other")  # fmt: skip
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
