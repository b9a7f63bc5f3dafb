"""The one exception every layer may raise for a user's mistake (a bad flag, an unreadable file)."""


class UsageError(Exception):
    """A user-facing failure of any chromafs command: printed as one line, exit status 1."""


def unexpected(exc: BaseException) -> str:
    """An error nobody planned for, in words (its traceback goes to the log): never a class name."""
    return (
        f"{exc} (an unexpected error: the log has its details)"
        if str(exc)
        else "an unexpected error: the log has its details"
    )
