"""`chromafs-mountd`: a resident mount server that makes new mounts boot fast.

A fresh Python process spends most of a second importing trio, pyfuse3,
redis and the JWT stack before it can mount anything. The mount server pays
that once: it imports everything, then listens on a Unix socket. For each
request it forks a child that already has every module loaded (and shares
their memory with the server copy-on-write), and that child serves the mount
exactly as `chromafs-mount --foreground` would. Mounts outlive the server.

Only peers running as root or as the server's own user may ask for a mount.
The client (`chromafs-mount --mountd SOCKET`) reads the token itself, so file
permissions are checked as the caller, and sends it over the socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import select
import signal
import socket
import struct
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import setproctitle

from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import UsageError
from chromafs_fuse.serving.class_mounts import DEFAULT_IDLE_S, DEFAULT_WARM_WAIT_S
from chromafs_fuse.serving.mountd_metrics import MetricsEndpoint

if TYPE_CHECKING:
    import argparse

    from chromafs_fuse.access import Principal
    from chromafs_fuse.inodes import InodeTable
    from chromafs_fuse.serving.class_mounts import SessionKeeper
    from chromafs_fuse.site.follower import TreeFollower
    from chromafs_fuse.site.loader import Preloaded
    from chromafs_fuse.site.tables import PrunedTables
    from chromafs_fuse.tree import SiteTree

    ListedTable = tuple[InodeTable, tuple[int, Any]]  # a pruned table and its listing attributes

# A request's argv (the caller's chromafs-mount flags, token left out) -> its parsed flags, as
# chromafs-mount's parser gives them; SystemExit when they are wrong. Handed in by cli/mountd.py.
ParseArgv = Callable[[list[str]], "argparse.Namespace"]

log = logging.getLogger("chromafs.mountd")
MAX_REQUEST_BYTES = 256 * 1024
DEFAULT_SOCKET = "/run/chromafs/mountd.sock"
DEFAULT_SHARED_CACHE_BYTES = 256 * 1024 * 1024


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _read_request(conn: socket.socket) -> dict[str, object]:
    conn.settimeout(5)
    data = b""
    while len(data) <= MAX_REQUEST_BYTES:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError("request too large")
    if not data:
        raise EOFError  # a connection closed without a word: a health check probing the socket
    request = json.loads(data)
    if not isinstance(request, dict) or not isinstance(request.get("argv"), list):
        raise ValueError("malformed request")
    return request


class TreeCache:
    """The sites' trees and pruned tables, handed to the mounts the server forks.

    Only trees that are in Redis (the server never opens Chroma: its client starts threads,
    which do not survive a fork). Each request has its site's follower check the tree's version
    key, a few bytes, so a re-ingest published to Redis is picked up by the next mount. Readers
    of one class share a pruned table (site/tables.py), kept with its listing attributes.
    """

    MAX_TABLES = 64  # per site and --cache-timeout

    def __init__(self) -> None:
        self._redis: dict[Any, Any] = {}  # RedisSettings -> RedisCache
        self._followers: dict[tuple[str, ...], TreeFollower] = {}
        self._tables: dict[tuple[object, ...], PrunedTables[ListedTable]] = {}

    def prepared(self, config: MountConfig, principal: Any) -> Preloaded | None:
        """What a child mount for this reader needs, or None if the tree is not in Redis (or
        cannot be had from it: the child then loads it itself, and reports what goes wrong)."""
        try:
            return self._prepared(config, principal)
        except Exception:
            log.exception("preparing a mount of %s failed; its daemon loads the tree itself", config.site)
            return None

    def _prepared(self, config: MountConfig, principal: Any) -> Preloaded | None:
        from chromafs_fuse.backends.redis_cache import RedisCache
        from chromafs_fuse.site.follower import TreeFollower
        from chromafs_fuse.site.loader import Preloaded, SiteLoader
        from chromafs_fuse.site.tables import PrunedTables

        settings = config.session.redis
        if settings is None:
            return None
        site_key = (settings.url, settings.prefix, config.site, config.session.chroma.collection)
        follower = self._followers.get(site_key)
        if follower is None:
            redis = self._redis.get(settings)
            if redis is None:
                redis = self._redis[settings] = RedisCache.from_settings(settings)
            follower = self._followers[site_key] = TreeFollower(SiteLoader(config.session, redis), chroma=None)
        tree = follower.refresh()
        if tree is None:
            return None  # the child loads it from Chroma and reports what goes wrong
        tables_key = (site_key, config.cache_timeout_s)
        tables = self._tables.get(tables_key)
        if tables is None:
            tables = PrunedTables(partial(listed_table, config.cache_timeout_s), self.MAX_TABLES)
            self._tables[tables_key] = tables
        # Readers with the same groups share the table; each child gets its own reader (subject).
        return Preloaded(principal, tree, *tables.get(tree, principal))


def listed_table(timeout_s: float, tree: SiteTree, principal: Principal) -> ListedTable:
    """The tree pruned for a reader class, with its listing attributes and the time they were
    built: a fresh mount's first `find` then allocates nothing."""
    from chromafs_fuse.serving.fuse_adapter import table_attributes
    from chromafs_fuse.site.tables import prune

    table = prune(tree, principal)
    built_ns = time.time_ns()
    listed = (table, (built_ns, table_attributes(table, built_ns, timeout_s)))
    gc.freeze()  # keep the collector from touching (and un-sharing) what children inherit
    return listed


