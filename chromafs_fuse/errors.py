"""The one exception every layer may raise for a user's mistake (a bad flag, an unreadable file)."""


class UsageError(Exception):
    """A user-facing failure of any chromafs command: printed as one line, exit status 1."""
