"""The bubblewrap sandbox `chromafs shell` runs a command in: pure argv and filter building.

What the command sees: the docs read-only at /docs, the host's /usr read-only (with the usual
/bin, /lib... links or binds), a generated /etc holding only passwd and group, fresh /proc and
/dev, private tmpfs /tmp and home. Nothing else of the host. New user, PID, IPC, UTS, cgroup
and network namespaces (only a loopback of its own), no capabilities, killed with its parent.

A seccomp filter denies, with EPERM, what a shell tool never needs and an escape would:
ptrace and cross-process memory access, every mount and namespace call, kernel keyrings, bpf,
perf events, userfaultfd, module and kexec loading, open_by_handle_at, and the TIOCSTI and
TIOCLINUX ioctls (typing into the caller's terminal: dev.tty.legacy_tiocsti is on where it
is not disabled).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chromafs_fuse.errors import UsageError

DOCS = "/docs"
PATH = "/usr/local/bin:/usr/bin:/bin"
ROOT_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")  # merged-/usr links, or directories
PASSED_ENV = ("TERM", "LANG", "LC_ALL", "COLUMNS", "LINES", "TZ")

# seccomp: struct seccomp_data is (int nr, u32 arch, u64 ip, u64 args[6])
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED_SYSCALLS = {
    # name: (x86_64, aarch64)
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "open_by_handle_at": (304, 265),
    "syslog": (103, 116),
    "acct": (163, 89),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
}
IOCTL = (16, 29)
DENIED_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
X32_SYSCALL_BIT = 0x40000000

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1


class SandboxError(UsageError):
    """The sandbox cannot be set up here; the message says why."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes:
    """A classic BPF seccomp program (what `bwrap --seccomp FD` reads): EPERM for the denied
    calls and ioctls and for every call of another ABI (x32 included), ALLOW otherwise."""
    machine = machine or os.uname().machine
    if machine not in AUDIT_ARCH:
        raise SandboxError(f"no seccomp filter for {machine}: chromafs shell knows x86_64 and aarch64")
    column = 0 if machine == "x86_64" else 1
    numbers = sorted({numbers[column] for numbers in DENIED_SYSCALLS.values()})
    # (code, jump if true, jump if false, k); jumps name a label, resolved below
    program: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, 4),  # arch
        (_JEQ_K, None, "deny", AUDIT_ARCH[machine]),
        (_LD_W_ABS, None, None, 0),  # nr
    ]
    if machine == "x86_64":
        program.append((_JGE_K, "deny", None, X32_SYSCALL_BIT))
    program += [(_JEQ_K, "deny", None, number) for number in numbers]
    program += [(_JEQ_K, "ioctl", None, IOCTL[column]), (_RET_K, None, None, _ALLOW)]
    labels = {"ioctl": len(program)}
    program.append((_LD_W_ABS, None, None, 16 + 8))  # args[1]'s low 32 bits (little endian)
    program += [(_JEQ_K, "deny", None, request) for request in DENIED_IOCTLS]
    program.append((_RET_K, None, None, _ALLOW))
    labels["deny"] = len(program)
    program.append((_RET_K, None, None, _ERRNO_EPERM))

    def offset(label: str | None, at: int) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(_insn(code, offset(jt, at), offset(jf, at), k) for at, (code, jt, jf, k) in enumerate(program))


@dataclass(frozen=True)
class Sandbox:
    docs: str  # the session's mountpoint on the host
    etc: str  # a directory holding the generated passwd and group
    command: Sequence[str]
    user: str = "agent"
    uid: int = 1000
    seccomp_fd: int | None = None
    new_session: bool = True  # setsid: no controlling terminal shared with the caller

    @property
    def home(self) -> str:
        return f"/home/{self.user}"

    def bwrap_argv(self, environ: Mapping[str, str] | None = None) -> list[str]:
        env = os.environ if environ is None else environ
        argv = ["bwrap", "--unshare-all", "--uid", str(self.uid), "--gid", str(self.uid)]
        argv += ["--die-with-parent", "--cap-drop", "ALL", "--clearenv"]
        if self.new_session:
            argv.append("--new-session")
        argv += ["--setenv", "PATH", PATH, "--setenv", "HOME", self.home, "--setenv", "USER", self.user]
        argv += ["--setenv", "PS1", r"\u@docs:\w\$ "]
        for name in PASSED_ENV:
            if env.get(name):
                argv += ["--setenv", name, env[name]]
        argv += ["--ro-bind", "/usr", "/usr"]
        for name in ROOT_LINKS:
            host = "/" + name
            if os.path.islink(host):
                argv += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                argv += ["--ro-bind", host, host]
        argv += ["--ro-bind", self.etc, "/etc", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--tmpfs", "/tmp", "--tmpfs", self.home, "--ro-bind", self.docs, DOCS, "--chdir", DOCS]
        if self.seccomp_fd is not None:
            argv += ["--seccomp", str(self.seccomp_fd)]
        return [*argv, "--", *self.command]


def write_etc(folder: str, user: str, uid: int) -> None:
    """The sandbox's whole /etc: who its user is, and nothing of the host's."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "passwd"), "w") as f:
        f.write(f"root:x:0:0:root:/root:/bin/bash\n{user}:x:{uid}:{uid}:{user}:/home/{user}:/bin/bash\n")
        f.write("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    with open(os.path.join(folder, "group"), "w") as f:
        f.write(f"root:x:0:\n{user}:x:{uid}:\nnogroup:x:65534:\n")
