"""The container engine: Debian's packages from apt, rootful podman configured for a host
without systemd (machine_limits, configure_podman), docker's daemon (DockerDaemon: started under
systemd or as a child, adopted from a run killed halfway, stopped with the firewall put back, its
stray processes), and pick_engine, which sets DAEMON, the dockerd this run stops at its end."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

from containers_lib.common import CACHE, STATE, StackError, answers, log, mounts_under, sh
from containers_lib.firewall import firewall_snapshot, restore_firewall

# Debian's docker: dockerd, containerd, runc, tini (docker-init), iptables; mmdebstrap for the base
DOCKER_PACKAGES = ["docker.io", "mmdebstrap"]
# dockerd started by this script: its pid file and what the firewall was before it started (in
# STATE: a run killed halfway leaves them for the next run, which adopts the daemon, stops it at
# its end and restores the firewall from the snapshot)
DOCKERD_PID = STATE / "dockerd.pid"
FIREWALL = STATE / "firewall.json"
# dnsname: compose's service names resolve on podman's CNI networks; catatonit: `init: true`
PODMAN_PACKAGES = [
    "podman", "runc", "fuse-overlayfs", "slirp4netns", "uidmap", "mmdebstrap",
    "golang-github-containernetworking-plugin-dnsname", "catatonit",
]  # fmt: skip
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONF_MARK = "# written by chromafs scripts/containers"


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
