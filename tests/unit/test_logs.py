"""logs.py: what a daemon's log says."""

from __future__ import annotations

import logging
from pathlib import Path

from chromafs_fuse.logs import setup_logging


def test_an_answer_to_a_request_the_kernel_gave_up_is_not_an_error(tmp_path: Path) -> None:
    """pyfuse3 logs an error when it cannot deliver an answer; ENOENT there is a request whose
    caller was interrupted (a killed `grep`, an unmount): a debug line, never an error. Any other
    failure to answer stays an error."""
    log_file = tmp_path / "daemon.log"
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", str(log_file))
        pyfuse3 = logging.getLogger("pyfuse3")
        pyfuse3.error("fuse_getattr(): fuse_reply_* failed with %s", "No such file or directory")
        pyfuse3.error("fuse_read(): fuse_reply_* failed with %s", "Broken pipe")
        pyfuse3.error("fuse_lookup(): something else: %s", "No such file or directory")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = log_file.read_text().splitlines()
    assert [line.split(" ", 4)[3:] for line in lines] == [
        ["ERROR", "pyfuse3: fuse_read(): fuse_reply_* failed with Broken pipe"],
        ["ERROR", "pyfuse3: fuse_lookup(): something else: No such file or directory"],
    ]
