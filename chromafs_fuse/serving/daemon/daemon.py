"""The serving side of a mount: verify the token, build the mount (serving/daemon/mount.py), serve
it until unmounted or signalled, and say in one line why when it cannot.

Runs in the foreground process, in the child `chromafs-mount` starts, or in a
child forked by `chromafs-mountd` (which has imported all of this already).
Readiness and one-line failures go to `ready_fd` when one is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import unexpected
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.serving.daemon.mount import Mount
from chromafs_fuse.serving.failures import mount_failure, report_failure
from chromafs_fuse.serving.process import limit_malloc_arenas
from chromafs_fuse.site.loader import verify_reader

log = logging.getLogger("chromafs.mount")


def run_daemon(
    config: MountConfig,
    ready_fd: int | None,
    background: bool,
    read_token: Callable[[], str | None] | None = None,
) -> int:
    """Serve the mount `config` describes; returns the exit status. `read_token` gives the token
    to verify (None: anonymous)."""
    limit_malloc_arenas()
    setup_logging(config.log_level, config.log_file, background=background, json_lines=config.log_format == "json")
    try:
        principal = verify_reader(read_token() if read_token else None, config.session)
        mount = Mount(config, principal)
    except Exception as exc:  # reported as one line (a traceback in the log for what is not a ChromafsError)
        return mount_failure(ready_fd, exc)
    try:
        mount.run(ready_fd)
    except RuntimeError as exc:  # pyfuse3.init failures (permissions, no /dev/fuse)
        return report_failure(ready_fd, f"mounting {config.mountpoint} failed: {exc}")
    except Exception as exc:  # never die silently: the log says why
        log.exception("the daemon failed")
        return report_failure(ready_fd, f"the daemon failed: {unexpected(exc)}")
    return 0
