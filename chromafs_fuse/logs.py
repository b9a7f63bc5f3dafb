"""Logging set-up shared by every process: the commands, a mount's daemon, the mount server."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a command that does not log starts sooner
    import logging


def default_log_file() -> str:
    """Where a background daemon logs when there is no syslog socket."""
    for directory in ("/var/log/chromafs", os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chromafs-{os.getuid()}")):
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return os.path.join(directory, "chromafs.log")
    return os.devnull


def _private(path: str) -> str:
    """Create a log file readable by its owner only: it names pages and groups."""
    if path != os.devnull and not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return path


def setup_logging(level: str, log_file: str | None, background: bool = False, json_lines: bool = False) -> None:
    import logging

    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(_private(log_file))
    elif background and os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
    elif background:
        handler = logging.FileHandler(_private(default_log_file()))
    else:
        handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s chromafs[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("chromadb", "httpx", "httpcore", "urllib3", "posthog", "botocore", "boto3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    pyfuse3_log = logging.getLogger("pyfuse3")
    if not any(isinstance(f, _GoneRequests) for f in pyfuse3_log.filters):
        pyfuse3_log.addFilter(_GoneRequests())


class _GoneRequests:
    """pyfuse3 logs an error when an answer cannot be delivered; ENOENT there means the kernel no
    longer waits for that request (its caller was interrupted or killed, or the mount went):
    nothing failed on our side, so it is a debug line."""

    def filter(self, record: logging.LogRecord) -> bool:
        import logging

        gone = any(arg == os.strerror(2) for arg in record.args or ())  # No such file or directory
        if record.levelno >= logging.ERROR and "fuse_reply_" in str(record.msg) and gone:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("pyfuse3").isEnabledFor(logging.DEBUG)
        return True


def _json_formatter_class() -> type[logging.Formatter]:
    import json
    import logging

    class _JsonFormatter(logging.Formatter):
        """One JSON object per line: time, level, logger, pid, message."""

        def format(self, record: logging.LogRecord) -> str:
            entry = {
                "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "pid": record.process,
                "message": record.getMessage(),
            }
            if record.exc_info:
                entry["exception"] = self.formatException(record.exc_info)
            return json.dumps(entry, ensure_ascii=False)

    return _JsonFormatter


def JsonFormatter() -> logging.Formatter:
    return _json_formatter_class()()
