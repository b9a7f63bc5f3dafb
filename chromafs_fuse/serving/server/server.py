"""`chromafs-mountd`: the host's mount server, the one process every agent session goes through.

It imports everything once, then listens on a Unix socket, on one trio loop: a task per
connection, housekeeping on its own clock, the metrics endpoint. What blocks (a token check and a
bind, a serving process asked over its control socket, a daemon forked and waited for) runs in
one of trio's worker threads, so no request waits for another's backend: a session of a class
that is served is a token check and a read-only bind (tens of milliseconds) whatever another
site's Chroma is doing. Every reader class of every site is a directory of a serving process's FUSE
mount (serving/server/pool.py); the pool of serving processes, one per core by default, is the
fault boundary, and a serving process that dies is started again and its sessions bound again
at their own paths (serving/server/session_keeper.py). Housekeeping (expiry, idle classes, dead
processes) runs on a clock of its own, never behind a request. `--isolated` sessions, and
`--search-dir` ones (their query directory is per mount), get a daemon of their own.

Children are forked by the forker (serving/forker.py), a single-threaded process forked before
any thread starts: a fork from a threaded process would copy locks other threads hold.

Only peers running as root or as the server's own user may ask for a mount. The client
(`chromafs-mount --mountd SOCKET`) reads the token itself, so file permissions are checked as
the caller, and sends it over the socket with the options it resolved (serving/protocol.py:
absolute paths, the caller's environment applied): the server reads no argv, and neither the
caller's working directory nor its own environment shapes a session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import setproctitle
import trio

from chromafs_fuse.config import MountConfig, ServerConfig
from chromafs_fuse.errors import AccessDenied, ChromafsError, Unavailable, UsageError, error_of
from chromafs_fuse.options import request_values
from chromafs_fuse.revocation import Revocation, refusal
from chromafs_fuse.serving.failures import failure_text
from chromafs_fuse.serving.metrics import MetricsEndpoint, SessionCollector, serve_metrics
from chromafs_fuse.serving.protocol import (
    MAX_LINE_BYTES,
    MOUNT_SERVER_REQUESTS,
    BadRequest,
    OpenPodSession,
    OpenSession,
    RenewSession,
    Revoke,
    Search,
    ServeIsolated,
    ServePoolProcess,
    decode,
    error_line,
    ok_line,
    reader_principal,
)
from chromafs_fuse.serving.server.forker import Forker, ForkerGone
from chromafs_fuse.serving.server.revocations import KeptRevocations, revoked_sessions
from chromafs_fuse.serving.status import utc_text

if TYPE_CHECKING:
    from chromafs_fuse.access import Principal
    from chromafs_fuse.serving.server.searches import Searches
    from chromafs_fuse.serving.server.session_keeper import SessionKeeper

log = logging.getLogger("chromafs.mountd")
MAX_CONCURRENT_REQUESTS = 256  # beyond this a request waits for a thread (it is never refused)
READ_TIMEOUT_S = 5.0  # a client that sends nothing is dropped
ACCEPT_BACKOFF_S = 0.1
HOUSEKEEPING_S = 0.5
# failures that pass: the process or the host is short of descriptors or buffers
SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ORPHAN_GRACE_S = 5.0  # a serving process idle this much past --class-idle ends itself: no server stopped it


def default_serving_processes() -> int:
    """One serving process per core this server may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _peer_gid(conn: socket.socket | trio.socket.SocketType) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[2])


def _peer_uid(conn: socket.socket | trio.socket.SocketType) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _become_daemon(title: str) -> None:
    """In a forked child: a session of its own, no terminal, `title` shown."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    # Without this the child shows the server's command line, and `pkill chromafs-mountd` would take
    # every mount down with the server.
    setproctitle.setproctitle(title)


def serve_isolated(ready_fd: int, job: ServeIsolated) -> int:
    """In a forked child: an `--isolated` session's own daemon; it reports READY or why not on `ready_fd`."""
    from chromafs_fuse.serving.daemon.daemon import run_daemon

    config = MountConfig.from_dict(job.config)
    _become_daemon(f"chromafs-mount {config.mountpoint} --site {config.site}")
    # exactly the caller's token (its client read the caller's environment): never the server's
    # own CHROMAFS_TOKEN or CHROMAFS_TOKEN_FILE
    return run_daemon(config, ready_fd, background=True, read_token=lambda: job.token)


