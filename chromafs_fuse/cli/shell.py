"""`chromafs shell [chromafs-mount options] [-- COMMAND...]`: a command (default: bash) in a
bubblewrap sandbox whose only view of the host is the reader's docs at /docs.

The view is a session like any other: a bind of the shared class mount when a mount server is
given (`--mountd` or CHROMAFS_MOUNTD_SOCKET), else a mount of its own. It is mounted on a private
directory, handed to the sandbox read-only, and unmounted when the command ends; the exit status
is the command's. Like mount_client, this path imports nothing heavy: its start-up is the
session's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from chromafs_fuse.cli import mount_client, mount_request

USAGE = """usage: chromafs shell [chromafs-mount options] [-- COMMAND [ARG...]]

Run COMMAND (default: bash) in a sandbox that sees the docs your token may read at /docs,
read-only, and nothing else of this machine: a read-only /usr, private /tmp and home, no
network, no capabilities, no ptrace or mount. Options are chromafs-mount's (--site,
--chroma-path/--chroma-url, --token-file, --mountd, ...); the exit status is COMMAND's.
"""


def run_folder() -> str:
    """A private folder for this shell's mountpoint and /etc."""
    import tempfile

    given = os.environ.get("CHROMAFS_RUNTIME_DIR")  # as serving/status.py's runtime_bases
    if given:
        base = os.path.join(given, "shells")
    elif os.geteuid() == 0:
        base = "/run/chromafs/shells"
    else:
        base = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), "chromafs-shells")
    os.makedirs(base, mode=0o700, exist_ok=True)
    clean_stale(base)
    return tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base)


def clean_stale(base: str) -> None:
    """End the sessions of shells that were killed outright (SIGKILL leaves no time to): their
    folders are named after their PID."""
    for name in os.listdir(base):
        pid = name.split("-", 1)[0]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        folder = os.path.join(base, name)
        docs = os.path.join(folder, "docs")
        if os.path.ismount(docs):
            mount_request.unmount_lazily(docs)
        remove_folder(folder)


def find_program(name: str) -> str | None:
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def unmount(path: str) -> None:
    """End the session: unmount its view (a bind of the class mount, or its own daemon's mount)."""
    import time

    for _ in range(50):
        if not os.path.ismount(path):
            return
        pid = os.posix_spawnp("fusermount3", ["fusermount3", "-u", "-q", path], dict(os.environ))
        os.waitpid(pid, 0)
        if not os.path.ismount(path):
            return
        time.sleep(0.1)  # still busy: the sandbox's last processes are going
    mount_request.unmount_lazily(path)


def remove_folder(folder: str) -> None:
    for name in ("passwd", "group"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, "etc", name))
    for sub in ("etc", "docs", ""):
        try:
            os.rmdir(os.path.join(folder, sub))
        except FileNotFoundError:
            continue
        except OSError as exc:
            print(f"chromafs shell: cannot remove {os.path.join(folder, sub)}: {exc.strerror}", file=sys.stderr)


def run_sandboxed(docs: str, etc: str, command: list[str]) -> int:
    """Run the command in the sandbox and return its status as a shell reports one."""
    from chromafs_fuse.frontends.sandbox import Sandbox, seccomp_program, write_etc

    write_etc(etc, "agent", 1000)
    seccomp = os.memfd_create("chromafs-seccomp", 0)  # inherited by bwrap, which reads it
    try:
        os.write(seccomp, seccomp_program())
        os.lseek(seccomp, 0, os.SEEK_SET)
        sandbox = Sandbox(docs, etc, command, seccomp_fd=seccomp, new_session=not os.isatty(0))
        ended: list[int] = []

        def stop(signum: int, _frame: object) -> None:
            ended.append(signum)
            os.kill(child, signal.SIGKILL)  # its sandbox dies with it (--die-with-parent)

        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
        child = os.posix_spawnp(
            "bwrap", sandbox.bwrap_argv(), dict(os.environ), setsigdef=(signal.SIGINT, signal.SIGQUIT)
        )
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, stop)
        try:
            while True:
                try:
                    _, status = os.waitpid(child, 0)
                    break
                except InterruptedError:
                    continue
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    finally:
        os.close(seccomp)
    if ended:
        return 128 + ended[0]
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str]) -> int:
    if "--" in argv:
        at = argv.index("--")
        mount_args, command = argv[:at], argv[at + 1 :]
    else:
        mount_args, command = argv, []
    if "-h" in mount_args or "--help" in mount_args:
        print(USAGE, end="")
        return 0
    if find_program("bwrap") is None:
        print("chromafs shell: bwrap is not installed (apt-get install bubblewrap)", file=sys.stderr)
        return 1
    folder = run_folder()
    docs, etc = os.path.join(folder, "docs"), os.path.join(folder, "etc")
    os.mkdir(docs)
    try:
        status = mount_client.main([*mount_args, docs])
        if status != 0:
            return status
        try:
            return run_sandboxed(docs, etc, command or ["bash"])
        finally:
            unmount(docs)
    finally:
        remove_folder(folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
