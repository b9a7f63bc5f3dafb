"""`chromafs shell`: a real bash in a real bubblewrap sandbox over a session's view, and the
probes that show what the sandbox can and cannot reach."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import BIN, SAMPLE_SITE, MountServer, expected_visible, mounts_under, poll_until, wait_until

SHELLS = Path(os.environ["CHROMAFS_RUNTIME_DIR"], "shells")  # this run's own (tests/conftest.py)


def sandbox_unavailable() -> str | None:
    """Why chromafs shell's sandbox cannot be made here, or None: e.g. inside a container, whose
    masked /proc forbids the sandbox a /proc of its own."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    from chromafs_fuse.frontends.sandbox import Sandbox, write_etc

    with tempfile.TemporaryDirectory() as folder:
        write_etc(folder, "agent", 1000)
        argv = Sandbox(folder, folder, ["true"]).bwrap_argv()
        probe = subprocess.run(argv, capture_output=True, text=True)
    return f"no sandbox here: {probe.stderr.strip()}" if probe.returncode else None


NO_SANDBOX = sandbox_unavailable()
pytestmark = pytest.mark.skipif(NO_SANDBOX is not None, reason=str(NO_SANDBOX))


@pytest.fixture
def server(start_mount_server: Callable[..., MountServer]) -> MountServer:
    return start_mount_server(SHELLS, class_idle_s=30.0)


def shell_args(chroma: Path, token: Path | None, secret_file: Path, server: MountServer | None) -> list[str]:
    args = ["--site", "acme", "--chroma-path", str(chroma), "--jwt-secret-file", str(secret_file)]
    args += ["--refresh-interval", "0"]
    if server is not None:
        args += ["--mountd", str(server.socket)]
    return [*args, "--token-file", str(token)] if token else args


def shell(args: list[str], script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "chromafs"), "shell", *args, "--", "bash", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def shell_folders() -> list[str]:
    return sorted(os.listdir(SHELLS)) if SHELLS.exists() else []


def test_a_shell_sees_exactly_its_tokens_pages_and_ends_its_session(
    server: MountServer, sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path
) -> None:
    chroma = sample_chroma("public")
    before = shell_folders()
    for token, groups in ((token_file(["billing"]), {"billing"}), (None, None)):
        done = shell(shell_args(chroma, token, secret_file, server), "cd /docs && find . -type f | sort; exit 7")
        assert done.returncode == 7, done.stderr  # the command's own status
        shown = {line.removeprefix("./") for line in done.stdout.splitlines()}
        assert shown == expected_visible(SAMPLE_SITE, "public", groups)
        assert mounts_under(SHELLS) == [], "the session outlived its command"
        assert set(shell_folders()) <= set(before)  # nothing of its own left
    quickstart = shell(shell_args(chroma, None, secret_file, server), "cat /docs/quickstart.mdx")
    assert quickstart.stdout == (SAMPLE_SITE / "quickstart.mdx").read_text()


def test_a_shell_without_a_mount_server_uses_a_mount_of_its_own(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path
) -> None:
    args = shell_args(sample_chroma("public"), token_file(["admin"]), secret_file, None)
    done = shell(args, "wc -c < /docs/quickstart.mdx; ls /docs")
    assert done.returncode == 0, done.stderr
    size, *listing = done.stdout.split()
    assert int(size) == (SAMPLE_SITE / "quickstart.mdx").stat().st_size and "admin" in listing
    assert mounts_under(SHELLS) == []
    assert subprocess.run(["pgrep", "-f", f"chromafs-mount {SHELLS}"], capture_output=True).returncode == 1