def serve_pool_process(ready_fd: int, job: ServePoolProcess) -> int:
    """In a forked child: the `index`-th serving process of the pool."""
    from chromafs_fuse.serving.serving_process.process import member_paths, run_serving_process

    _become_daemon(f"chromafs-serving {job.class_root}" + (f" {job.index}" if job.index else ""))
    log_file = f"{member_paths(job.class_root, job.index)[0]}.log"
    return run_serving_process(job.class_root, job.cache_bytes, job.idle_exit_s, ready_fd, log_file, index=job.index)


# what the forker runs for each of its jobs (serving/protocol.py's FORKER_JOBS)
JOBS: dict[str, Callable[..., int]] = {ServeIsolated.op: serve_isolated, ServePoolProcess.op: serve_pool_process}


@dataclasses.dataclass
class PreparedRequest:
    """What the server makes of a session request: as far as it gets, and why not."""

    isolated: bool = False
    config: MountConfig | None = None
    principal: Principal | None = None
    error: Exception | None = None


def _prepare(request: OpenSession | OpenPodSession | RenewSession) -> PreparedRequest:
    """The configuration (built here, once) and the verified reader for this request, as far as
    they can be had, and why not. The options are read as chromafs-mount's parser reads its
    flags, with none of this process's environment or working directory. For an isolated mount a
    failure to verify the reader just means the child does it (and reports errors). A reader
    given verified (OpenPodSession, RenewSession) is checked for revocations in its site's Redis."""
    from chromafs_fuse.site.loader import check_not_revoked, verify_reader

    out = PreparedRequest()
    try:
        if not os.path.isabs(request.mountpoint):
            raise UsageError(f"{request.mountpoint}: a session request names its mountpoint by an absolute path")
        try:
            values = request_values(request.options)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        out.isolated = bool(values["isolated"])
        out.config = MountConfig.from_args(SimpleNamespace(**values, mountpoint=request.mountpoint))
        if isinstance(request, OpenSession):
            out.principal = verify_reader(request.token, out.config.session)
        else:
            principal = reader_principal(request.reader)
            if principal.expires_at is not None and principal.expires_at <= time.time():
                raise AccessDenied("the reader's token has expired")
            check_not_revoked(out.config.session, principal)
            out.principal = principal
    except Exception as exc:  # any failure preparing a request is answered to its caller, by its kind
        out.error = exc
    return out


