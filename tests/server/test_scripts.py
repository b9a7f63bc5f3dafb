"""The Python scripts a user is told to run work from a shell without the venv active:
each re-runs itself with the repository's .venv Python (scripts/repo_venv.py), and says to run
scripts/setup first when there is no .venv."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
SYSTEM_PYTHON = Path("/usr/bin/python3")  # Debian's, not the venv's

# The scripts README.md, docs/*.md and their own headers tell a user to run.
PYTHON_SCRIPTS = [
    "bench",
    "loadtest",
    "rehearse-hosts",
    "probe_live_update",
    "probe_search",
    "probe_frontends",
    "probe_sessions",
    "check_containers.py",
    "container_stack.py",
    "pyfuse3_floor.py",
]

pytestmark = pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs Debian's /usr/bin/python3")


def outside_the_venv() -> dict[str, str]:
    """The environment of a shell where the venv was never activated."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH") and not k.startswith("CHROMAFS_")
    }
    venv_bin = str(VENV_BIN.resolve())
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and os.path.realpath(p) != venv_bin]
    env["PATH"] = os.pathsep.join(path or ["/usr/bin", "/bin"])
    return env


def run_help(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`SCRIPT --help` with the system python (scripts/containers, a bash script, as it is)."""
    argv = [str(script)] if script.name == "containers" else [str(SYSTEM_PYTHON), str(script)]
    argv.append("--help")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, env=outside_the_venv())


def test_the_system_python_cannot_import_chromafs(tmp_path: Path) -> None:
    """Else the tests below would prove nothing."""
    proc = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import chromafs_fuse"], capture_output=True, text=True, cwd=tmp_path,
        env=outside_the_venv(), timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


@pytest.mark.skipif(not (VENV_BIN / "python").exists(), reason="no .venv in this checkout (the suite in a container)")
@pytest.mark.parametrize("name", [*PYTHON_SCRIPTS, "containers"])
def test_help_works_with_the_system_python(name: str, tmp_path: Path) -> None:
    proc = run_help(REPO / "scripts" / name, tmp_path)
    assert "ModuleNotFoundError" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout.lower(), proc.stdout


@pytest.mark.parametrize("name", PYTHON_SCRIPTS)
def test_without_a_venv_they_say_to_run_setup(name: str, tmp_path: Path) -> None:
    """A checkout where scripts/setup never ran: exit 2, naming scripts/setup, no traceback."""
    shutil.copytree(REPO / "scripts", tmp_path / "repo" / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    proc = run_help(tmp_path / "repo" / "scripts" / name, tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "scripts/setup" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
