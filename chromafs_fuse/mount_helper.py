"""`mount.fuse.chromafs`: the helper mount(8) runs for `-t fuse.chromafs`, so that

    mount -t fuse.chromafs acme /mnt/docs -o chroma_url=http://10.0.0.5:8000,token_file=/etc/chromafs/acme.jwt

and the same line in /etc/fstab work. The source is the site; `-o` options
name chromafs-mount flags with '_' for '-'. Generic mount options are dropped;
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
VALUED = {
    "chroma_path",
    "chroma_url",
    "collection",
    "chroma_tenant",
    "chroma_database",
    "token_file",
    "jwt_secret_file",
    "jwt_public_key",
    "redis_url",
    "redis_prefix",
    "redis_ttl",
    "tree_ttl",
    "s3_endpoint_url",
    "cache_bytes",
    "cache_timeout",
    "backend_timeout",
    "prefetch",
    "page_field",
    "chunk_index_field",
    "log_file",
    "log_level",
    "log_format",
    "pid_file",
    "metrics_addr",
    "mountd",
}


class HelperError(ValueError):
    pass


def translate(source: str, mountpoint: str, options: str) -> list[str]:
    """The chromafs-mount argument list for a mount(8) call."""
    argv = [mountpoint, "--site", source]
    fuse_options = []
    for option in filter(None, (o.strip() for o in options.split(","))):
        name, has_value, value = option.partition("=")
        if name in GENERIC or name.startswith("x-"):
            continue
        if name == "token":
            raise HelperError("token= would show in ps and fstab: use token_file=")
        if name in VALUED:
            if not has_value:
                raise HelperError(f"option {name} needs a value")
            argv += [f"--{name.replace('_', '-')}", value]
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
    from .mount_cli import main as mount_main

    os.environ.pop("CHROMAFS_TOKEN", None)  # only what the options say
    return mount_main(mount_argv)


if __name__ == "__main__":
    sys.exit(main())