class MountServer:
    """The socket, a task per connection, the housekeeping clock and the forker, on one trio loop;
    what blocks (the session keeper's binds and its serving processes' answers, the forker, a
    daemon's start) runs in trio's worker threads, at most MAX_CONCURRENT_REQUESTS at once."""

    def __init__(
        self,
        socket_path: str,
        forker: Forker,
        keeper: SessionKeeper | None,
        listener: socket.socket,
        metrics: MetricsEndpoint | None = None,
        revocations: KeptRevocations | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.forker = forker
        self.keeper = keeper
        self.listener = listener
        self.metrics = metrics
        self._short_logged = -60.0  # when running short of descriptors was last said
        self._status = 0
        self._requests = trio.CapacityLimiter(MAX_CONCURRENT_REQUESTS)
        self._searches: Searches | None = None  # once a search is asked
        self.revocations = revocations  # the ones made without Redis (chromafs revoke)
        self._wake = trio.Event()  # housekeeping at once: a session was revoked

    # -- the loop -------------------------------------------------------------------------------

    def serve(self) -> int:
        """Until SIGTERM or SIGINT: 0; 1 when the forker is gone (nothing more can be forked: a
        supervisor restarts the server, and its sessions read on meanwhile)."""
        try:
            trio.run(self._serve)
        finally:
            if self.keeper is not None:  # a last pass: sessions unmounted meanwhile leave no status behind
                try:
                    self.keeper.housekeep(stopping=True)
                except Exception:  # stopping anyway: the next server's recovery cleans up
                    log.exception("the last housekeeping pass failed")
            if self.metrics is not None:
                self.metrics.close()
            with contextlib.suppress(OSError):
                self.listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            self.forker.close()
            log.info("stopped")
        return self._status

    async def _serve(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._accept, nursery)
            nursery.start_soon(self._watch_forker, nursery.cancel_scope)
            if self.keeper is not None:
                nursery.start_soon(self._keep_house)
                nursery.start_soon(self._watch_revocations)
            if self.metrics is not None:
                nursery.start_soon(serve_metrics, self.metrics, HOUSEKEEPING_S)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()

    async def _accept(self, nursery: trio.Nursery) -> None:
        """A task per connection. Short of descriptors or buffers (EMFILE, ENFILE, ENOBUFS,
        ENOMEM), it backs off and serves on, as trio's serve_listeners does (saying so once a
        minute, not each time): a pending client waits in the backlog."""
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.listener))
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in SHORT_OF:
                    raise
                self._short_of(f"accepting a request: {errno.errorcode[exc.errno]}")
                await trio.sleep(ACCEPT_BACKOFF_S)
                continue
            nursery.start_soon(self._answer, stream)

    async def _watch_forker(self, scope: trio.CancelScope) -> None:
        while True:
            if self.forker.gone.is_set() or not self.forker.alive():
                log.critical("the forker is gone: stopping so that the server is started again")
                self._status = 1
                scope.cancel()
                return
            await trio.sleep(HOUSEKEEPING_S)

    def _short_of(self, what: str) -> None:
        """Out of descriptors, buffers or threads: said once a minute; it never ends the server
        (expiry, healing and the sessions that stand depend on it)."""
        now = time.monotonic()
        if now - self._short_logged >= 60.0:
            self._short_logged = now
            log.warning("short of resources (%s): backing off and serving on", what)

    async def _keep_house(self) -> None:
        """Every HOUSEKEEPING_S, and at once when a session's token expires sooner; a pass runs
        in a worker thread (it reads the mount table, detaches, asks serving processes)."""
        keeper = self.keeper
        assert keeper is not None
        while True:
            try:
                await trio.to_thread.run_sync(keeper.housekeep)
            except OSError as exc:
                if exc.errno not in SHORT_OF:
                    log.exception("housekeeping failed")
                else:  # what a pass does before it reads the mount table (expiry) is done
                    self._short_of(f"housekeeping: {errno.errorcode[exc.errno]}")
            except RuntimeError:  # no thread to be had: the next pass tries again
                self._short_of("starting housekeeping's thread")
            except Exception:  # a bug in one pass: logged with its traceback; the next pass runs
                log.exception("housekeeping failed")
            wait_s = HOUSEKEEPING_S
            next_expiry = keeper.next_expiry()
            if next_expiry is not None:
                wait_s = min(wait_s, max(0.01, next_expiry - time.time()))
            with trio.move_on_after(wait_s):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _watch_revocations(self) -> None:
        """Every HOUSEKEEPING_S: the sessions a revocation covers (the server's own, or in their
        site's Redis: one MGET per Redis, in a worker thread) end as at their token's expiry, by
        a housekeeping pass run at once."""
        while True:
            try:
                ended = await trio.to_thread.run_sync(self._end_revoked)
            except OSError as exc:
                if exc.errno not in SHORT_OF:
                    log.exception("checking for revoked sessions failed")
                else:  # the next check tries again
                    self._short_of(f"checking for revoked sessions: {errno.errorcode[exc.errno]}")
                ended = 0
            except RuntimeError:
                self._short_of("starting the revocation check's thread")
                ended = 0
            except Exception:  # a bug in one check: logged with its traceback; the next one runs
                log.exception("checking for revoked sessions failed")
                ended = 0
            if ended:
                self._wake.set()
            await trio.sleep(HOUSEKEEPING_S)

    def _end_revoked(self) -> int:
        """In a worker thread: how many sessions a revocation ended."""
        assert self.keeper is not None
        if not (self.revocations is not None and len(self.revocations)) and not self.keeper.any_redis():
            return 0  # nothing could be revoked: no pass over every session (10,000 of them: tens of ms)
        readers = self.keeper.readers()
        if not readers:
            return 0
        revoked = revoked_sessions(readers, self.revocations)
        ended = 0
        for mountpoint, revocation in revoked.items():
            ended += self.keeper.revoke([mountpoint], revocation.describe())
        return ended

    # -- a request ------------------------------------------------------------------------------

    async def _answer(self, stream: trio.SocketStream) -> None:
        """One request a connection, then the connection is closed (whatever it sends after)."""
        try:
            async with stream:
                await self._handle(stream)
        except trio.BrokenResourceError:
            pass  # the client hung up first
        except Exception:  # a bug in one request: logged with its traceback; the server goes on
            log.exception("a mount request failed")

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = stream.socket
        uid = _peer_uid(conn)
        if uid not in (0, os.getuid()):
            log.warning("refused a mount request from uid %d", uid)
            with contextlib.suppress(BadRequest, EOFError):
                await _read_line(stream)  # read first: a close on an unread request resets the answer away
            await _answer(stream, AccessDenied("permission denied: only root or the server's user may mount"))
            return
        try:
            request = decode(await _read_line(stream), MOUNT_SERVER_REQUESTS)
        except EOFError:
            return
        except BadRequest as exc:
            log.warning("bad mount request: %s", exc)
            await _answer(stream, exc)
            return
        if isinstance(request, (OpenSession, OpenPodSession, RenewSession)):
            gid = _peer_gid(conn)
            try:
                # abandoned on cancel: a stopping server does not wait for a backend that hangs
                error = await trio.to_thread.run_sync(
                    self._open_session, uid, gid, request, limiter=self._requests, abandon_on_cancel=True
                )
            except RuntimeError:  # no thread to be had: this request is refused, the server goes on
                self._short_of("starting a request's thread")
                error = Unavailable("the mount server is short of threads: try again")
            await _answer(stream, error)
        elif isinstance(request, Revoke):
            try:
                line = await trio.to_thread.run_sync(self._revoke, request, limiter=self._requests)
            except RuntimeError:
                self._short_of("starting a request's thread")
                line = error_line(Unavailable("the mount server is short of threads: try again"))
            self._wake.set()
            await _answer_line(stream, line)
        elif isinstance(request, Search):
            try:
                line = await trio.to_thread.run_sync(
                    self._search, request, limiter=self._requests, abandon_on_cancel=True
                )
            except RuntimeError:
                self._short_of("starting a request's thread")
                line = error_line(Unavailable("the mount server is short of threads: try again"))
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await stream.send_all(line)

    def _revoke(self, request: Revoke) -> bytes:
        """In a worker thread: the revocation kept (and saved) and the sessions it covers ended."""
        try:
            now = time.time()
            if not request.for_s > 0:
                raise UsageError("a revocation lasts a positive number of seconds")
            revocation = Revocation(request.site, request.kind, request.name, now, now + request.for_s)
        except (ValueError, UsageError) as exc:
            return error_line(exc if isinstance(exc, UsageError) else UsageError(str(exc)))
        if self.revocations is None:
            return error_line(Unavailable("this mount server keeps no revocations"))
        try:
            self.revocations.add(revocation)
        except OSError as exc:
            log.error("cannot save the revocation of %s: %s", revocation.describe(), exc)
            return error_line(Unavailable(f"the mount server cannot save the revocation: {exc.strerror or exc}"))
        ended = 0
        if self.keeper is not None:
            covered = [
                r.mountpoint
                for r in self.keeper.readers()
                if r.site == revocation.site and revocation.covers(r.subject, r.token_id, r.issued_at)
            ]
            ended = self.keeper.revoke(covered, revocation.describe())
        log.warning(
            "revoked the tokens of %s on site %s until %s: %d sessions end",
            revocation.describe(), revocation.site, utc_text(revocation.until), ended,
        )  # fmt: skip
        return ok_line(ended=ended)

    def _kept_revocation(self, site: str, principal: Principal) -> Revocation | None:
        """The revocation this server keeps (made without Redis) that covers `principal`'s token."""
        if self.revocations is None:
            return None
        return self.revocations.find(site, principal.subject, principal.token_id, principal.issued_at, time.time())

    def _search(self, request: Search) -> bytes:
        """In a worker thread: `chromafs search`'s answer, warm (serving/server/searches.py)."""
        if self._searches is None:
            from chromafs_fuse.serving.server.searches import Searches

            self._searches = Searches(self._kept_revocation)
        try:
            return ok_line(**self._searches.answer(request))
        except ChromafsError as exc:
            log.info("search refused: %s", exc.message)  # the caller is told; nothing wrong here
            return error_line(exc)
        except Exception as exc:  # a bug in one search: logged with its traceback; the server goes on
            log.exception("a search failed")
            return error_line(exc)

    def _open_session(
        self, uid: int, gid: int, request: OpenSession | OpenPodSession | RenewSession
    ) -> ChromafsError | Exception | None:
        """In a worker thread: the session opened (or renewed: RenewSession) (None) or why not."""
        got = _prepare(request)
        config, principal = got.config, got.principal
        own_daemon = self.keeper is None or got.isolated or (config is not None and bool(config.search_dir))
        if config is None:
            error = got.error or UsageError("bad options")
            log.warning("mount request from uid %d: %s", uid, failure_text(error))
            return error
        given = not isinstance(request, OpenSession)  # a reader its caller verified (a pod's)
        if given and own_daemon:
            error = UsageError("a pod's service-account reader is served as a class session, not --isolated")
            log.warning("mount request from uid %d: %s", uid, error.message)
            return error
        if principal is not None and principal.authenticated:
            revoked = self._kept_revocation(config.site, principal)
            if revoked is not None:
                error = refusal(revoked)
                log.info("session on %s refused: %s", config.mountpoint, error.message)
                return error
        if own_daemon:
            assert isinstance(request, OpenSession)
            return self._own_daemon(uid, config, request.token)
        if principal is None:
            return got.error or AccessDenied("no reader")
        assert self.keeper is not None
        try:
            if isinstance(request, RenewSession):
                self.keeper.renew(config, principal)
            else:
                self.keeper.open_session(config, principal, uid, gid)
        except ChromafsError as exc:  # its kind passes on: a site that does not exist, a backend down
            what = "renewal" if isinstance(request, RenewSession) else "session"
            log.log(exc.level, "%s on %s refused: %s", what, config.mountpoint, exc.message)
            return exc
        return None

    def _own_daemon(self, uid: int, config: MountConfig, token: str | None) -> ChromafsError | None:
        """A daemon of the session's own (--isolated, --search-dir): forked, then its report
        (ready, or why not)."""
        from chromafs_fuse.serving.handshake import ready_report

        ours, theirs = socket.socketpair()
        with ours, theirs:
            try:
                pid = self.forker.spawn(ServeIsolated(config.to_dict(), token), [theirs.fileno()])
            except ForkerGone as exc:
                log.error("%s", exc)
                return ForkerGone("the mount server cannot start a daemon: restart chromafs-mountd")
            theirs.close()
            log.info("mount request from uid %d: daemon pid %d", uid, pid)
            ok, reason, kind = ready_report(ours.fileno(), config.session.backend_timeout_s * 3 + 60)
        return None if ok else error_of(kind, reason or "the daemon exited")


