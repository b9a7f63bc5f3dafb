"""`mount.fuse.chromafs`: the helper mount(8) runs for `-t fuse.chromafs`, so that

    mount -t fuse.chromafs acme /mnt/docs -o chroma_url=http://10.0.0.5:8000,token_file=/etc/chromafs/acme.jwt

and the same line in /etc/fstab work. The source is the site; `-o` options
name chromafs-mount flags with '_' for '-' (every flag of chromafs-mount but --site,
--token and --foreground; switches such as no_push_pages take no value). Generic mount
options are dropped;
FUSE options (allow_other, default_permissions, ...) are passed on with -o.
"""

from __future__ import annotations

import os
import sys

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
# chromafs-mount flags that make no sense as a mount option, or must not be one.
NOT_OPTIONS = {"site", "token", "token_stdin", "ready_fd", "foreground", "help", "options", "mountpoint"}


def mount_flags() -> tuple[set[str], set[str]]:
    """(options that take a value, options that are switches), named as in fstab ('_' for '-'),
    read from chromafs-mount's own parser so that the two never drift apart."""
    from chromafs_fuse.cli.mount import build_parser

    valued: set[str] = set()
    switches: set[str] = set()
    for action in build_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in NOT_OPTIONS or action.help == "==SUPPRESS==":
            continue
        names = {o[2:].replace("-", "_") for o in longs}  # --push-pages and --no-push-pages alike
        (switches if action.nargs == 0 else valued).update(names)
    return valued, switches


class HelperError(ValueError):
    pass


def translate(source: str, mountpoint: str, options: str) -> list[str]:
    """The chromafs-mount argument list for a mount(8) call."""
    argv = [mountpoint, "--site", source]
    valued, switches = mount_flags()
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
            argv += [f"--{name.replace('_', '-')}", value]
        elif name in switches:
            if has_value:
                raise HelperError(f"option {name} takes no value")
            argv.append(f"--{name.replace('_', '-')}")
        else:
            fuse_options.append(option)
    if fuse_options:
        argv += ["-o", ",".join(fuse_options)]
    return argv


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