def _become_daemon(cwd: str, title: str) -> None:
    """In a forked child: a session of its own, default signals, no terminal, `title` shown."""
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir(cwd)
    # Without this the child shows the server's command line, and `pkill chromafs-mountd` would take
    # every mount down with the server.
    setproctitle.setproctitle(title)


def _serve_in_child(
    conn: socket.socket,
    cwd: str,
    config: MountConfig,
    prepared: Preloaded | None,
    principal: Principal | None = None,
    token: str | None = None,
) -> int:
    """In the forked child: become the mount's daemon."""
    from chromafs_fuse.serving.daemon import run_daemon

    _become_daemon(cwd, f"chromafs-mount {config.mountpoint} --site {config.site}")
    conn.setblocking(True)
    return run_daemon(
        config,
        conn.detach(),
        background=True,
        preloaded=prepared,
        principal=principal,
        # exactly the caller's token (its client read the caller's environment): never the
        # server's own CHROMAFS_TOKEN or CHROMAFS_TOKEN_FILE
        read_token=lambda: token,
    )


def _serve_shared_in_child(
    conn: socket.socket, class_root: str, index: int, cache_bytes: int, idle_exit_s: float
) -> int:
    """In the forked child: become the `index`-th shared mount's process (class mode shared)."""
    from chromafs_fuse.serving.shared_mount import run_shared_mount, shared_paths

    _become_daemon("/", f"chromafs-shared {class_root}" + (f" {index}" if index else ""))
    conn.setblocking(True)
    log_file = f"{shared_paths(class_root, index)[0]}.log"
    return run_shared_mount(class_root, cache_bytes, idle_exit_s, conn.detach(), log_file, index=index)


@dataclasses.dataclass
class PreparedRequest:
    """What the server makes of a request before it forks: as far as it gets, and why not."""

    args: argparse.Namespace | None = None  # None: the flags are wrong
    config: MountConfig | None = None
    principal: Principal | None = None
    error: Exception | None = None


def _prepare(request: dict[str, object], parse_argv: ParseArgv) -> PreparedRequest:
    """In the server: the parsed arguments, the configuration (built here, once) and the verified
    reader for this request, as far as they can be had, and why not. For an isolated mount a
    failure to verify the reader just means the child does it (and reports errors)."""
    from chromafs_fuse.site.loader import verify_reader

    out = PreparedRequest()
    try:
        cwd = os.getcwd()
        os.chdir(str(request.get("cwd") or "/"))
        try:
            argv = [str(a) for a in request["argv"]]  # type: ignore[union-attr]
            out.args = parse_argv([*argv, "--foreground"])
            out.config = MountConfig.from_args(out.args)
            out.principal = verify_reader(_request_token(request), out.config.session)
        finally:
            os.chdir(cwd)
    except SystemExit:
        pass
    except Exception as exc:
        out.error = exc
    return out


def _request_token(request: dict[str, object]) -> str | None:
    return request.get("token") or None  # type: ignore[return-value]


