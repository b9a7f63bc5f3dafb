"""Run a script of scripts/ with the repository's .venv Python, whatever `python3` started it.

Standard library only, so a script can call it before importing anything that only the venv has:

    if __name__ == "__main__":  # first, before chromafs_fuse or any other venv import
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from repo_venv import use_repo_venv

        use_repo_venv()

Not named `venv.py`: scripts/ is the first entry of sys.path, so it would hide the standard
library's `venv` module from the scripts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
_REEXEC = "CHROMAFS_SCRIPTS_REEXEC"  # set across the exec: a venv that is not what it says fails instead of looping


def in_repo_venv() -> bool:
    """Whether this interpreter is the repository's .venv one."""
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def use_repo_venv() -> None:
    """Return if this runs on the repository's .venv Python; else re-execute the running script
    with it (same arguments), or exit 2 when there is no .venv yet."""
    name = os.path.basename(sys.argv[0]) or "script"
    if in_repo_venv():
        os.environ.pop(_REEXEC, None)  # not inherited by the script's own children
        return
    if not os.access(VENV_PYTHON, os.X_OK):
        if importlib.util.find_spec("chromafs_fuse") is not None:
            return  # no .venv, but chromafs is installed where this runs (a container's /opt/chromafs)
        sys.stderr.write(f"{name}: {VENV_PYTHON} does not exist: run scripts/setup first\n")
        raise SystemExit(2)
    if os.environ.get(_REEXEC):
        sys.stderr.write(f"{name}: not on {VENV} after re-executing (sys.prefix {sys.prefix}): run scripts/setup\n")
        raise SystemExit(2)
    os.environ[_REEXEC] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(VENV_PYTHON, [str(VENV_PYTHON), sys.argv[0], *sys.argv[1:]])
