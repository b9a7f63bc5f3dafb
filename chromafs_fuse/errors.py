"""The one error hierarchy (pure): every failure chromafs names is a `ChromafsError`, carrying the
errno a filesystem request answers with, a message for the user (its text: never a class name,
never a secret), the level a server logs it at, and its `kind`, from which every front end maps
it in one place: the FUSE adapter (`errno`), the commands (`exit_status`, the message), the mount
server's replies (the message), the MCP tools and the CSI plugin (`kind`).

    ChromafsError
    ├── UsageError      a user's mistake: a flag, a path, a file that cannot be used   EINVAL
    ├── AccessDenied    a token that cannot be used for this site                      EACCES
    ├── NotFound        a site, collection or page that is not there                   ENOENT
    ├── Unavailable     a backend down, hanging or refusing: try again later            EIO
    ├── Corrupt         stored data that cannot be used (a page, a tree)               EIO
    └── Refused         a request a server turns down, its message passed on          EIO

Anything else that reaches a front end is a bug: it is logged with its traceback and worded by
`unexpected`.
"""

from __future__ import annotations

import errno as errnos

TYPE_CHECKING = False  # neither typing nor logging: the mount client imports this on its fast path
if TYPE_CHECKING:
    from typing import ClassVar, Literal

    Kind = Literal["usage", "denied", "not_found", "unavailable", "corrupt", "refused", "internal"]

# logging's levels, by number
DEBUG, WARNING, ERROR = 10, 30, 40


class ChromafsError(Exception):
    """A failure with a message for the user; subclasses set what it maps to."""

    kind: ClassVar[Kind] = "internal"
    errno: int = errnos.EIO  # a filesystem request that meets it fails with this
    level: int = ERROR  # a server logs it at this level
    exit_status: int = 1  # a command that stops on it exits with this

    @property
    def message(self) -> str:
        return str(self) or "no reason given"


class UsageError(ChromafsError):
    """A user-facing failure of any chromafs command: printed as one line, exit status 1."""

    kind: ClassVar[Kind] = "usage"
    errno = errnos.EINVAL
    level = WARNING


class AccessDenied(ChromafsError):
    kind: ClassVar[Kind] = "denied"
    errno = errnos.EACCES
    level = WARNING


class NotFound(ChromafsError):
    kind: ClassVar[Kind] = "not_found"
    errno = errnos.ENOENT
    level = WARNING


class Unavailable(ChromafsError):
    kind: ClassVar[Kind] = "unavailable"


class Corrupt(ChromafsError):
    kind: ClassVar[Kind] = "corrupt"


class Refused(ChromafsError):
    kind: ClassVar[Kind] = "refused"
    level = WARNING


class FsError(ChromafsError):
    """A filesystem request fails with this errno (ENOENT for a name not there: not worth a log line)."""

    level = DEBUG

    def __init__(self, code: int) -> None:
        super().__init__(errnos.errorcode.get(code, str(code)))
        self.errno = code


def unexpected(exc: BaseException) -> str:
    """An error nobody planned for, in words (its traceback goes to the log): never a class name."""
    return (
        f"{exc} (an unexpected error: the log has its details)"
        if str(exc)
        else "an unexpected error: the log has its details"
    )


def user_message(exc: BaseException) -> str:
    """What a front end tells the user about `exc`."""
    return exc.message if isinstance(exc, ChromafsError) else unexpected(exc)


def errno_of(exc: BaseException) -> int:
    """The errno a filesystem request answers with when it meets `exc`."""
    return exc.errno if isinstance(exc, ChromafsError) else errnos.EIO


def kind_of(exc: BaseException) -> Kind:
    return exc.kind if isinstance(exc, ChromafsError) else "internal"


def error_of(kind: str, message: str) -> ChromafsError:
    """The error of `kind` another process reported (serving/protocol.py), with its message."""
    for cls in (UsageError, AccessDenied, NotFound, Unavailable, Corrupt, Refused):
        if cls.kind == kind:
            return cls(message)
    return ChromafsError(message)
