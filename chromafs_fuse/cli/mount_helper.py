"""`mount.fuse.chromafs`: the helper mount(8) runs for `-t fuse.chromafs`, so that

    mount -t fuse.chromafs acme /mnt/docs -o chroma_url=http://10.0.0.5:8000,token_file=/etc/chromafs/acme.jwt

and the same line in /etc/fstab work. The source is the site; `-o` options
name chromafs-mount flags with '_' for '-' (every flag of chromafs-mount but --site,
--token, --foreground and -o, as options.py lists them; switches such as no_push_pages take no
value). Generic mount options are dropped; FUSE options (allow_other, default_permissions, ...)
are passed on with -o.
"""

from __future__ import annotations

import os
import sys

from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import deprecated_names, fstab_name, fstab_names

RENAMED = deprecated_names()

# Options mount(8) and fstab use for their own purposes; meaningless to the daemon.
GENERIC = {
    "rw",
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "_netdev",
    "nofail",
    "owner",
    "group",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "sync",
    "async",
    "x-systemd.automount",
}


def mount_flags() -> tuple[set[str], set[str]]:
    """(options that take a value, options that are switches), named as in fstab ('_' for '-'),
    from the table chromafs-mount's parser is built from, so that the two never drift apart."""
    valued, switches = fstab_names()
    return set(valued), set(switches)


class HelperError(UsageError, ValueError):
    """An fstab line or -o option that cannot be used."""


def translate(source: str, mountpoint: str, options: str) -> list[str]:
    """The chromafs-mount argument list for a mount(8) call."""
    argv = [mountpoint, "--site", source]
    valued, switches = fstab_names()
    fuse_options = []
    for option in filter(None, (o.strip() for o in options.split(","))):
        name, has_value, value = option.partition("=")
        if name in GENERIC or name.startswith("x-"):
            continue
        if name == "token":
            raise HelperError("token= would show in ps and fstab: use token_file=")
        if name in valued:
            if not has_value:
                raise HelperError(f"option {name} needs a value")
            argv += [_current_flag(valued[name]), value]
        elif name in switches:
            if has_value:
                raise HelperError(f"option {name} takes no value")
            argv.append(_current_flag(switches[name]))
        else:
            fuse_options.append(option)
    if fuse_options:
        argv += ["-o", ",".join(fuse_options)]
    return argv


def _current_flag(flag: str) -> str:
    """The flag, by its new name if it has one (saying so on stderr, in fstab's words)."""
    if flag not in RENAMED:
        return flag
    old, new = fstab_name(flag), fstab_name(RENAMED[flag])
    print(f"mount.fuse.chromafs: option {old}= is deprecated, use {new}=", file=sys.stderr)
    return RENAMED[flag]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    positional: list[str] = []
    options = ""
    i = 0
    while i < len(args):
        if args[i] == "-o" and i + 1 < len(args):
            options = ",".join(filter(None, (options, args[i + 1])))
            i += 2
            continue
        if args[i] in ("-n", "-s", "-f", "-v"):  # mount(8) flags: no mtab, sloppy, fake, verbose
            i += 1
            continue
        positional.append(args[i])
        i += 1
    if len(positional) != 2:
        print("usage: mount.fuse.chromafs SITE MOUNTPOINT [-o options]", file=sys.stderr)
        return 1
    try:
        mount_argv = translate(positional[0], positional[1], options)
    except HelperError as exc:
        print(f"mount.fuse.chromafs: {exc}", file=sys.stderr)
        return 1
    from chromafs_fuse.cli.mount import main as mount_main

    os.environ.pop("CHROMAFS_TOKEN", None)  # only what the options say
    return mount_main(mount_argv)


if __name__ == "__main__":
    sys.exit(main())