def _fork_daemon(listeners: Sequence[socket.socket | MetricsEndpoint], serve: Callable[[], int]) -> int:
    """Fork a child that runs `serve` (a `_serve_in_child` with its request) and exits with its
    status; returns its pid. The child closes the server's `listeners` first: a mount must not
    hold them after the server ends."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for listener in listeners:
                listener.close()
            code = serve()
        finally:
            logging.shutdown()
            os._exit(code)
    return pid


HOUSEKEEPING_S = 0.5
ORPHAN_GRACE_S = 5.0  # a class mount idle this much past --class-idle ends itself: no server stopped it


def serve_forever(
    socket_path: str,
    parse_argv: ParseArgv,
    class_root: str | None = None,
    class_idle_s: float = DEFAULT_IDLE_S,
    class_warm_wait_s: float = DEFAULT_WARM_WAIT_S,
    metrics_addr: str | None = None,
    class_mode: str = "process",
    shared_cache_bytes: int = DEFAULT_SHARED_CACHE_BYTES,
    shared_processes: int = 1,
) -> None:
    """Serve mount requests until SIGTERM, each request's argv parsed by `parse_argv`. With
    `class_root` (root only), sessions are binds of shared class mounts kept there, each handed
    out once warm or after `class_warm_wait_s`; without it, or for `--isolated`, each session
    gets a daemon. `class_mode` "shared": every class is a view of one shared mount (issue 30),
    its pages in one memory budget of `shared_cache_bytes`, its sites spread over `shared_processes`."""
    from chromafs_fuse.serving.class_mounts import ClassHost, ProcessHost, SessionError, SessionKeeper
    from chromafs_fuse.serving.handshake import wait_for_ready

    server = _listening_socket(socket_path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    cache = TreeCache()
    stopping = False

    def start_class(session: MountConfig, principal: Principal, path: str) -> int:
        config = dataclasses.replace(
            session,
            mountpoint=path,
            log_file=f"{path}.log",
            pid_file=None,
            metrics_addr=None,
            # every session's first grep finds the pages in the kernel, the class's first one too
            warm_kernel=True,
            warm_wait_s=class_warm_wait_s,
            # a class mount ends by itself when idle, with no server to stop it (stopped or crashed);
            # a live server stops it first, at class_idle_s
            idle_exit_s=class_idle_s + ORPHAN_GRACE_S,
        )
        ours, theirs = socket.socketpair()
        with ours:
            prepared = cache.prepared(config, principal)
            pid = _fork_daemon(listeners, partial(_serve_in_child, theirs, "/", config, prepared, principal))
            theirs.close()
            ok, reason = wait_for_ready(ours.fileno(), config.session.backend_timeout_s * 3 + 60)
        if not ok:
            raise SessionError(reason or "the class mount's daemon exited")
        return pid

    def start_shared(index: int) -> int:
        assert class_root is not None
        ours, theirs = socket.socketpair()
        with ours:
            idle_exit_s = class_idle_s + ORPHAN_GRACE_S  # ends by itself, with no server to stop it
            serve = partial(_serve_shared_in_child, theirs, class_root, index, shared_cache_bytes, idle_exit_s)
            pid = _fork_daemon(listeners, serve)
            theirs.close()
            ok, reason = wait_for_ready(ours.fileno(), 60)
        if not ok:
            raise SessionError(reason or "the shared mount's process exited")
        return pid

    keeper = None
    if class_root:
        host: ClassHost = ProcessHost(class_root, start_class)
        if class_mode == "shared":
            from chromafs_fuse.serving.shared_host import SharedHost

            host = SharedHost(class_root, start_shared, shared_processes, own_daemons=host)
        keeper = SessionKeeper(class_root, class_idle_s, host)
    metrics = MetricsEndpoint(metrics_addr, lambda: keeper.table if keeper else None) if metrics_addr else None
    listeners: list[socket.socket | MetricsEndpoint] = [server, *([metrics] if metrics else [])]

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        server.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("listening on %s%s", socket_path, f"; class mounts in {class_root}" if class_root else "")
    _serve_requests(server, socket_path, metrics, listeners, lambda: stopping, cache, keeper, parse_argv)


def _handle(
    conn: socket.socket,
    listeners: Sequence[socket.socket | MetricsEndpoint],
    cache: TreeCache,
    keeper: SessionKeeper | None,
    parse_argv: ParseArgv,
) -> None:
    from chromafs_fuse.serving.class_mounts import SessionError
    from chromafs_fuse.serving.daemon import failure_text

    conn.settimeout(None)
    uid = _peer_uid(conn)
    if uid not in (0, os.getuid()):
        log.warning("refused a mount request from uid %d", uid)
        with contextlib.suppress(Exception):  # read first: a close on an unread request resets the answer away
            _read_request(conn)
        with contextlib.suppress(OSError):
            conn.sendall(b"permission denied: only root or the server's user may mount")
        return
    try:
        request = _read_request(conn)
    except EOFError:
        return
    except (OSError, ValueError) as exc:
        log.warning("bad mount request: %s", exc)
        with contextlib.suppress(OSError):
            conn.sendall(b"bad request")
        return
    got = _prepare(request, parse_argv)
    if got.args is None:  # flags chromafs-mount's parser refuses (its client parsed them first): no answer
        log.warning("mount request from uid %d: bad arguments", uid)
        return
    config, principal, error = got.config, got.principal, got.error or UsageError("bad arguments")
    if config is None:  # worded as the daemon (isolated) or the session's path would word it
        problem = failure_text(error) if keeper is None or got.args.isolated else _problem(error)
        log.warning("mount request from uid %d: %s", uid, problem)
        with contextlib.suppress(OSError):
            conn.sendall(problem.encode("utf-8", "replace"))
        return
    if keeper is None or got.args.isolated:
        prepared = cache.prepared(config, principal) if principal is not None else None
        cwd = str(request.get("cwd") or "/")
        serve = partial(_serve_in_child, conn, cwd, config, prepared, token=_request_token(request))
        pid = _fork_daemon(listeners, serve)
        log.info("mount request from uid %d: daemon pid %d", uid, pid)
        return
    if principal is None:
        with contextlib.suppress(OSError):
            conn.sendall(_problem(error).encode("utf-8", "replace"))
        return
    try:
        keeper.open_session(config, principal, uid)
    except SessionError as exc:
        with contextlib.suppress(OSError):
            conn.sendall(str(exc).encode("utf-8", "replace"))
        return
    with contextlib.suppress(OSError):
        conn.sendall(b"READY\n")


def _problem(error: Exception) -> str:
    return str(error) or error.__class__.__name__


def _listening_socket(socket_path: str) -> socket.socket:
    os.makedirs(os.path.dirname(socket_path) or ".", mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    os.chmod(socket_path, 0o600)
    server.listen(128)
    server.settimeout(HOUSEKEEPING_S)
    return server


def _serve_requests(
    server: socket.socket,
    socket_path: str,
    metrics: MetricsEndpoint | None,
    listeners: list[socket.socket | MetricsEndpoint],
    is_stopping: Callable[[], bool],
    cache: TreeCache,
    keeper: SessionKeeper | None,
    parse_argv: ParseArgv,
) -> None:
    """Answer requests and keep house every HOUSEKEEPING_S until stopped; then clean up. A pass
    costs O(classes + sessions), so it runs on its clock, never after each request: a burst of
    sessions does not wait behind it."""
    next_pass = time.monotonic()
    try:
        while not is_stopping():
            conn = None
            try:
                wait_s = max(0.0, next_pass - time.monotonic()) if keeper is not None else HOUSEKEEPING_S
                readable, _, _ = select.select(listeners, [], [], wait_s)
                if metrics is not None and metrics in readable:
                    metrics.answer()
                if server in readable:
                    conn, _ = server.accept()
            except TimeoutError:
                conn = None
            except (OSError, ValueError):  # ValueError: select on the socket that stop() closed
                if is_stopping():
                    break
                raise
            if conn is not None:
                with conn:
                    _handle(conn, listeners, cache, keeper, parse_argv)
            if keeper is not None and time.monotonic() >= next_pass:
                try:
                    keeper.housekeep()
                except Exception:
                    log.exception("housekeeping failed")
                next_pass = time.monotonic() + HOUSEKEEPING_S
    finally:
        if metrics is not None:
            metrics.close()
        with contextlib.suppress(OSError):
            server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        log.info("stopped")
