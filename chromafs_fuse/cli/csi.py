"""`chromafs-csi`'s flags and entry point; the plugin itself is chromafs_fuse/csi/."""

from __future__ import annotations

import argparse
import os
import sys

from chromafs_fuse.cli.common import add_options
from chromafs_fuse.errors import UsageError
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.options import KEY_OPTIONS, LOG_LEVELS, MOUNTD_DEFAULTS, POD_OPTIONS

CSI_ENDPOINT = "unix:///csi/csi.sock"
MOUNTD_SOCKET: str = MOUNTD_DEFAULTS["--socket"]  # the mount server's own default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-csi",
        description="A Kubernetes CSI node plugin: a pod's inline volume is a session of the node's chromafs-mountd.",
    )
    parser.add_argument("--endpoint", default=os.environ.get("CSI_ENDPOINT", CSI_ENDPOINT), help="CSI socket")
    parser.add_argument("--mountd", default=MOUNTD_SOCKET, metavar="SOCKET", help="the node's chromafs-mountd socket")
    parser.add_argument("--node-id", required=True, metavar="NODE", help="this node's name (NodeGetInfo)")
    add_options(parser, KEY_OPTIONS)  # how tokens are verified, as a session's own flags say
    add_options(parser, POD_OPTIONS)  # pods that sign in with their service-account token
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-file", help="log here (default: stderr)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_file)
    try:
        from chromafs_fuse.csi.pod_identity import PodKeys, PodSignIn
        from chromafs_fuse.csi.server import serve
        from chromafs_fuse.csi.volume import Keys, VolumeError, reader

        keys = Keys.from_args(args)
        reader(None, "-", keys, 0.0)  # the key is readable now, not at the first pod
        pod_keys = PodKeys.from_args(args)
        pods = None if pod_keys is None else PodSignIn.of(pod_keys, args.jwks_cooldown, args.jwks_refresh)
        if pods is not None:
            pods.check()  # the mapping is readable now, not at the first pod
        return serve(args.endpoint, args.mountd, args.node_id, keys, pods)
    except (UsageError, VolumeError) as exc:
        print(f"chromafs-csi: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