async def _read_line(stream: trio.SocketStream) -> bytes:
    """One line (or everything up to the client's shutdown) within READ_TIMEOUT_S; EOFError for
    none at all (a health check probing the socket)."""
    data = b""
    with trio.move_on_after(READ_TIMEOUT_S) as waited:
        while len(data) <= MAX_LINE_BYTES and not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    if waited.cancelled_caught:
        raise BadRequest("timed out")
    if len(data) > MAX_LINE_BYTES:
        raise BadRequest("bad request: too large")
    if not data:
        raise EOFError
    return data


async def _answer_line(stream: trio.SocketStream, line: bytes) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.send_all(line)


async def _answer(stream: trio.SocketStream, error: BaseException | None = None) -> None:
    """One line: ok, or the failure's kind and message (serving/protocol.py)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.send_all(ok_line() if error is None else error_line(error))


def _listening_socket(socket_path: str) -> socket.socket:
    os.makedirs(os.path.dirname(socket_path) or ".", mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # 0600 from the start: no moment where others may connect
    try:
        server.bind(socket_path)
    finally:
        os.umask(old_mask)
    os.chmod(socket_path, 0o600)
    server.listen(128)
    return server


def serve_forever(config: ServerConfig, class_views: bool) -> int:
    """Serve mount requests until SIGTERM (0) or
    until the forker is gone (1). With `class_views` (root only), sessions are binds of
    reader-class views of the pool's serving processes in `config.class_root`; without, or for
    `--isolated`, each session gets a daemon."""
    from chromafs_fuse.serving.handshake import wait_for_ready
    from chromafs_fuse.serving.server.pool import ServingPool
    from chromafs_fuse.serving.server.session_keeper import SessionError, SessionKeeper

    listener = _listening_socket(config.socket)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    forker_of: list[Forker] = []

    def start_serving(index: int) -> int:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            job = ServePoolProcess(
                class_root=config.class_root,
                index=index,
                cache_bytes=config.serving_cache_bytes,
                idle_exit_s=config.class_idle_s + ORPHAN_GRACE_S,  # ends by itself, with no server to stop it
            )
            try:
                pid = forker_of[0].spawn(job, [theirs.fileno()])
            except ForkerGone as exc:
                raise SessionError(f"{exc}: restart chromafs-mountd") from exc
            theirs.close()
            ok, reason = wait_for_ready(ours.fileno(), 60)
        if not ok:
            raise SessionError(reason or "the serving process exited")
        return pid

    keeper = None
    if class_views:
        processes = config.serving_processes or default_serving_processes()
        pool = ServingPool(config.class_root, start_serving, processes, config.class_warm_wait_s)
        keeper = SessionKeeper(config.class_root, config.class_idle_s, pool)
    metrics = None
    if config.metrics_addr:
        metrics = MetricsEndpoint(config.metrics_addr, SessionCollector(lambda: keeper.snapshot() if keeper else None))
    forker_of.append(Forker.start(JOBS, [listener, *([metrics] if metrics else [])]))  # before any thread starts
    forker = forker_of[0]
    revocations = KeptRevocations(os.path.join(config.class_root, "revoked.json"))
    server = MountServer(config.socket, forker, keeper, listener, metrics, revocations)
    log.info("listening on %s%s", config.socket, f"; class views in {config.class_root}" if keeper else "")
    return server.serve()