PROBES = r"""
probe() { if eval "$2" >/dev/null 2>&1; then echo "$1: reached"; else echo "$1: refused"; fi; }
probe host-file "cat @SECRET@"
probe host-dirs "ls /root || ls /work || ls /run || ls /var"
probe etc-shadow "cat /etc/shadow"
probe write-docs "echo x > /docs/new.md"
probe write-usr "echo x > /usr/new"
probe write-etc "echo x >> /etc/passwd"
probe write-tmp "echo x > /tmp/@MARKER@"
probe write-home "echo x > ~/notes"
probe network "exec 3<>/dev/tcp/127.0.0.1/@PORT@"
probe other-interfaces "tail -n +3 /proc/net/dev | grep -v '^ *lo:' | grep -q ."
probe mount "mount -t tmpfs none /tmp"
probe unshare "unshare -r true"
probe host-processes "grep -q -v -e bwrap -e bash /proc/1/comm"
probe capabilities "grep -q 'CapEff:[[:space:]]*0*[1-9a-f]' /proc/self/status"
probe ptrace "python3 -c '
import ctypes, os, sys
child = os.fork()
if child == 0:
    os.execvp(\"sleep\", [\"sleep\", \"5\"])
libc = ctypes.CDLL(None, use_errno=True)
attached = libc.ptrace(16, child, 0, 0) == 0
os.kill(child, 9)
sys.exit(0 if attached else 1)
'"
probe tiocsti "python3 -c '
import fcntl, termios, errno, sys
try:
    fcntl.ioctl(0, termios.TIOCSTI, b\"x\")
except OSError as exc:
    sys.exit(1 if exc.errno == errno.EPERM else 0)
'"
ls / | tr '\n' ' '; echo
ls /etc | tr '\n' ' '; echo
"""


def test_the_sandbox_reaches_its_docs_and_private_scratch_space_and_nothing_else(
    server: MountServer, sample_chroma: Callable[[str], Path], secret_file: Path
) -> None:
    marker = f"chromafs-shell-probe-{os.getpid()}"
    with socket.socket() as listener:  # a host service the sandbox must not reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = str(listener.getsockname()[1])
        script = PROBES.replace("@SECRET@", str(secret_file)).replace("@MARKER@", marker).replace("@PORT@", port)
        done = shell(shell_args(sample_chroma("public"), None, secret_file, server), script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    results = dict(line.split(": ", 1) for line in lines[:-2])
    reached = {name for name, outcome in results.items() if outcome == "reached"}
    assert reached == {"write-tmp", "write-home"}, done.stdout
    assert len(results) == 16
    root = {"bin", "dev", "docs", "etc", "home", "lib", "proc", "sbin", "tmp", "usr"}
    root |= {name for name in ("lib32", "lib64", "libx32") if os.path.lexists("/" + name)}
    assert set(lines[-2].split()) == root
    assert lines[-1].split() == ["group", "passwd"]
    assert not Path("/tmp", marker).exists()  # its /tmp was its own


def test_a_shell_dies_with_its_caller_and_a_stopped_shell_ends_its_session(
    server: MountServer, sample_chroma: Callable[[str], Path], secret_file: Path
) -> None:
    args = shell_args(sample_chroma("public"), None, secret_file, server)

    def start(tag: str) -> tuple[subprocess.Popen[bytes], int]:
        argv = [str(BIN / "chromafs"), "shell", *args, "--", "bash", "-c", f"exec -a {tag} sleep 300"]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            found = wait_until(
                lambda: subprocess.run(["pgrep", "-x", "-f", f"{tag} 300"], capture_output=True, text=True).stdout,
                30,
                "the sandboxed command started",
                0.05,
            )
        except AssertionError:
            proc.kill()
            raise
        return proc, int(found.split()[0])

    def gone(pid: int) -> bool:
        return poll_until(lambda: not os.path.exists(f"/proc/{pid}"), 5, 0.05) is True

    proc, sandboxed = start(f"probe-term-{os.getpid()}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert gone(sandboxed)
    assert mounts_under(SHELLS) == []

    proc, sandboxed = start(f"probe-kill-{os.getpid()}")
    proc.kill()  # no clean-up at all: the kernel kills the sandbox with its parent
    proc.wait(30)
    assert gone(sandboxed)
    assert mounts_under(SHELLS) and any(name.startswith(f"{proc.pid}-") for name in shell_folders())
    # the next shell ends the killed one's session
    assert shell(args, "true").returncode == 0
    assert mounts_under(SHELLS) == []
    assert not any(name.startswith(f"{proc.pid}-") for name in shell_folders())
